"""Generalized advantage estimation as a pure tensor function.

Reference: Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage
Estimation", ICLR 2016.
"""

from __future__ import annotations

import math

import torch
from tensordict import NestedKey

from rppo_td._validation import check_dtype, check_finite, check_floating, check_shape

__all__ = ["discounted_segment_sum", "generalized_advantage_estimate"]

# exp(-600) is far above float64's smallest normal (about exp(-708)): a block of K steps with
# gamma * lmbda = g keeps g**K in range when K * log(1 / g) <= 600.
_LOG_RANGE = 600.0


def _block_length(decay: float, steps: int) -> int:
    if decay >= 1.0:
        return steps
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

    Args:
        x: ``[*B, T, *F]`` float (with ``time_dim`` pointing at ``T``).
        carry_on: same shape as ``x``, bool. False cuts the sum after that step.
        decay: the discount per step, in ``[0, 1]``.
        time_dim: the time dimension of ``x``.

    Returns:
        ``[*B, T, *F]``, the dtype of ``x``.

    Example:
        >>> x = torch.ones(1, 4, 1)
        >>> carry_on = torch.tensor([[True, False, True, True]]).unsqueeze(-1)
        >>> discounted_segment_sum(x, carry_on, 0.5).squeeze(-1)
        tensor([[1.5000, 1.0000, 1.5000, 1.0000]])
    """
    if decay == 0.0 or x.numel() == 0:
        return x.clone()
    dim = time_dim % x.ndim
    steps = x.shape[dim]
    # time last and every other dim flattened into rows: [R, T], a view for [*B, T, 1]
    x_rows = x.movedim(dim, -1)
    moved_shape = x_rows.shape
    x_rows = x_rows.reshape(-1, steps)
    carry_rows = carry_on.movedim(dim, -1).reshape(-1, steps)
    block = _block_length(decay, steps)
    out = torch.empty(x_rows.shape, dtype=x.dtype, device=x.device)
    carry: torch.Tensor | None = None
    for stop in range(steps, 0, -block):
        start = max(0, stop - block)
        y = _segment_sum_block(x_rows[:, start:stop], carry_rows[:, start:stop], decay, carry)
        out[:, start:stop] = y
        carry = y[:, :1]
    return out.view(moved_shape).movedim(-1, dim).contiguous()


def _segment_sum_block(
    x: torch.Tensor, carry_on: torch.Tensor, decay: float, carry: torch.Tensor | None
) -> torch.Tensor:
    """One block ``[R, K]`` (time last), float64 result; ``carry`` ``[R, 1]`` is ``y[K]``.

    Works in reversed time ``s = K - 1 - t`` so that one forward ``cumsum`` gives the tails
    ``R[t]`` and one forward ``cummax`` the last cut at or before ``s`` (the first at or after
    ``t``), with no flip of intermediate results.
    """
    steps = x.shape[-1]
    k = torch.arange(steps, device=x.device)
    # weight[t] = decay**t, reversed; x * weight promotes to float64 in the same pass
    weight = torch.pow(decay, k.flip(0).to(torch.float64))
    scaled = x.flip(-1) * weight
    tail = scaled.cumsum(-1)
    # tail before s (exclusive), 0 at s = 0: R[e(t) + 1] once gathered at the cut
    before = torch.nn.functional.pad(tail[:, :-1], (1, 0))
    cut = torch.where(carry_on.flip(-1), 0, k).cummax(-1).values
    y = (tail - before.gather(-1, cut)).div_(weight)
    if carry is not None:
        # no cut between t and the block's end: y[t] += decay**(K - t) * y[K]
        uncut = (cut == 0) & carry_on[:, -1:]
        reach = torch.pow(decay, (k + 1).to(torch.float64))
        y += torch.where(uncut, reach * carry.to(torch.float64), 0.0)
    return y.flip(-1)


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

    Args:
        reward: ``[*B, T, 1]`` float.
        state_value: ``[*B, T, 1]`` float, ``V(o_t)``.
        next_state_value: ``[*B, T, 1]`` float, ``V(o_{t+1})`` (the pre-reset observation).
        terminated: ``[*B, T, 1]`` bool.
        done: ``[*B, T, 1]`` bool, ``terminated | truncated``.
        gamma: discount in ``[0, 1]``.
        lmbda: GAE lambda in ``[0, 1]``.
        time_dim: the time dimension.

    Returns:
        ``(advantage, value_target)``, each ``[*B, T, 1]`` in ``state_value``'s dtype.

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
    check_gae_inputs(
        {
            "reward": reward,
            "state_value": state_value,
            "next_state_value": next_state_value,
            "terminated": terminated,
            "done": done,
        },
        gamma=gamma,
        lmbda=lmbda,
    )
    return gae_unchecked(
        reward, state_value, next_state_value, terminated, done,
        gamma=gamma, lmbda=lmbda, time_dim=time_dim,
    )


def check_gae_inputs(
    named: dict[NestedKey, torch.Tensor], *, gamma: float, lmbda: float
) -> None:
    """Checks GAE inputs given in the order reward, value, next value, terminated, done.

    The names are what error messages call them (keys, in the transform).
    """
    for label, value in (("gamma", gamma), ("lmbda", lmbda)):
        if not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"{label} must be in [0, 1], got {value}")
    items = list(named.items())
    (r_name, reward), *rest = items
    check_floating(r_name, reward)
    if reward.ndim < 2 or reward.shape[-1] != 1:
        raise ValueError(
            f"{r_name!r} must have shape [*B, T, 1] (a trailing 1), got {list(reward.shape)}"
        )
    for name, x in rest:
        check_shape(name, x, reward.shape)
    for name, x in items[1:3]:
        check_floating(name, x)
    for name, x in items[3:]:
        check_dtype(name, x, torch.bool)
    check_finite(dict(items[:3]))


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
    """`generalized_advantage_estimate` without the entry checks (inputs already checked)."""
    dtype = state_value.dtype
    bootstrap = torch.where(terminated, 0.0, next_state_value.to(dtype))
    delta = reward.to(dtype) + gamma * bootstrap - state_value
    advantage = discounted_segment_sum(delta, ~done, float(gamma * lmbda), time_dim=time_dim)
    return advantage, advantage + state_value
