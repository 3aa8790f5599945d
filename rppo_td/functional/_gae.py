"""Generalized advantage estimation as a pure tensor function.

Reference: Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage
Estimation", ICLR 2016.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from rppo_td._native import gae_rows, native_floats, segment_sum_rows, use_native
from rppo_td._validation import (
    check_device,
    check_dtype,
    check_finite,
    check_floating,
    check_not_meta,
    check_shape,
    check_tensors,
    check_time_dim,
    check_unit_interval,
    check_values,
    done_consistent,
)

if TYPE_CHECKING:  # annotations only: functional imports torch alone
    from tensordict import NestedKey

__all__ = ["discounted_segment_sum", "generalized_advantage_estimate"]

# exp(-600) is far above float64's smallest normal (about exp(-708)): a block of K steps with
# gamma * lmbda = g keeps g**K in range when K * log(1 / g) <= 600.
_LOG_RANGE = 600.0


def _block_length(decay: float, steps: int) -> int:
    if decay >= 1.0:
        return steps
    if decay <= 0.0:  # e.g. decay**16 of a tiny decay underflows to 0 in the two-level path
        return 1
    return max(1, min(steps, int(_LOG_RANGE / -math.log(decay))))


def discounted_segment_sum(
    x: torch.Tensor, carry_on: torch.Tensor, decay: float, *, time_dim: int = -2
) -> torch.Tensor:
    """Reverse discounted sum that stops where ``carry_on`` is False.

    Computes ``y[t] = x[t] + decay * carry_on[t] * y[t + 1]`` with ``y[T] = 0`` along
    ``time_dim``, without a loop over time: within a block of ``K`` steps,
    ``y[t] = (R[t] - R[e(t) + 1]) / decay**t`` where ``R`` is the reverse cumulative sum of
    ``decay**k * x[k]`` and ``e(t)`` is the first step at or after ``t`` with ``carry_on`` False.
    Blocks are sized so that ``decay**K`` stays in float64's range; the few blocks are chained
    from the last to the first. Sums run in float64 and are cast back to ``x.dtype``.

    Large inputs (``2**16`` elements or more) take a two-level path that reads memory fewer
    times: the recursion runs inside blocks of 16 steps, all blocks at once (16 vector steps),
    then the block totals, a segment sum with ``decay**16``, are chained by the method above
    and added back. Both paths compute the same float64 sums. The differences ``R[t] -
    R[e(t) + 1]`` carry a rounding error of about float64's epsilon times the largest term of
    the block, so a segment of small values beside one of values 1e6 times larger is exact to
    about 1e-9 of its size, not 1e-16 (the compiled CPU kernel, ``rppo_td._native``, loops).

    Gradients flow to ``x`` (the sum is linear in it). ``x`` must be finite: the blocked sums
    would spread a NaN or an infinity into neighbouring segments, where the recursion would
    not, so one is refused (one device synchronisation). Empty inputs give empty outputs.

    Args:
        x: ``[*B, T, *F]`` float (with ``time_dim`` pointing at ``T``), finite.
        carry_on: ``[*B, T, *F]`` bool, the shape of ``x`` exactly (no broadcasting). False
            cuts the sum after that step.
        decay: the discount per step, a real number in ``[0, 1]``.
        time_dim: the time dimension of ``x``, in ``[-x.ndim, x.ndim)``.

    Returns:
        ``[*B, T, *F]``, the dtype of ``x``.

    Raises:
        ValueError: a non-float ``x``, a non-bool or differently shaped ``carry_on``, a
            ``decay`` outside ``[0, 1]`` (or NaN, or not a number), ``time_dim`` out of range,
            NaN or inf in ``x``, a sum beyond ``x``'s dtype (float16 ends at 65504; the sums
            run in float64, the result is rounded to ``x``'s dtype), meta tensors, or inputs on
            two devices.

    Example:
        >>> x = torch.ones(1, 4, 1)
        >>> carry_on = torch.tensor([[True, False, True, True]]).unsqueeze(-1)
        >>> discounted_segment_sum(x, carry_on, 0.5).squeeze(-1)
        tensor([[1.5000, 1.0000, 1.5000, 1.0000]])
    """
    check_tensors({"x": x, "carry_on": carry_on})
    check_floating("x", x)
    check_dtype("carry_on", carry_on, torch.bool)
    check_shape("carry_on", carry_on, x.shape)
    check_device({"x": x, "carry_on": carry_on})
    check_unit_interval("decay", decay)
    dim = check_time_dim(time_dim, x.ndim)
    check_not_meta({"x": x, "carry_on": carry_on})
    check_values({"x": x})
    y = segment_sum_unchecked(x, carry_on, float(decay), dim)
    try:
        check_finite({"x": y})
    except ValueError:
        raise ValueError(
            f"discounted_segment_sum: a sum overflows {x.dtype} (largest finite "
            f"{torch.finfo(x.dtype).max:g}) though x is finite: give x in a wider dtype"
        ) from None
    return y


def segment_sum_unchecked(
    x: torch.Tensor, carry_on: torch.Tensor, decay: float, dim: int
) -> torch.Tensor:
    """``discounted_segment_sum`` without the entry checks; ``dim`` in ``[0, x.ndim)``."""
    if decay == 0.0 or x.numel() == 0:
        return x.clone()
    steps = x.shape[dim]
    # Time last, every other dim flattened into rows, time reversed: [R, T]. In reversed time
    # s = T - 1 - t the sums run forward, so one cumsum gives every tail R[t] and one cummax
    # the start of every segment, with no flip of intermediate results.
    x_rows = x.movedim(dim, -1)
    moved_shape = x_rows.shape
    rows = x_rows.reshape(-1, steps)
    keep = carry_on.movedim(dim, -1).reshape(-1, steps)
    if native_floats(rows) and use_native(keep):
        y = segment_sum_rows(rows, keep, decay)
    else:
        y = _rows_sum(rows, keep, decay)
    return y.reshape(moved_shape).movedim(-1, dim).contiguous()


# From this many elements on, the two-level path is faster (fewer passes over memory).
_TWO_LEVEL_MIN = 1 << 16
_LEVEL_BLOCK = 16


def _rows_sum(x: torch.Tensor, keep: torch.Tensor, decay: float) -> torch.Tensor:
    """``discounted_segment_sum`` over ``[R, T]`` rows (time last); ``x.dtype`` result."""
    steps = x.shape[-1]
    # the two-level path works in place: autograd cannot record it, the block path can
    recorded = x.requires_grad and torch.is_grad_enabled()
    if x.numel() >= _TWO_LEVEL_MIN and steps >= 2 * _LEVEL_BLOCK and not recorded:
        return _two_level_sum(x, keep, decay)
    x_rev = x.flip(-1)
    keep_rev = keep.flip(-1)
    block = _block_length(decay, steps)
    out_rev = torch.empty_like(x_rev)
    carry: torch.Tensor | None = None
    for start in range(0, steps, block):
        stop = min(steps, start + block)
        y = _segment_sum_block(x_rev[:, start:stop], keep_rev[:, start:stop], decay, carry)
        out_rev[:, start:stop] = y
        carry = y[:, -1:]
    return out_rev.flip(-1)


def _two_level_sum(x: torch.Tensor, keep: torch.Tensor, decay: float) -> torch.Tensor:
    """The recursion inside blocks of ``b`` steps, then across the block totals.

    With ``a[t] = decay * keep[t]``, inside a block ``y[t] = local[t] + P[t] * Y[k + 1]`` where
    ``local`` is the recursion cut at the block's end, ``P[t]`` the product of ``a`` from ``t``
    to the block's end and ``Y[k + 1]`` the sum at the next block's first step. The block
    sums ``Y[k] = local[k, 0] + P[k, 0] * Y[k + 1]`` are themselves a segment sum with decay
    ``decay**b`` (``P[k, 0]`` is that or 0), solved by ``_rows_sum``.
    """
    rows, steps = x.shape
    b = _LEVEL_BLOCK
    blocks = -(-steps // b)
    extra = blocks * b - steps
    if extra:  # zeros after the end change nothing: y[T] = 0 anyway
        x = torch.nn.functional.pad(x, (0, extra))
        keep = torch.nn.functional.pad(keep, (0, extra))
    # [b, R, blocks] float64: step j of every block in one contiguous vector
    local = torch.empty(b, rows, blocks, dtype=torch.float64, device=x.device)
    local.copy_(x.view(rows, blocks, b).permute(2, 0, 1))
    reach = torch.empty_like(local).copy_(keep.view(rows, blocks, b).permute(2, 0, 1))
    reach.mul_(decay)
    for j in range(b - 2, -1, -1):
        local[j].addcmul_(reach[j], local[j + 1])
        reach[j].mul_(reach[j + 1])
    # reach[0] is decay**b where no cut is in the block, else 0
    totals = _rows_sum(local[0], reach[0] != 0, decay**b)
    following = torch.nn.functional.pad(totals[:, 1:], (0, 1))
    local.addcmul_(reach, following)
    out = torch.empty(rows, blocks, b, dtype=x.dtype, device=x.device)
    out.copy_(local.permute(1, 2, 0))
    out = out.view(rows, blocks * b)
    return out[:, :steps] if extra else out


def _segment_sum_block(
    x: torch.Tensor, keep: torch.Tensor, decay: float, carry: torch.Tensor | None
) -> torch.Tensor:
    """One block in reversed time, ``[R, K]``; float64 result.

    ``y[s] = x[s] + decay * keep[s] * y[s - 1]`` with ``y[-1] = carry`` (``[R, 1]``, the end of
    the previous block, or None for zero).
    """
    rows, steps = x.shape
    # weight[s] = decay**(K - 1 - s); x * weight promotes to float64 in the same pass
    weight = torch.pow(decay, torch.arange(steps - 1, -1, -1, device=x.device).to(torch.float64))
    scaled = x * weight
    tail = scaled.cumsum(-1)
    before = torch.nn.functional.pad(tail[:, :-1], (1, 0))  # tail[s - 1], 0 at s = 0
    # flat position of each step's segment start: the last s' <= s with keep False, else the
    # row start (where `before` is 0)
    position = torch.arange(rows * steps, device=x.device).view(rows, steps)
    row_start = position[:, :1].clone()
    first = position.masked_fill_(keep, 0)
    first[:, :1] = row_start
    first = first.cummax(-1).values
    y = tail - before.view(-1).index_select(0, first.view(-1)).view(rows, steps)
    y = y.div_(weight)
    if carry is not None:
        # no cut from the block's start to s: y[s] += decay**(s + 1) * carry
        uncut = (first == row_start) & keep[:, :1]
        reach = torch.pow(decay, torch.arange(1, steps + 1, device=x.device).to(torch.float64))
        y += torch.where(uncut, reach * carry.to(torch.float64), 0.0)
    return y


def generalized_advantage_estimate(
    reward: torch.Tensor,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    terminated: torch.Tensor,
    done: torch.Tensor,
    *,
    gamma: float,
    lmbda: float,
    time_dim: int = -2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE advantages and value targets, bootstrapping on truncation only.

    The recursion, along ``time_dim`` (Schulman et al., 2016)::

        delta[t] = reward[t] + gamma * (1 - terminated[t]) * next_state_value[t] - state_value[t]
        A[t]     = delta[t] + gamma * lmbda * (1 - done[t]) * A[t + 1],   A[T] = 0
        value_target[t] = A[t] + state_value[t]

    A truncated step (``done`` but not ``terminated``) bootstraps from ``next_state_value``
    and stops the sum; so does the rollout's last step. A terminated step does not bootstrap.

    The outputs are targets: they never carry gradients, even when the inputs require them
    (the inputs are read detached). The entry checks read the data once, with one device
    synchronisation: values must be finite and ``terminated`` must imply ``done`` (a
    terminated step that is not done would neither bootstrap nor stop the sum). Empty inputs
    (``W = 0`` or ``T = 0``) give empty outputs.

    Args:
        reward: ``[*B, T, 1]`` float.
        state_value: ``[*B, T, 1]`` float, ``V(o_t)``.
        next_state_value: ``[*B, T, 1]`` float, ``V(o_{t+1})`` (the pre-reset observation).
        terminated: ``[*B, T, 1]`` bool, True only where ``done`` is.
        done: ``[*B, T, 1]`` bool, ``terminated | truncated``.
        gamma: discount, a real number in ``[0, 1]``.
        lmbda: GAE lambda, a real number in ``[0, 1]``.
        time_dim: the time dimension, any but the trailing 1 (``-2`` for ``[*B, T, 1]``).

    Returns:
        ``(advantage, value_target)``, each ``[*B, T, 1]`` in ``state_value``'s dtype, detached.

    Raises:
        ValueError: a wrong shape or dtype, NaN or inf, ``terminated`` without ``done``,
            ``gamma`` or ``lmbda`` outside ``[0, 1]``, ``time_dim`` out of range, meta tensors,
            or inputs on two devices; the message names the argument. Also an advantage or
            value target beyond ``state_value``'s dtype (float16 ends at 65504; the work is
            in float32 or wider, the outputs rounded to that dtype).

    Example:
        >>> import torch
        >>> r = torch.ones(2, 3, 1)
        >>> v = torch.zeros(2, 3, 1)
        >>> term = torch.tensor([[0, 0, 1], [0, 0, 0]]).bool().unsqueeze(-1)
        >>> adv, target = generalized_advantage_estimate(
        ...     r, v, v, term, term, gamma=1.0, lmbda=1.0)
        >>> adv.squeeze(-1)
        tensor([[3., 2., 1.],
                [3., 2., 1.]])
    """
    check_tensors(
        {
            "reward": reward,
            "state_value": state_value,
            "next_state_value": next_state_value,
            "terminated": terminated,
            "done": done,
        }
    )
    dim = check_gae_inputs(
        {
            "reward": reward,
            "state_value": state_value,
            "next_state_value": next_state_value,
            "terminated": terminated,
            "done": done,
        },
        gamma=gamma,
        lmbda=lmbda,
        time_dim=time_dim,
    )
    return gae_unchecked(
        reward,
        state_value,
        next_state_value,
        terminated,
        done,
        gamma=gamma,
        lmbda=lmbda,
        time_dim=dim,
    )


def check_gae_inputs(
    named: dict[NestedKey, torch.Tensor],
    *,
    gamma: float,
    lmbda: float,
    truncated: tuple[NestedKey, torch.Tensor] | None = None,
    time_dim: int = -2,
) -> int:
    """Checks GAE inputs given in the order reward, value, next value, terminated, done.

    The names are what error messages call them (keys, in the transform). ``terminated`` must
    imply ``done``; with ``truncated`` given, ``done`` must be ``terminated | truncated``. One
    device synchronisation. Returns ``time_dim`` as an
    index in ``[0, ndim - 1)``.
    """
    check_unit_interval("gamma", gamma)
    check_unit_interval("lmbda", lmbda)
    items = list(named.items())
    (r_name, reward), *rest = items
    check_floating(r_name, reward)
    if reward.ndim < 2 or reward.shape[-1] != 1:
        raise ValueError(
            f"{r_name!r} must have shape [*B, T, 1] (a trailing 1), got {list(reward.shape)}"
        )
    dim = check_time_dim(time_dim, reward.ndim, last_allowed=False)
    flags = items[3:]
    if truncated is not None:
        flags.append(truncated)
    for name, x in [*rest, *flags[2:]]:
        if x.shape != reward.shape:
            raise ValueError(
                f"{name!r} must have shape {list(reward.shape)}, got {list(x.shape)}: every GAE "
                f"input has the shape of {r_name!r}"
            )
    for name, x in items[1:3]:
        check_floating(name, x)
    for name, x in flags:
        check_dtype(name, x, torch.bool)
    every = dict([*items, *flags])
    check_device(every)
    check_not_meta(every)
    check_values(dict(items[:3]), done_consistent(items[4], items[3], truncated))
    return dim


def gae_unchecked(
    reward: torch.Tensor,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    terminated: torch.Tensor,
    done: torch.Tensor,
    *,
    gamma: float,
    lmbda: float,
    time_dim: int = -2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`generalized_advantage_estimate` without the entry checks (inputs already checked).

    ``time_dim`` is a checked index. Inputs are read detached: the outputs are targets.
    """
    state_value = state_value.detach()
    dtype = state_value.dtype
    floats = (reward.detach(), state_value, next_state_value.detach())
    if (
        time_dim % state_value.ndim == state_value.ndim - 2
        and state_value.numel() > 0
        and native_floats(*floats)
        and use_native(terminated, done)
    ):
        steps = state_value.shape[time_dim]
        shape = state_value.shape
        advantage, target = gae_rows(
            *(x.reshape(-1, steps) for x in (*floats, terminated, done)), gamma=gamma, lmbda=lmbda
        )
        _check_fits(advantage, target)
        return advantage.view(shape), target.view(shape)
    # float16 and bfloat16 inputs are worked in float32 (the sum in float64) and rounded once
    work = torch.promote_types(dtype, torch.float32)
    bootstrap = next_state_value.detach().to(work).masked_fill(terminated, 0.0)
    delta = torch.add(reward.detach().to(work), bootstrap, alpha=gamma).sub_(state_value)
    advantage = segment_sum_unchecked(delta, ~done, float(gamma * lmbda), time_dim % delta.ndim)
    target = advantage + state_value
    advantage, target = advantage.to(dtype), target.to(dtype)
    _check_fits(advantage, target)
    return advantage, target


def _check_fits(advantage: torch.Tensor, target: torch.Tensor) -> None:
    """Refuses outputs of finite inputs that overflowed their dtype (float16 ends at 65504)."""
    try:
        check_finite({"advantage": advantage, "value_target": target})
    except ValueError:
        dtype = advantage.dtype
        raise ValueError(
            f"GAE's advantage or value target overflows {dtype} (largest finite "
            f"{torch.finfo(dtype).max:g}) though the inputs are finite; the outputs take "
            f"state_value's dtype: give state_value in a wider one (float32), or scale the "
            "rewards down"
        ) from None
