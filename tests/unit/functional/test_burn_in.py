"""The burn-in index functions: examples and refusals (properties: tests/property)."""

from __future__ import annotations

import pytest
import torch

from rppo_td.functional import burn_in_lengths, burn_in_window, episode_first_steps


def test_episode_first_steps_restart_at_every_new_id():
    ids = torch.tensor([[5, 5, 6, 6, 7], [0, 0, 0, 0, 0]])
    assert episode_first_steps(ids).tolist() == [[0, 0, 2, 2, 4], [0, 0, 0, 0, 0]]


def test_lengths_are_capped_by_the_episode_and_k():
    start = torch.tensor([0, 3, 7, 7])
    first = torch.tensor([0, 0, 5, 0])
    assert burn_in_lengths(start, first, 4).tolist() == [0, 3, 2, 4]
    assert burn_in_lengths(start, first, 0).tolist() == [0, 0, 0, 0]


def test_window_is_right_aligned_and_in_range():
    columns, active = burn_in_window(torch.tensor([2, 6]), torch.tensor([2, 0]), 3)
    assert columns.tolist() == [[0, 0, 1], [3, 4, 5]]
    assert active.tolist() == [[False, True, True], [False, False, False]]
    empty_columns, empty_active = burn_in_window(torch.tensor([4]), torch.tensor([0]), 0)
    assert empty_columns.shape == (1, 0) and empty_active.shape == (1, 0)


@pytest.mark.parametrize("burn_in", [-1, 1.5, True, "4"])
def test_bad_burn_in_is_named(burn_in):
    with pytest.raises(ValueError, match=r"burn_in must be an int >= 0, got"):
        burn_in_lengths(torch.tensor([1]), torch.tensor([0]), burn_in)


def test_refusals_name_the_argument():
    with pytest.raises(ValueError, match=r"'episode_id' must have dtype torch\.int64"):
        episode_first_steps(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="episode_id must have 2 dims"):
        episode_first_steps(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="episode_first_step must be <= start_time"):
        burn_in_lengths(torch.tensor([1]), torch.tensor([2]), 3)
    with pytest.raises(ValueError, match="lengths must be in"):
        burn_in_window(torch.tensor([1]), torch.tensor([2]), 3)
    with pytest.raises(TypeError, match=r"start_time must be a torch\.Tensor"):
        burn_in_lengths([1], torch.tensor([0]), 3)


def test_mismatched_lengths_are_refused_not_broadcast():
    # [3] against [1] used to broadcast to three lengths of the one first step; [2] against [1]
    # in burn_in_window gave a [1, K] active mask for two sequences
    with pytest.raises(ValueError, match=r"'episode_first_step' must have shape \[3\], got \[1\]"):
        burn_in_lengths(torch.tensor([3, 4, 5]), torch.tensor([0]), 2)
    with pytest.raises(ValueError, match=r"'episode_first_step' must have shape \[3\], got \[2\]"):
        burn_in_lengths(torch.tensor([3, 4, 5]), torch.tensor([0, 1]), 2)
    with pytest.raises(ValueError, match=r"'lengths' must have shape \[2\], got \[1\]"):
        burn_in_window(torch.tensor([3, 4]), torch.tensor([1]), 2)


def test_window_refuses_non_index_dtypes_and_negative_columns():
    with pytest.raises(ValueError, match=r"'start_time' must have dtype torch\.int64"):
        burn_in_window(torch.tensor([3.0, 4.0]), torch.tensor([1, 1]), 2)
    with pytest.raises(ValueError, match=r"'lengths' must have dtype torch\.int64"):
        burn_in_window(torch.tensor([3, 4]), torch.tensor([1, 1], dtype=torch.int32), 2)
    with pytest.raises(ValueError, match=r"start_time must be >= 0, got -3"):
        burn_in_lengths(torch.tensor([-3]), torch.tensor([-5]), 2)


def test_a_burn_in_past_int64_and_meta_or_mixed_devices():
    # burn_in=2**63 raised torch's int64 overflow; meta tensors and two devices raised torch's
    # errors from inside, naming no argument
    start, first = torch.tensor([0, 4, 9]), torch.tensor([0, 2, 0])
    assert burn_in_lengths(start, first, 2**63).tolist() == [0, 2, 9]
    with pytest.raises(ValueError, match="'episode_first_step' is on cpu, but 'start_time'"):
        burn_in_lengths(start.to("meta"), first, 4)
    with pytest.raises(ValueError, match="'start_time' is a meta tensor"):
        burn_in_lengths(start.to("meta"), first.to("meta"), 4)
    with pytest.raises(ValueError, match="'start_time' is a meta tensor"):
        burn_in_window(start.to("meta"), first.to("meta"), 4)
    with pytest.raises(ValueError, match="'lengths' is on cpu, but 'start_time' is on meta"):
        burn_in_window(start.to("meta"), first, 4)
