"""Shard properties: across ranks each sequence once per epoch, equal counts, balanced steps.

The bound is the sampler's (``tests/property/test_sampler.py``) for the global plan of
``M * world_size`` groups: with ``S`` real steps and ``l_max`` the longest sequence, every
minibatch of every rank holds at most ``S / (M * world_size) + l_max`` real steps, and
``S / (M * world_size)`` give or take ``l_max`` when that share exceeds ``l_max``. In that case
no cut is adjusted, and the global plan's cut ``k * world_size`` aims at the same target
``k * S / M`` as a single process's cut ``k``: the ranks' ``k``-th minibatches together are the
single process's ``k``-th minibatch.
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDict

from rppo_td import EpisodeSplitter, SequenceChunker, SequencePadder, SequenceSampler
from rppo_td.testing.strategies import rollouts, sequence_lengths


@st.composite
def _cases(draw):
    longest = draw(st.integers(1, 16), label="longest allowed")
    lengths = draw(st.lists(st.integers(1, longest), min_size=1, max_size=64), label="lengths")
    world_size = draw(st.integers(1, 4), label="world_size")
    per_rank = len(lengths) // world_size
    if per_rank == 0:
        world_size, per_rank = 1, len(lengths)
    num_minibatches = draw(st.integers(1, per_rank), label="M")
    return torch.tensor(lengths), num_minibatches, world_size


def _padded(lengths):
    n, longest = lengths.shape[0], int(lengths.max())
    mask = torch.arange(longest) < lengths[:, None]
    row = torch.arange(n)[:, None].expand(n, longest)
    return TensorDict({"loss_mask": mask, "row": row}, batch_size=[n, longest])


def _epoch(td, num_minibatches, seed, **kwargs):
    generator = torch.Generator().manual_seed(seed)
    sampler = SequenceSampler(num_minibatches, generator=generator, **kwargs)
    return [sorted(mb["row"][:, 0].tolist()) for mb in sampler(td)]


@given(case=_cases(), seed=st.integers(0, 2**31))
def test_shards_disjoint_covering_equal_counts_balanced(case, seed):
    lengths, num_minibatches, world_size = case
    padded = _padded(lengths)
    shards = [
        _epoch(padded, num_minibatches, seed, rank=rank, world_size=world_size)
        for rank in range(world_size)
    ]
    assert all(len(shard) == num_minibatches for shard in shards)
    rows = [r for shard in shards for mb in shard for r in mb]
    assert sorted(rows) == list(range(lengths.shape[0]))
    total, longest = float(lengths.sum()), float(lengths.max())
    share = total / (num_minibatches * world_size)
    steps = [float(lengths[mb].sum()) for shard in shards for mb in shard]
    assert all(mb for shard in shards for mb in shard)
    assert max(steps) <= share + longest
    if share > longest:
        assert max(abs(s - share) for s in steps) <= longest
        single = _epoch(padded, num_minibatches, seed)
        for k in range(num_minibatches):
            union = sorted(r for shard in shards for r in shard[k])
            assert union == single[k]
    if world_size == 1:
        assert shards[0] == _epoch(padded, num_minibatches, seed)


@given(data=st.data(), seed=st.integers(0, 2**31))
def test_lazy_rollout_shards_equal_padded_shards(data, seed):
    td = data.draw(rollouts(num_steps=st.integers(1, 12)), label="rollout")
    length = data.draw(sequence_lengths(max_length=5), label="L")
    chunked = SequenceChunker(sequence_length=length)(EpisodeSplitter()(td.clone()))
    num_sequences = int(chunked["sequence_id"].max()) + 1
    world_size = data.draw(st.integers(1, min(3, num_sequences)), label="world_size")
    num_minibatches = data.draw(st.integers(1, num_sequences // world_size), label="M")
    reuse_memory = data.draw(st.booleans(), label="reuse_memory")
    padded = SequencePadder()(chunked)
    seen = []
    for rank in range(world_size):
        shard = dict(rank=rank, world_size=world_size)
        eager = list(
            SequenceSampler(
                num_minibatches, generator=torch.Generator().manual_seed(seed), **shard
            )(padded)
        )
        lazy_sampler = SequenceSampler(
            num_minibatches,
            generator=torch.Generator().manual_seed(seed),
            reuse_memory=reuse_memory,
            **shard,
        )
        lazy = [mb.clone() for mb in lazy_sampler(chunked)]
        assert len(eager) == len(lazy) == num_minibatches
        for a, b in zip(eager, lazy, strict=True):
            assert a.batch_size == b.batch_size
            for key in a.keys(True, True):
                assert torch.equal(a[key], b[key]), key
            seen += list(
                zip(a["worker_index"][:, 0].tolist(), a["time_index"][:, 0].tolist(), strict=True)
            )
    expected = zip(
        padded["worker_index"][:, 0].tolist(), padded["time_index"][:, 0].tolist(), strict=True
    )
    assert sorted(seen) == sorted(expected)
