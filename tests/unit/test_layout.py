"""Unit tests of rppo_td/_layout.py: SequenceLayout."""

from __future__ import annotations

import torch

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
