"""Where each sequence's burn-in starts: index arithmetic over whole tensors.

A sequence starting at step ``t`` of worker ``w`` may be preceded by up to ``K`` steps of its
own episode (R2D2's burn-in): they are run through the network, without gradient and outside
the loss, to warm the recurrent state up. Burn-in never reaches before the episode's first step
in the rollout, nor before the rollout's first step (the rollout holds nothing earlier).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from rppo_td._validation import (
    check_device,
    check_dtype,
    check_not_meta,
    check_shape,
    check_tensors,
    check_values,
    whole_at_least,
)

if TYPE_CHECKING:
    from tensordict import NestedKey

__all__ = ["burn_in_lengths", "burn_in_window", "episode_first_steps"]


def episode_first_steps(episode_id: torch.Tensor) -> torch.Tensor:
    """The time index of the first step, in the rollout, of the episode each step belongs to.

    Args:
        episode_id: ``[W, T]`` int64, ``EpisodeSplitter``'s ids (constant along an episode
            fragment, different for consecutive fragments of a row).

    Returns:
        ``[W, T]`` int64 in ``[0, t]`` at column ``t``: ``0`` for the fragment a row starts
        with (its episode may have begun in an earlier rollout).

    Example:
        >>> episode_first_steps(torch.tensor([[0, 0, 1, 1, 1], [2, 3, 3, 4, 4]]))
        tensor([[0, 0, 2, 2, 2],
                [0, 1, 1, 3, 3]])
    """
    _check_ndim({"episode_id": episode_id}, 2)
    check_dtype("episode_id", episode_id, torch.int64)
    check_not_meta({"episode_id": episode_id})
    num_workers, num_time = episode_id.shape
    time = torch.arange(num_time, device=episode_id.device).expand(num_workers, num_time)
    first = torch.ones_like(episode_id, dtype=torch.bool)
    first[:, 1:] = episode_id[:, 1:] != episode_id[:, :-1]
    return torch.where(first, time, 0).cummax(dim=1).values


def burn_in_lengths(
    start_time: torch.Tensor, episode_first_step: torch.Tensor, burn_in: int
) -> torch.Tensor:
    """How many earlier steps of its episode each sequence is warmed up with.

    Args:
        start_time: ``[N]`` int64 ``>= 0``, the column of each sequence's first step.
        episode_first_step: ``[N]`` int64, the column of the first step of its episode in the
            rollout (``episode_first_steps`` at the sequence's first step), ``<= start_time``.
        burn_in: ``K >= 0``, the most steps.

    Returns:
        ``[N]`` int64 ``min(K, start_time - episode_first_step)``: ``0`` for a sequence that
        starts an episode (or the rollout).

    Raises:
        ValueError: a bad ``burn_in``, a shape or dtype other than ``[N]`` int64 for either
            tensor (never broadcast), a negative ``start_time``, or an ``episode_first_step``
            after its ``start_time``.

    Example:
        >>> burn_in_lengths(torch.tensor([0, 4, 9]), torch.tensor([0, 2, 0]), 4)
        tensor([0, 2, 4])
    """
    burn_in = whole_at_least("burn_in", burn_in, 0)
    _check_ndim({"start_time": start_time, "episode_first_step": episode_first_step}, 1)
    check_dtype("start_time", start_time, torch.int64)
    check_dtype("episode_first_step", episode_first_step, torch.int64)
    check_shape("episode_first_step", episode_first_step, start_time.shape)
    gap = start_time - episode_first_step
    check_values(
        {},
        [
            (
                (start_time >= 0).all(),
                lambda: f"start_time must be >= 0, got {int(start_time.min())}",
            ),
            ((gap >= 0).all(), "episode_first_step must be <= start_time for every sequence"),
        ],
    )
    # a K past int64 (any K >= the rollout's length gives the same lengths) stays a number
    return gap.clamp(max=min(burn_in, torch.iinfo(torch.int64).max))


def burn_in_window(
    start_time: torch.Tensor, lengths: torch.Tensor, burn_in: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rollout columns of each sequence's burn-in, right-aligned in a ``[N, K]`` window.

    Position ``j`` of row ``n`` is column ``start_time[n] - K + j``; it is a burn-in step when
    ``j >= K - lengths[n]``. Other positions hold a clamped, valid column (so gathers stay in
    range) and must be ignored.

    Args:
        start_time: ``[N]`` int64, the column of each sequence's first step.
        lengths: ``[N]`` int64 in ``[0, K]`` (``burn_in_lengths``).
        burn_in: ``K >= 0``.

    Returns:
        ``(columns, active)``: ``[N, K]`` int64 and ``[N, K]`` bool.

    Raises:
        ValueError: a bad ``burn_in``, a shape or dtype other than ``[N]`` int64 for either
            tensor (never broadcast), or a length outside ``[0, min(K, start_time)]``.

    Example:
        >>> columns, active = burn_in_window(torch.tensor([1, 5]), torch.tensor([1, 3]), 3)
        >>> columns
        tensor([[0, 0, 0],
                [2, 3, 4]])
        >>> active
        tensor([[False, False,  True],
                [ True,  True,  True]])
    """
    burn_in = whole_at_least("burn_in", burn_in, 0)
    _check_ndim({"start_time": start_time, "lengths": lengths}, 1)
    check_dtype("start_time", start_time, torch.int64)
    check_dtype("lengths", lengths, torch.int64)
    check_shape("lengths", lengths, start_time.shape)
    if bool(((lengths < 0) | (lengths > burn_in) | (lengths > start_time)).any()):
        raise ValueError(
            f"lengths must be in [0, min(burn_in={burn_in}, start_time)] for every sequence"
        )
    offsets = torch.arange(burn_in, device=start_time.device) - burn_in
    columns = (start_time.unsqueeze(1) + offsets).clamp(min=0)
    active = offsets >= -lengths.unsqueeze(1)
    return columns, active


def _check_ndim(named: dict[str, torch.Tensor], ndim: int) -> None:
    check_tensors(dict[str, object](named))
    for name, x in named.items():
        if x.ndim != ndim:
            raise ValueError(f"{name} must have {ndim} dims, got shape {list(x.shape)}")
    tensors: dict[NestedKey, torch.Tensor] = dict(named)
    check_device(tensors)
    check_not_meta(tensors)  # their values are compared
