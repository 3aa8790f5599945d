"""Splitting an epoch of sequences into minibatches of balanced size."""

from __future__ import annotations

from typing import Literal

import torch

from rppo_td._validation import check_balance

__all__ = ["balanced_minibatches"]


def balanced_minibatches(
    lengths: torch.Tensor,
    num_minibatches: int,
    *,
    generator: torch.Generator | None = None,
    balance: Literal["steps", "sequences"] = "steps",
) -> list[torch.Tensor]:
    """Shuffles sequences and cuts them into ``num_minibatches`` groups.

    With ``balance="steps"`` the shuffled order is cut where the running count of real steps is
    nearest to ``k * S / M`` (``S`` real steps in all): every group holds ``S / M`` steps give or
    take one sequence length on either cut. With ``balance="sequences"`` every group holds
    ``N / M`` sequences, give or take one, whatever their lengths. Groups are never empty.

    Args:
        lengths: ``[N]`` int64, real steps per sequence (``loss_mask.sum(-1)``).
        num_minibatches: ``M``, ``1 <= M <= N``.
        generator: draws the order; its device is used for the permutation.
        balance: what the groups are balanced by.

    Returns:
        ``M`` int64 tensors of sequence indices on ``lengths.device``; together a permutation of
        ``range(N)``.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> groups = balanced_minibatches(torch.tensor([8, 1, 1, 8, 1, 1]), 2, generator=g)
        >>> [int(torch.tensor([8, 1, 1, 8, 1, 1])[i].sum()) for i in groups]
        [10, 10]
    """
    if lengths.ndim != 1:
        raise ValueError(f"lengths must have shape [N], got {list(lengths.shape)}")
    num_sequences = lengths.shape[0]
    if isinstance(num_minibatches, bool) or int(num_minibatches) != num_minibatches:
        raise ValueError(f"num_minibatches must be an int, got {num_minibatches!r}")
    if not 1 <= num_minibatches <= num_sequences:
        raise ValueError(
            f"num_minibatches must be in [1, {num_sequences}] (the number of sequences), "
            f"got {num_minibatches}"
        )
    check_balance(balance)
    perm_device = generator.device if generator is not None else lengths.device
    order = torch.randperm(num_sequences, generator=generator, device=perm_device)
    order = order.to(lengths.device)
    cuts = _cut_points(lengths[order], num_minibatches, balance)
    sizes = (cuts[1:] - cuts[:-1]).tolist()
    return list(order.split(sizes))


def _cut_points(lengths: torch.Tensor, num_minibatches: int, balance: str) -> torch.Tensor:
    """``[M + 1]`` int64 boundaries ``0 = b_0 < b_1 < ... < b_M = N`` in shuffled order."""
    num_sequences = lengths.shape[0]
    device = lengths.device
    k = torch.arange(num_minibatches + 1, device=device)
    if balance == "sequences":
        return torch.div(k * num_sequences, num_minibatches, rounding_mode="floor")
    prefix = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(torch.float64)
    target = k.to(torch.float64) * prefix[-1] / num_minibatches
    above = torch.searchsorted(prefix, target).clamp(1, num_sequences)
    below = above - 1
    nearer_below = (target - prefix[below]) < (prefix[above] - target)
    cut = torch.where(nearer_below, below, above)
    # strictly increasing with cut[0] = 0 and cut[M] = N, so no group is empty
    cut = k + (cut - k).cummax(0).values
    cut = torch.minimum(cut, k + num_sequences - num_minibatches)
    cut[0] = 0
    return cut
