"""Splitting an epoch of sequences into minibatches of balanced size."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Literal

import torch

from rppo_td._validation import check_balance, check_generator, check_not_meta, check_tensors

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
        lengths: ``[N]`` integer, real steps per sequence (``loss_mask.sum(-1)``), ``>= 0``
            (checked in the one device synchronisation that reads the group sizes).
        num_minibatches: ``M``, an int with ``1 <= M <= N``.
        generator: a ``torch.Generator`` or None; draws the order, on its own device (the
            permutation is then moved to ``lengths.device``).
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
    return plan_minibatches(lengths, num_minibatches, generator=generator, balance=balance)


def plan_minibatches(
    lengths: torch.Tensor,
    num_minibatches: int,
    *,
    generator: torch.Generator | None = None,
    balance: str = "steps",
    require: Iterable[tuple[torch.Tensor, str | Callable[[], str]]] = (),
) -> list[torch.Tensor]:
    """``balanced_minibatches`` that also checks the 0-dim bool ``require`` conditions.

    They are read in the same device synchronisation as the group sizes (the samplers' checks
    of their ``loss_mask``); a False one raises a ``ValueError`` with its message.
    """
    check_tensors({"lengths": lengths})
    if lengths.ndim != 1:
        raise ValueError(f"lengths must have shape [N], got {list(lengths.shape)}")
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise ValueError(f"lengths must be an integer tensor, got {lengths.dtype}")
    num_sequences = lengths.shape[0]
    if isinstance(num_minibatches, bool):
        raise ValueError(f"num_minibatches must be an int, got {num_minibatches!r}")
    try:
        count = operator.index(num_minibatches)  # ints, numpy ints; not 2.0 or "2"
    except TypeError:
        raise ValueError(f"num_minibatches must be an int, got {num_minibatches!r}") from None
    if not 1 <= count <= num_sequences:
        raise ValueError(
            f"num_minibatches must be in [1, {num_sequences}] (the number of sequences), "
            f"got {num_minibatches}"
        )
    check_balance(balance)
    check_generator(generator)
    check_not_meta({"lengths": lengths})
    perm_device = generator.device if generator is not None else lengths.device
    order = torch.randperm(num_sequences, generator=generator, device=perm_device)
    order = order.to(lengths.device)
    cuts = _cut_points(lengths[order], count, balance)
    # the group sizes, the shortest length and the conditions in one read (N >= 1 here)
    parts = [cuts[1:] - cuts[:-1], lengths.min().view(1).to(cuts.dtype)]
    require = list(require)
    if require:
        flags = torch.stack([condition.reshape(()) for condition, _ in require])
        parts.append(flags.to(cuts.dtype))
    values = torch.cat(parts).tolist()
    if values[count] < 0:
        raise ValueError(f"lengths must be >= 0 (real steps per sequence), got {values[count]}")
    for (_, message), ok in zip(require, values[count + 1 :], strict=True):
        if not ok:
            raise ValueError(message if isinstance(message, str) else message())
    return list(order.split(values[:count]))


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
    # the ends are fixed: with zero-length sequences last in the order (or no steps at all)
    # the nearest cut to the total can fall short of N
    cut[0] = 0
    cut[-1] = num_sequences
    return cut
