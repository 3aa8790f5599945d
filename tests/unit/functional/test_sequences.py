"""Unit tests of rppo_td/functional/_sequences.py."""

from __future__ import annotations

import re

import pytest
import torch

from rppo_td.functional import chunk_episodes, episode_ids, episode_starts, sequence_layout


def _bools(*rows):
    return torch.tensor(rows, dtype=torch.bool)


def test_episode_starts_row_starts_done_and_is_init():
    done = _bools([False, True, False, False], [False, False, False, True])
    is_init = _bools([False, False, False, True], [False, False, False, False])
    assert episode_starts(done).tolist() == [
        [True, False, True, False],
        [True, False, False, False],
    ]
    assert episode_starts(done, is_init).tolist() == [
        [True, False, True, True],
        [True, False, False, False],
    ]


def test_episode_ids_never_span_workers():
    # worker 0 ends no episode, yet worker 1's first step starts a new id
    start = episode_starts(_bools([False, False], [False, True]))
    assert episode_ids(start).tolist() == [[0, 0], [1, 1]]


def test_chunk_episodes_golden():
    start = _bools([True, False, False, False, False, True, False])
    sequence_id, offset = chunk_episodes(start, 2)
    assert sequence_id.tolist() == [[0, 0, 1, 1, 2, 3, 3]]
    assert offset.tolist() == [[0, 1, 0, 1, 0, 0, 1]]
    sequence_id, offset = chunk_episodes(start, None)
    assert sequence_id.tolist() == [[0, 0, 0, 0, 0, 1, 1]]
    assert offset.tolist() == [[0, 1, 2, 3, 4, 0, 1]]


def test_sequence_layout_golden():
    sequence_id = torch.tensor([[0, 0, 1], [2, 2, 2]])
    offset = torch.tensor([[0, 1, 0], [0, 1, 2]])
    flat_index, mask = sequence_layout(sequence_id, offset)
    assert flat_index.tolist() == [[0, 1, 0], [2, 0, 0], [3, 4, 5]]
    assert mask.tolist() == [[True, True, False], [True, False, False], [True, True, True]]


@pytest.mark.parametrize("length", [0, -1, True, False, 2.5])
def test_chunk_episodes_rejects_bad_lengths(length):
    with pytest.raises(
        ValueError, match=re.escape(f"sequence_length must be an int >= 1 or None, got {length!r}")
    ):
        chunk_episodes(_bools([True, False]), length)


def test_episode_starts_checks():
    with pytest.raises(ValueError, match=re.escape("done must have shape [W, T], got [2, 3, 1]")):
        episode_starts(torch.zeros(2, 3, 1, dtype=torch.bool))
    with pytest.raises(
        ValueError, match=re.escape("'done' must have dtype torch.bool, got torch.int64")
    ):
        episode_starts(torch.zeros(2, 3, dtype=torch.int64))
    done = torch.zeros(2, 3, dtype=torch.bool)
    with pytest.raises(
        ValueError, match=re.escape("is_init must have shape [2, 3] like done, got [2, 3, 1]")
    ):
        episode_starts(done, torch.zeros(2, 3, 1, dtype=torch.bool))
    with pytest.raises(
        ValueError, match=re.escape("'is_init' must have dtype torch.bool, got torch.float32")
    ):
        episode_starts(done, torch.zeros(2, 3))


def test_sequence_layout_checks():
    ids = torch.zeros(2, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match=re.escape("got [2, 3] and [2, 2]")):
        sequence_layout(ids, torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(
        ValueError,
        match=re.escape("'sequence_offset' must have dtype torch.int64, got torch.int32"),
    ):
        sequence_layout(ids, torch.zeros(2, 3, dtype=torch.int32))


def test_a_sequence_length_past_int64_is_whole_fragments():
    # L = 2**63 gave negative offsets on the torch path and an OverflowError on the native one
    from rppo_td._native import native_kernels

    start = torch.tensor([[True, False, False, True, False]])
    whole = chunk_episodes(start, None)
    for length in (5, 2**62, 2**63, 2**64, 10**30):
        for native in (False, True):
            with native_kernels(native):
                got = chunk_episodes(start, length)
            assert all(torch.equal(a, b) for a, b in zip(got, whole, strict=True)), (length, native)
