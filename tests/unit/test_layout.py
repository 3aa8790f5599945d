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


def test_stacked_scalar_leaves_gather_as_alone():
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
    stacks = ScalarStack.of(td, layout.flat_index.device)
    float_stack = next(s for s in stacks if s.rows.dtype == torch.float32)
    assert set(float_stack.keys) == {"a", "b", ("next", "reward")}  # not the vector
    index = torch.tensor([2, 0, 1])
    alone = gather_sequences(layout, td, keys, index)
    together = gather_sequences(layout, td, keys, index, stacks=stacks)
    assert list(together.keys(True, True)) == list(alone.keys(True, True))
    for key in alone.keys(True, True):
        assert together[key].dtype == alone[key].dtype
        assert torch.equal(together[key], alone[key])
        assert together[key].is_contiguous()


def test_hand_built_layout_refusals_name_the_attribute():
    import pytest

    flat = torch.tensor([[0, 1, 0], [3, 4, 5]])
    mask = torch.tensor([[True, True, False], [True, True, True]])
    SequenceLayout(flat, mask, 3, 2)  # worker 0 steps 0, 1; worker 1 steps 0-2
    cases = [
        ((flat, mask, 0, 2), "time_steps must be an int >= 1, got 0"),
        ((flat, mask, 3, True), "num_workers must be an int >= 1, got True"),
        ((flat.int(), mask, 3, 2), "flat_index' must have dtype torch.int64, got torch.int32"),
        ((flat, mask[:, :2], 3, 2), r"loss_mask' must have shape \[2, 3\], got \[2, 2\]"),
        ((flat[:0], mask[:0], 3, 2), r"flat_index must be \[N, Lp\] with N, Lp >= 1"),
        ((flat, torch.tensor([[True, False, True], [True] * 3]), 3, 2), "real step after padding"),
        ((torch.tensor([[0, 1, 0], [3, 4, 6]]), mask, 3, 2), r"in \[0, W \* T = 6\)"),
        ((torch.tensor([[0, 1, 2], [3, 4, 5]]), mask, 3, 2), "must be 0 on padding"),
        ((torch.tensor([[0, 2, 0], [3, 4, 5]]), mask, 3, 2), "consecutive steps"),
        # steps 2 and 3 are consecutive in flat numbers but on two workers' rows
        ((torch.tensor([[2, 3, 0], [3, 4, 5]]), mask, 3, 2), "one worker's row"),
        ((torch.tensor([[3, 4, 0], [3, 4, 5]]), mask, 3, 2), "step 3 .* in more than one"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            SequenceLayout(*args)
    with pytest.raises(TypeError, match=r"flat_index must be a torch\.Tensor, got list"):
        SequenceLayout([[0]], torch.ones(1, 1, dtype=torch.bool), 1, 1)
