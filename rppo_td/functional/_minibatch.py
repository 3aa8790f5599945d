"""Splitting an epoch of sequences into minibatches of balanced size."""

from __future__ import annotations

import bisect
import itertools
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
    ``N / M`` sequences, give or take one, whatever their lengths. Groups are never empty: where
    ``M`` nears ``N`` that comes before the balance (at ``M = N``, one sequence each).

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
    # one read: the running step count of the shuffled order (steps only), the shortest
    # length and the conditions; the M + 1 cuts are then a few host-side searches
    parts = [lengths.min().view(1).to(torch.int64)]
    if balance == "steps":
        parts.append(lengths[order].cumsum(0).to(torch.int64))
    require = list(require)
    if require:
        flags = torch.stack([condition.reshape(()) for condition, _ in require])
        parts.append(flags.to(torch.int64))
    values = torch.cat(parts).tolist()
    if values[0] < 0:
        raise ValueError(f"lengths must be >= 0 (real steps per sequence), got {values[0]}")
    flags_at = 1 + (num_sequences if balance == "steps" else 0)
    for (_, message), ok in zip(require, values[flags_at:], strict=True):
        if not ok:
            raise ValueError(message if isinstance(message, str) else message())
    prefix = [0, *values[1:flags_at]] if balance == "steps" else None
    cuts = _cut_points(prefix, num_sequences, count)
    return list(order.split([b - a for a, b in itertools.pairwise(cuts)]))


def _cut_points(prefix: list[int] | None, num_sequences: int, num_minibatches: int) -> list[int]:
    """``M + 1`` boundaries ``0 = b_0 < b_1 < ... < b_M = N`` in the shuffled order.

    ``prefix``: ``[N + 1]`` running real-step counts of the shuffled order (``prefix[0] = 0``)
    to cut where the count is nearest to ``k * S / M`` (a tie goes to the later cut); None to
    cut by sequence count, at ``floor(k * N / M)``. Targets are float64, as the counts' own
    comparisons with them (exact below ``2**53`` steps).
    """
    m, n = num_minibatches, num_sequences
    if prefix is None:
        return [k * n // m for k in range(m + 1)]
    total = prefix[-1]
    cuts = []
    for k in range(m + 1):
        target = float(k) * float(total) / m
        above = min(max(bisect.bisect_left(prefix, target), 1), n)
        below = above - 1
        cuts.append(below if target - prefix[below] < prefix[above] - target else above)
    # strictly increasing with cut[0] = 0 and cut[M] = N, so no group is empty: each cut at
    # least one past the one before, and leaving one sequence for every group after it
    for k in range(1, m + 1):
        cuts[k] = max(cuts[k], cuts[k - 1] + 1)
    for k in range(m + 1):
        cuts[k] = min(cuts[k], k + n - m)
    # the ends are fixed: with zero-length sequences last in the order (or no steps at all)
    # the nearest cut to the total can fall short of N
    cuts[0], cuts[-1] = 0, n
    return cuts
