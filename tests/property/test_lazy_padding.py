"""SequencePadder's output gathers its rollout leaves when first read: the same values always.

Properties over random chunked rollouts: whatever route reads the padded output (a key, all
items, indexing, a clone, the sampler, a shallow copy, pickling), it holds the loop
reference's padded values; the sampler reads pending leaves without gathering them; a rollout
leaf written in place after padding is refused by name, never read.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rppo_td import EpisodeSplitter, SequenceChunker, SequencePadder, SequenceSampler
from rppo_td._lazy import Pending, has_pending, raw_leaves, shallow_copy
from rppo_td.testing import reference
from rppo_td.testing.strategies import rollouts, sequence_lengths
from tests.property._runs import gather_by_runs


@st.composite
def _chunked(draw):
    td = draw(rollouts(num_steps=st.integers(1, 12)), label="rollout")
    length = draw(sequence_lengths(max_length=5), label="L")
    chunked = SequenceChunker(sequence_length=length)(EpisodeSplitter()(td.clone()))
    return chunked, length


def _rollout_keys(chunked):
    return list(chunked.keys(include_nested=True, leaves_only=True))


def _expected(chunked, length):
    return reference.reference_pad(chunked, length)


def _pending_keys(td):
    return {key for key, value in raw_leaves(td) if type(value) is Pending}


@given(case=_chunked(), data=st.data(), runs=st.booleans())
def test_every_read_gives_the_reference_padding(case, data, runs):
    with gather_by_runs(runs):
        _every_read_gives_the_reference_padding(case, data)


def _every_read_gives_the_reference_padding(case, data):
    chunked, length = case
    expected = _expected(chunked, length)
    padded = SequencePadder()(chunked)
    keys = _rollout_keys(chunked)
    # before any read, every rollout leaf is pending and the padder's own keys are not
    assert _pending_keys(padded) == set(keys)
    route = data.draw(
        st.sampled_from(["key", "items", "index", "clone", "pickle", "dict", "eq", "copy"]),
        label="route",
    )
    if route == "key":
        read = {key: padded[key] for key in keys}
    elif route == "items":
        read = dict(padded.items(include_nested=True, leaves_only=True))
    elif route == "index":
        rows = data.draw(st.permutations(range(padded.batch_size[0])), label="rows")
        order = torch.tensor(rows, dtype=torch.long)
        picked = padded[order]
        read = {
            key: torch.empty_like(picked[key]).index_copy_(0, order, picked[key]) for key in keys
        }
    elif route == "clone":
        read = dict(padded.clone().items(include_nested=True, leaves_only=True))
    elif route == "pickle":
        read = dict(pickle.loads(pickle.dumps(padded)).items(True, True))
    elif route == "dict":
        # dict(...) of the raw leaf dicts reads through __getitem__, never the placeholders
        read = {key: padded[key] for key in keys}
        assert all(type(v) is not Pending for v in dict(padded._tensordict).values())
    elif route == "eq":
        assert (padded == padded.clone()).all()
        read = {key: padded[key] for key in keys}
    else:
        read = dict(copy.deepcopy(padded).items(True, True))
    for key in keys:
        assert torch.equal(read[key], expected[key]), key
    # every route read every leaf: nothing is left pending
    assert not has_pending(padded)


@given(case=_chunked(), data=st.data(), seed=st.integers(0, 2**31), runs=st.booleans())
def test_sampler_reads_pending_leaves_without_gathering_them(case, data, seed, runs):
    with gather_by_runs(runs):
        _sampler_reads_pending_leaves_without_gathering_them(case, data, seed)


def _sampler_reads_pending_leaves_without_gathering_them(case, data, seed):
    chunked, _ = case
    padded = SequencePadder()(chunked)
    keys = _rollout_keys(chunked)
    # some keys read (gathered) first, the others still pending: a mixed output
    read_first = data.draw(st.lists(st.sampled_from(keys), unique=True), label="read first")
    for key in read_first:
        padded[key]
    pending = _pending_keys(padded)
    assert pending == set(keys) - set(read_first)
    num_sequences = padded.batch_size[0]
    num_minibatches = data.draw(st.integers(1, num_sequences), label="M")
    gather_epoch = data.draw(st.sampled_from([None, True, False]), label="gather_epoch")

    def epoch(td):
        sampler = SequenceSampler(
            num_minibatches,
            generator=torch.Generator().manual_seed(seed),
            gather_epoch=gather_epoch,
        )
        return list(sampler(td))

    from_lazy = epoch(padded)
    assert _pending_keys(padded) == pending  # nothing gathered by the sampler
    # a shallow copy shares the pending leaves and gathers nothing
    twin = shallow_copy(padded)
    assert _pending_keys(twin) == pending
    assert _pending_keys(padded) == pending
    from_dense = epoch(padded.clone())  # every leaf gathered (in padded too), then indexed
    from_rollout = epoch(chunked)
    for a, b, c in zip(from_lazy, from_dense, from_rollout, strict=True):
        assert set(a.keys(True, True)) == set(b.keys(True, True)) == set(c.keys(True, True))
        for key in a.keys(True, True):
            assert torch.equal(a[key], b[key]), key
            assert torch.equal(a[key], c[key]), key
    for key in keys:
        assert torch.equal(twin[key], padded[key]), key


@given(case=_chunked(), data=st.data())
def test_a_rollout_written_in_place_is_refused_by_name(case, data):
    chunked, _ = case
    padded = SequencePadder()(chunked)
    keys = _rollout_keys(chunked)
    key = data.draw(st.sampled_from(keys), label="written key")
    safe = data.draw(st.booleans(), label="read before the write")
    if safe:
        before = padded[key].clone()
    leaf = chunked[key].view(-1)[:1]  # a write through a view counts too
    leaf.fill_(True) if leaf.dtype == torch.bool else leaf.zero_()
    if safe:
        # read before the write: a snapshot, as an eager padder's
        assert torch.equal(padded[key], before)
        return
    with pytest.raises(ValueError, match="modified in place") as info:
        padded[key]
    assert repr(key) in str(info.value)
    with pytest.raises(ValueError, match="modified in place"):
        list(SequenceSampler(1)(padded))
    assert has_pending(padded)
