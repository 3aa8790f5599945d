"""Unit tests of rppo_td/_layout.py: SequenceLayout."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from rppo_td import EpisodeSplitter, RolloutKeys, SequenceChunker, SequenceLayout, SequencePadder
from tests.unit._data import small_rollout


def _chunked():
    return SequenceChunker(sequence_length=3)(EpisodeSplitter()(small_rollout(num_steps=6)))


def test_layout_fields():
    layout = SequenceLayout.from_rollout(_chunked(), RolloutKeys(), "test")
    # worker 0: [0, 1], [2, 3], [4, 5]; worker 1: [0, 1, 2], [3, 4, 5]
    assert layout.num_sequences == 5
    assert layout.time_steps == 6
    assert layout.lengths().tolist() == [2, 2, 2, 3, 3]
    assert layout.flat_index.tolist() == [[0, 1, 0], [2, 3, 0], [4, 5, 0], [6, 7, 8], [9, 10, 11]]


def test_gather_subset_equals_indexing_the_full_gather():
    td = _chunked()
    layout = SequenceLayout.from_rollout(td, RolloutKeys(), "test")
    full = layout.gather(td, RolloutKeys())
    assert (full == SequencePadder()(td)).all()
    index = torch.tensor([4, 0, 2])
    part = layout.gather(td, RolloutKeys(), index)
    assert part.batch_size == (3, 3)
    assert (part == full[index]).all()


def test_stacked_scalar_leaves_gather_as_alone(monkeypatch):
    """ScalarStack: the one-number leaves of a dtype gathered together give the same minibatch.

    Same values, dtypes, shapes, key order and contiguous leaves as gathering each alone.
    """
    from rppo_td._layout import ScalarStack, gather_sequences

    torch.manual_seed(0)
    done = torch.rand(3, 12, 1) < 0.3
    td = TensorDict(
        {
            "a": torch.randn(3, 12),
            "b": torch.randn(3, 12, 1),
            "vector": torch.randn(3, 12, 4),
            "flag": torch.rand(3, 12, 1) < 0.5,
            "next": {"done": done, "reward": torch.randn(3, 12, 1)},
        },
        batch_size=[3, 12],
    )
    td = SequenceChunker(sequence_length=5)(EpisodeSplitter()(td))
    keys = RolloutKeys()
    layout = SequenceLayout.from_rollout(td, keys, "test")
    stacks = ScalarStack.of(td, layout.flat_index.device, columns=True)
    float_stack = next(s for s in stacks if s.rows.dtype == torch.float32)
    assert set(float_stack.keys) == {"a", "b", ("next", "reward")}  # not the vector
    assert {s.rows.dtype for s in stacks} == {torch.float32, torch.int64, torch.bool}  # small
    index = torch.tensor([2, 0, 1])
    alone = gather_sequences(layout, td, keys, index)
    together = gather_sequences(layout, td, keys, index, stacks=stacks)
    assert list(together.keys(True, True)) == list(alone.keys(True, True))
    for key in alone.keys(True, True):
        assert together[key].dtype == alone[key].dtype
        assert torch.equal(together[key], alone[key])
        assert together[key].is_contiguous()
    # beyond SMALL_COLUMN_STACK steps a CPU's column gathers are stacked for float32 only
    # (the others are slower stacked there); row selects stack every dtype
    monkeypatch.setattr("rppo_td._layout.SMALL_COLUMN_STACK", 8)
    large = ScalarStack.of(td, layout.flat_index.device, columns=True)
    assert [s.rows.dtype for s in large] == [torch.float32]
    rows = ScalarStack.of(td, layout.flat_index.device, columns=False)
    assert {s.rows.dtype for s in rows} == {torch.float32, torch.int64, torch.bool}
    mixed = gather_sequences(layout, td, keys, index, stacks=large)
    assert all(torch.equal(mixed[key], alone[key]) for key in alone.keys(True, True))


def test_stacked_scalar_leaves_select_as_alone():
    """The padded sampler's select: stacked leaves give ``td[index]``, leaf for leaf.

    Same values, dtypes, shapes, key order and contiguous leaves, with the leaves read once
    (``leaf_items``) as the sampler reads them for an epoch.
    """
    from rppo_td._buffers import OutputPool
    from rppo_td._layout import ScalarStack, leaf_items
    from rppo_td.sampling._sampler import select_rows

    torch.manual_seed(1)
    done = torch.rand(4, 10, 1) < 0.3
    td = TensorDict(
        {
            "a": torch.randn(4, 10),
            "vector": torch.randn(4, 10, 3),
            "count": torch.randint(0, 9, (4, 10, 1)),
            "next": {"done": done, "reward": torch.randn(4, 10, 1)},
        },
        batch_size=[4, 10],
    )
    padded = SequencePadder()(SequenceChunker(sequence_length=4)(EpisodeSplitter()(td)))
    stacks = ScalarStack.of(padded, torch.device("cpu"), columns=False)
    assert {s.rows.dtype for s in stacks} == {torch.float32, torch.int64, torch.bool}
    index = torch.tensor([3, 0, padded.batch_size[0] - 1])
    together = select_rows(padded, index, OutputPool(), stacks, leaf_items(padded))
    alone = padded[index]
    assert together.batch_size == alone.batch_size
    assert list(together.keys(True, True)) == list(alone.keys(True, True))
    for key in alone.keys(True, True):
        assert together[key].dtype == alone[key].dtype
        assert torch.equal(together[key], alone[key]), key
        assert together[key].is_contiguous()
