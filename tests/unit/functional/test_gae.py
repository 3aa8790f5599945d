"""Unit tests of rppo_td/functional/_gae.py: golden cases worked by hand, and entry checks."""

from __future__ import annotations

import re

import pytest
import torch

from rppo_td._native import native_kernels
from rppo_td.functional import discounted_segment_sum, generalized_advantage_estimate


def _col(*rows):
    """Rows of numbers as a ``[W, T, 1]`` tensor (bool if given bools)."""
    return torch.tensor(rows).unsqueeze(-1)


def test_golden_terminated_and_truncated_rows():
    # gamma = 0.5, lmbda = 0.5, so gamma * lmbda = 0.25.
    #
    # Row 0: steps 0, 1 form an episode that TERMINATES at t=1; t=2 starts a new episode that
    # the rollout cuts after one step.
    #   t=2 (last step, bootstrap): delta = 3 + 0.5 * 2.0 - 2.0 = 2.0;        A = 2.0
    #   t=1 (terminated, V'=4 ignored): delta = 2 + 0 - 1.0 = 1.0;            A = 1.0
    #   t=0: delta = 1 + 0.5 * 1.0 - 0.5 = 1.0; A = 1.0 + 0.25 * 1.0 =        1.25
    #   value_target = A + V = [1.75, 2.0, 4.0]
    #
    # Row 1: the episode is TRUNCATED at t=1 (time limit), a new one starts at t=2.
    #   t=2 (last step, bootstrap): delta = -1 + 0.5 * 4.0 - 0.0 = 1.0;       A = 1.0
    #   t=1 (truncated: bootstrap, but stop): delta = 1 + 0.5 * 6.0 - 2.0 = 2.0; A = 2.0
    #   t=0: delta = 0 + 0.5 * 2.0 - 1.0 = 0.0; A = 0.0 + 0.25 * 2.0 =        0.5
    #   value_target = [1.5, 4.0, 1.0]
    reward = _col([1.0, 2.0, 3.0], [0.0, 1.0, -1.0])
    value = _col([0.5, 1.0, 2.0], [1.0, 2.0, 0.0])
    next_value = _col([1.0, 4.0, 2.0], [2.0, 6.0, 4.0])
    terminated = _col([False, True, False], [False, False, False])
    truncated = _col([False, False, False], [False, True, False])
    advantage, target = generalized_advantage_estimate(
        reward, value, next_value, terminated, terminated | truncated, gamma=0.5, lmbda=0.5
    )
    torch.testing.assert_close(advantage, _col([1.25, 1.0, 2.0], [0.5, 2.0, 1.0]))
    torch.testing.assert_close(target, _col([1.75, 2.0, 4.0], [1.5, 4.0, 1.0]))


def test_golden_no_episode_end():
    # gamma = 0.9, lmbda = 0.8 (gamma * lmbda = 0.72), one row, no end: bootstraps at t=2.
    #   t=2: delta = 1 + 0.9 * 10 - 2 = 8.0;               A = 8.0
    #   t=1: delta = 0 + 0.9 * 2 - 1 = 0.8; A = 0.8 + 0.72 * 8.0 = 6.56
    #   t=0: delta = 2 + 0.9 * 1 - 0 = 2.9; A = 2.9 + 0.72 * 6.56 = 7.6232
    reward = _col([2.0, 0.0, 1.0])
    value = _col([0.0, 1.0, 2.0])
    next_value = _col([1.0, 2.0, 10.0])
    false = torch.zeros(1, 3, 1, dtype=torch.bool)
    advantage, target = generalized_advantage_estimate(
        reward, value, next_value, false, false, gamma=0.9, lmbda=0.8
    )
    torch.testing.assert_close(advantage, _col([7.6232, 6.56, 8.0]))
    torch.testing.assert_close(target, _col([7.6232, 7.56, 10.0]))


def test_golden_terminated_at_the_last_step_does_not_bootstrap():
    # gamma = lmbda = 1, V = 0, V' = [V(o_1), V(o_2), 100] = [0, 0, 100]: the episode
    # terminates at t=2, so V' = 100 there is ignored and A[t] = the rest of the rewards.
    reward = _col([1.0, 1.0, 1.0])
    zero = torch.zeros(1, 3, 1)
    terminated = _col([False, False, True])
    advantage, _ = generalized_advantage_estimate(
        reward, zero, _col([0.0, 0.0, 100.0]), terminated, terminated, gamma=1.0, lmbda=1.0
    )
    torch.testing.assert_close(advantage, _col([3.0, 2.0, 1.0]))


def test_golden_segment_sum():
    # y[t] = x[t] + 0.5 * carry_on[t] * y[t+1]: the cut at t=1 stops the sum.
    #   y[3] = 4; y[2] = 3 + 0.5 * 4 = 5; y[1] = 2 (cut); y[0] = 1 + 0.5 * 2 = 2
    x = torch.tensor([1.0, 2.0, 3.0, 4.0]).view(1, 4, 1)
    carry_on = torch.tensor([True, False, True, True]).view(1, 4, 1)
    y = discounted_segment_sum(x, carry_on, 0.5)
    torch.testing.assert_close(y.flatten(), torch.tensor([2.0, 2.0, 5.0, 4.0]))
    # decay 0 is the identity
    torch.testing.assert_close(discounted_segment_sum(x, carry_on, 0.0), x)


def test_segment_sum_chains_blocks():
    # decay 1e-3: a block holds 600 / log(1000) = 86 steps; 300 steps need 4 chained blocks.
    # x = 1 everywhere, no cut: y[t] = sum_k decay**k over the remaining steps.
    steps = 300
    y = discounted_segment_sum(
        torch.ones(1, steps, 1, dtype=torch.float64),
        torch.ones(1, steps, 1, dtype=torch.bool),
        1e-3,
    ).flatten()
    remaining = torch.arange(steps, 0, -1, dtype=torch.float64)
    expected = (1 - 1e-3**remaining) / (1 - 1e-3)
    torch.testing.assert_close(y, expected, atol=1e-12, rtol=1e-12)


def _inputs(**overrides):
    shape = (2, 3, 1)
    inputs = {
        "reward": torch.zeros(shape),
        "state_value": torch.zeros(shape),
        "next_state_value": torch.zeros(shape),
        "terminated": torch.zeros(shape, dtype=torch.bool),
        "done": torch.zeros(shape, dtype=torch.bool),
    }
    inputs.update(overrides)
    return inputs


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"done": torch.zeros(2, 3, 1)}, "'done' must have dtype torch.bool, got torch.float32"),
        (
            {"terminated": torch.zeros(2, 3, 1, dtype=torch.int64)},
            "'terminated' must have dtype torch.bool, got torch.int64",
        ),
        (
            {"reward": torch.zeros(2, 3)},
            "'reward' must have shape [*B, T, 1] (a trailing 1), got [2, 3]",
        ),
        ({"state_value": torch.zeros(2, 3)}, "'state_value' must have shape [2, 3, 1], got [2, 3]"),
        (
            {"next_state_value": torch.zeros(2, 1, 1)},
            "'next_state_value' must have shape [2, 3, 1], got [2, 1, 1]",
        ),
        (
            {"reward": torch.zeros(2, 3, 1, dtype=torch.int64)},
            "'reward' must be a floating-point tensor, got torch.int64",
        ),
        (
            {"state_value": torch.zeros(2, 3, 1, dtype=torch.int32)},
            "'state_value' must be a floating-point tensor, got torch.int32",
        ),
        ({"reward": torch.tensor([[[float("nan")]] * 3] * 2)}, "'reward' must be finite"),
        ({"state_value": torch.full((2, 3, 1), float("inf"))}, "'state_value' must be finite"),
        (
            {"next_state_value": torch.full((2, 3, 1), -float("inf"))},
            "'next_state_value' must be finite",
        ),
    ],
)
def test_entry_checks(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        generalized_advantage_estimate(**_inputs(**overrides), gamma=0.9, lmbda=0.9)


def test_finite_check_names_every_bad_input():
    inputs = _inputs(
        reward=torch.full((2, 3, 1), float("nan")),
        next_state_value=torch.full((2, 3, 1), float("inf")),
    )
    with pytest.raises(ValueError, match="'reward', 'next_state_value' must be finite"):
        generalized_advantage_estimate(**inputs, gamma=0.9, lmbda=0.9)


@pytest.mark.parametrize(("gamma", "lmbda", "name"), [(1.5, 0.5, "gamma"), (0.5, -0.1, "lmbda")])
def test_discounts_out_of_range(gamma, lmbda, name):
    with pytest.raises(ValueError, match=f"{name} must be in \\[0, 1\\]"):
        generalized_advantage_estimate(**_inputs(), gamma=gamma, lmbda=lmbda)


def test_segment_sum_gradient_at_the_two_level_size():
    # 2**16 steps take the two-level path without gradients; with them, the gradient of
    # sum(y) is sum_k decay**k over the steps up to t (no cut): 1 + 0.5 + ... -> 2 - 0.5**t
    steps = 1 << 16
    x = torch.zeros(1, steps, 1, requires_grad=True)
    carry_on = torch.ones(1, steps, 1, dtype=torch.bool)
    discounted_segment_sum(x, carry_on, 0.5).sum().backward()
    t = torch.arange(steps, dtype=torch.float64)
    torch.testing.assert_close(x.grad.flatten().double(), 2 - 0.5**t)


@pytest.mark.parametrize("native", [True, False], ids=["kernels", "torch"])
@pytest.mark.parametrize(
    ("dtype", "reward"), [(torch.float16, 1000.0), (torch.float32, 1e37)], ids=["f16", "f32"]
)
def test_an_advantage_beyond_the_dtype_is_refused_not_inf(native, dtype, reward):
    # finite inputs whose sums leave the dtype's range: 200 steps of `reward`, lambda 1
    shape = (2, 200, 1)
    flags = torch.zeros(shape, dtype=torch.bool)
    values = torch.zeros(shape, dtype=dtype)
    with native_kernels(native):
        with pytest.raises(ValueError, match=rf"overflows {dtype} \(largest finite"):
            generalized_advantage_estimate(
                torch.full(shape, reward, dtype=dtype), values, values, flags, flags,
                gamma=0.999, lmbda=1.0,
            )  # fmt: skip
        # a tenth of it fits
        advantage, target = generalized_advantage_estimate(
            torch.full(shape, reward / 10, dtype=dtype), values, values, flags, flags,
            gamma=0.999, lmbda=1.0,
        )  # fmt: skip
    assert advantage.dtype == target.dtype == dtype
    assert torch.isfinite(advantage).all() and torch.isfinite(target).all()


def test_float16_values_with_a_wider_reward_are_worked_in_float32():
    # the float32 reward 70000 is beyond float16, the advantage and target are not: the
    # reward is not cast to float16 before the sums (a truncation: next value bootstrapped)
    shape = (1, 4, 1)
    truncated = torch.ones(shape, dtype=torch.bool)
    value = torch.full(shape, 65000.0, dtype=torch.float16)
    next_value = torch.full(shape, -20000.0, dtype=torch.float16)
    advantage, target = generalized_advantage_estimate(
        torch.full(shape, 70000.0), value, next_value, ~truncated, truncated,
        gamma=0.99, lmbda=0.95,
    )  # fmt: skip
    assert advantage.dtype == target.dtype == torch.float16
    expected = 70000.0 - 0.99 * 20000.0 - 65000.0
    torch.testing.assert_close(advantage, torch.full(shape, expected, dtype=torch.float16))
    torch.testing.assert_close(target, torch.full(shape, expected + 65000.0, dtype=torch.float16))


def test_a_segment_sum_beyond_the_dtype_is_refused_not_inf():
    x = torch.full((1, 100, 1), 1000.0, dtype=torch.float16)
    keep = torch.ones(1, 100, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"a sum overflows torch.float16 \(largest finite 65504"):
        discounted_segment_sum(x, keep, 1.0)
    assert torch.isfinite(discounted_segment_sum(x, keep, 0.9)).all()


@pytest.mark.parametrize("native", [True, False], ids=["kernels", "torch"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_value_target_is_rounded_once(native, dtype):
    # at a terminal step the target is the reward: 1 - (-3000) = 3001 has no float16 (or
    # bfloat16) of its own, so a target made from the rounded advantage was 0 or 2, not 1
    shape = (1, 3, 1)
    ended = torch.ones(shape, dtype=torch.bool)
    reward = torch.ones(shape, dtype=dtype)
    value = torch.full(shape, -3000.0, dtype=dtype)
    with native_kernels(native):
        advantage, target = generalized_advantage_estimate(
            reward, value, value, ended, ended, gamma=0.99, lmbda=0.95
        )
    assert advantage.dtype == target.dtype == dtype
    assert torch.equal(target, reward)
    assert torch.equal(advantage, torch.full(shape, 3001.0).to(dtype))
