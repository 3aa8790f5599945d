"""Sampler properties: whole sequences, each once per epoch, minibatches balanced by steps.

The balance bound, derived from ``rppo_td/functional/_minibatch.py``: with ``S`` real steps,
``M`` minibatches and ``l_max`` the longest sequence, the shuffled order is cut at the prefix
count nearest to each target ``k * S / M``. A raw cut lies between two consecutive prefix
counts that straddle its target, i.e. at most half of one sequence away:
``|P[c_k] - k S / M| <= l_max / 2``. When ``S / M > l_max`` consecutive raw cuts are at least
``S / M - l_max > 0`` steps apart, so they are strictly increasing and neither the "no empty
group" push nor the "leave one sequence per remaining group" clamp moves them. Then every
minibatch holds ``S / M`` real steps give or take ``l_max`` (half a sequence at each end).
Without that condition a minibatch still holds at most ``S / M + l_max`` steps: a group is
either one sequence, or ends at an unmoved raw cut and starts at or after the previous raw cut.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rppo_td import (
    EpisodeSplitter,
    SequenceChunker,
    SequencePadder,
    SequenceReplaySampler,
    SequenceSampler,
    functional,
)
from rppo_td.testing import reference
from rppo_td.testing.strategies import rollouts, sequence_lengths
from tests.property._runs import gather_by_runs


def _chunked(td, sequence_length):
    return SequenceChunker(sequence_length=sequence_length)(EpisodeSplitter()(td.clone()))


def _starts(minibatch):
    """The ``(worker, time)`` of each sequence's first step: a sequence's identity."""
    return list(
        zip(
            minibatch["worker_index"][:, 0].tolist(),
            minibatch["time_index"][:, 0].tolist(),
            strict=True,
        )
    )


@st.composite
def _chunked_rollouts(draw):
    td = draw(rollouts(num_steps=st.integers(1, 16)), label="rollout")
    chunked = _chunked(td, draw(sequence_lengths(max_length=6), label="L"))
    num_sequences = int(chunked["sequence_id"].max()) + 1
    num_minibatches = draw(st.integers(1, num_sequences), label="M")
    return chunked, num_minibatches


@given(
    case=_chunked_rollouts(),
    seed=st.integers(0, 2**31),
    balance=st.sampled_from(["steps", "sequences"]),
    gather_epoch=st.sampled_from([None, True, False]),
    runs=st.booleans(),
)
def test_each_sequence_once_per_epoch_padded_and_lazy_agree(
    case, seed, balance, gather_epoch, runs
):
    with gather_by_runs(runs):
        _each_sequence_once_padded_and_lazy_agree(case, seed, balance, gather_epoch)


def _each_sequence_once_padded_and_lazy_agree(case, seed, balance, gather_epoch):
    chunked, num_minibatches = case
    padded = SequencePadder()(chunked)
    expected = sorted(_starts(padded))

    def epoch(td, gather=gather_epoch, reuse=False):
        generator = torch.Generator().manual_seed(seed)
        sampler = SequenceSampler(
            num_minibatches,
            generator=generator,
            balance=balance,
            gather_epoch=gather,
            reuse_memory=reuse,
        )
        # reuse_memory may write every minibatch into one buffer: the same values, as long
        # as each is read (here: cloned) before the next one is asked for
        return [mb.clone() if reuse else mb for mb in sampler(td)]

    from_padded = epoch(padded)
    from_rollout = epoch(chunked)
    # the epoch gathered at once or minibatch by minibatch, reusing memory or not: the same
    # minibatches, from either input
    others = [epoch(chunked, not gather_epoch), epoch(padded, not gather_epoch)]
    others += [epoch(chunked, gather, reuse=True) for gather in (True, False)]
    for other in others:
        for a, b in zip(from_rollout, other, strict=True):
            assert a.batch_size == b.batch_size
            assert (a == b).all()
    assert len(from_padded) == len(from_rollout) == num_minibatches
    for minibatches in (from_padded, from_rollout):
        starts = [s for mb in minibatches for s in _starts(mb)]
        assert sorted(starts) == expected
        for mb in minibatches:
            assert mb.batch_size[0] >= 1
            assert mb.batch_size[1] == padded.batch_size[1]
    rollout_keys = list(chunked.keys(True, True))
    for a, b in zip(from_padded, from_rollout, strict=True):
        assert a.batch_size == b.batch_size
        # the rollout's keys in its order, then the padder's own (whatever order the leaves
        # are gathered in)
        assert list(a.keys(True, True)) == list(b.keys(True, True))
        assert list(a.keys(True, True))[: len(rollout_keys)] == rollout_keys
        for key in a.keys(True, True):
            assert torch.equal(a[key], b[key]), key
    # a minibatch holds whole sequences: the padded rows themselves
    rows = {start: n for n, start in enumerate(_starts(padded))}
    for mb in from_padded:
        index = torch.tensor([rows[s] for s in _starts(mb)])
        for key in padded.keys(True, True):
            assert torch.equal(mb[key], padded[key][index]), key


@st.composite
def _lengths(draw):
    longest = draw(st.integers(1, 32), label="longest allowed")
    lengths = draw(st.lists(st.integers(1, longest), min_size=1, max_size=64), label="lengths")
    num_minibatches = draw(st.integers(1, len(lengths)), label="M")
    return torch.tensor(lengths), num_minibatches


@given(case=_lengths(), seed=st.integers(0, 2**31))
def test_steps_balance_bound(case, seed):
    lengths, num_minibatches = case
    generator = torch.Generator().manual_seed(seed)
    groups = functional.balanced_minibatches(lengths, num_minibatches, generator=generator)
    assert len(groups) == num_minibatches
    assert sorted(torch.cat(groups).tolist()) == list(range(len(lengths)))
    steps = torch.stack([lengths[g].sum() for g in groups]).double()
    assert bool((torch.tensor([len(g) for g in groups]) >= 1).all())
    total, longest = float(lengths.sum()), float(lengths.max())
    share = total / num_minibatches
    assert float(steps.max()) <= share + longest
    if share > longest:
        prefix = steps.cumsum(0)
        targets = torch.arange(1, num_minibatches + 1, dtype=torch.float64) * share
        assert float((prefix - targets).abs().max()) <= longest / 2 + 1e-9
        assert float((steps - share).abs().max()) <= longest


@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=64),
    data=st.data(),
    seed=st.integers(0, 2**31),
)
def test_steps_cuts_equal_the_reference(lengths, data, seed):
    # zero-length sequences too: ties and repeated counts, where the cut rules matter most
    num_minibatches = data.draw(st.integers(1, len(lengths)), label="M")
    lengths = torch.tensor(lengths)
    generator = torch.Generator().manual_seed(seed)
    groups = functional.balanced_minibatches(lengths, num_minibatches, generator=generator)
    shuffled = lengths[torch.cat(groups)].tolist()
    expected = reference.reference_minibatch_sizes(shuffled, num_minibatches)
    assert [len(g) for g in groups] == expected


@given(case=_lengths(), seed=st.integers(0, 2**31))
def test_sequence_balance_counts(case, seed):
    lengths, num_minibatches = case
    generator = torch.Generator().manual_seed(seed)
    groups = functional.balanced_minibatches(
        lengths, num_minibatches, generator=generator, balance="sequences"
    )
    sizes = [len(g) for g in groups]
    assert sorted(torch.cat(groups).tolist()) == list(range(len(lengths)))
    assert min(sizes) >= len(lengths) // num_minibatches
    assert max(sizes) <= -(-len(lengths) // num_minibatches)


def test_sequence_balance_can_be_several_fold_unbalanced():
    # 8 long sequences (16 steps) and 24 short ones (1 step): S = 152, M = 4, S / M = 38.
    mask = torch.zeros(32, 16, dtype=torch.bool)
    mask[:8] = True
    mask[8:, 0] = True
    padded = TensorDict({"loss_mask": mask}, batch_size=[32, 16])
    worst = {"steps": 1.0, "sequences": 1.0}
    for seed in range(40):
        for balance in worst:
            sampler = SequenceSampler(
                4, generator=torch.Generator().manual_seed(seed), balance=balance
            )
            steps = [int(mb["loss_mask"].sum()) for mb in sampler(padded)]
            assert sum(steps) == 152
            worst[balance] = max(worst[balance], max(steps) / min(steps))
    # by count, some epoch's minibatches differ several-fold in real steps ...
    assert worst["sequences"] >= 4.0
    # ... by steps, never beyond the bound: 38 +- 16 steps, a ratio of at most 54 / 22
    assert worst["steps"] <= 54 / 22


@given(case=_chunked_rollouts(), seed=st.integers(0, 2**31), epochs=st.integers(1, 3))
def test_replay_sampler_covers_each_sequence_once_per_epoch(case, seed, epochs):
    chunked, num_minibatches = case
    padded = SequencePadder()(chunked)
    num_sequences = padded.batch_size[0]
    sampler = SequenceReplaySampler(num_minibatches, generator=torch.Generator().manual_seed(seed))
    buffer = ReplayBuffer(storage=LazyTensorStorage(num_sequences), sampler=sampler)
    buffer.extend(padded)
    expected = sorted(_starts(padded))
    for _ in range(epochs):
        seen = []
        for k in range(num_minibatches):
            minibatch = buffer.sample(1)
            # ran_out turns True with the epoch's last minibatch, and not before
            assert sampler.ran_out == (k == num_minibatches - 1)
            assert minibatch.batch_size[1] == padded.batch_size[1]
            seen.extend(_starts(minibatch))
        assert sorted(seen) == expected


@given(case=_chunked_rollouts(), seed=st.integers(0, 2**31), extra=st.integers(0, 3))
def test_pad_to_padded_and_lazy_agree(case, seed, extra):
    chunked, num_minibatches = case
    pad_to = SequencePadder()(chunked).batch_size[1] + extra
    padded = SequencePadder(pad_to=pad_to)(chunked)

    def epoch(td, pad_to=None):
        generator = torch.Generator().manual_seed(seed)
        return list(SequenceSampler(num_minibatches, generator=generator, pad_to=pad_to)(td))

    from_padded, from_rollout = epoch(padded, pad_to), epoch(chunked, pad_to)
    assert len(from_padded) == len(from_rollout) == num_minibatches
    for a, b in zip(from_padded, from_rollout, strict=True):
        assert a.batch_size == b.batch_size and a.batch_size[1] == pad_to
        assert set(a.keys(True, True)) == set(b.keys(True, True))
        for key in a.keys(True, True):
            assert torch.equal(a[key], b[key]), key
    if extra:
        with pytest.raises(ValueError, match=f"SequenceSampler\\(pad_to={pad_to}\\) got padded"):
            epoch(SequencePadder()(chunked), pad_to)
