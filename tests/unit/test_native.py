"""numba's kernels: when they run, and that their refusals are the torch paths' (properties
comparing their results run both paths: tests/property/test_gae.py, test_sequences.py, ...)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from rppo_td import functional
from rppo_td._native import NATIVE_MIN_ELEMENTS, native_kernels, use_native
from rppo_td._validation import check_values
from rppo_td.functional import layout_from_starts

pytest.importorskip("numba")

LARGE = NATIVE_MIN_ELEMENTS


def test_kernels_run_on_large_cpu_tensors_without_grad():
    assert use_native(torch.zeros(LARGE))
    assert not use_native(torch.zeros(LARGE - 1))
    assert not use_native(torch.zeros(LARGE, requires_grad=True))
    assert not use_native(torch.zeros(LARGE), torch.zeros(3, requires_grad=True))
    assert not use_native(torch.zeros(LARGE, device="meta"))


def test_the_switch_forces_either_path_and_is_restored():
    with native_kernels(True):
        assert use_native(torch.zeros(3))
        with native_kernels(False):
            assert not use_native(torch.zeros(LARGE))
        assert use_native(torch.zeros(3))
    with pytest.raises(RuntimeError), native_kernels(False):
        raise RuntimeError
    assert use_native(torch.zeros(LARGE)) and not use_native(torch.zeros(3))


def test_environment_variable_turns_the_kernels_off():
    code = (
        "import torch; from rppo_td._native import use_native, native_kernels\n"
        f"assert not use_native(torch.zeros({LARGE}))\n"
        "with native_kernels(True): assert not use_native(torch.zeros(3))\n"
    )
    env = {**os.environ, "RPPO_TD_NATIVE": "0"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


@pytest.mark.parametrize("native", [False, True])
def test_non_finite_values_are_named_on_both_paths(native):
    good = torch.zeros(LARGE)
    bad = torch.zeros(LARGE)
    bad[-1] = float("nan")
    with native_kernels(native):
        check_values({"a": good, "b": good.double()})
        with pytest.raises(ValueError, match=r"^'b' must be finite, found NaN or inf$"):
            check_values({"a": good, "b": bad})
        with pytest.raises(ValueError, match="the condition"):
            check_values({"a": good}, [(torch.tensor(False), "the condition")])


@pytest.mark.parametrize("native", [False, True])
def test_bad_offsets_give_the_torch_paths_message(native):
    steps = LARGE
    start = torch.zeros(1, steps, dtype=torch.bool)
    start[0, ::4] = True
    offset = (torch.arange(steps) % 4).view(1, steps)
    offset[0, 9] = 3
    with (
        native_kernels(native),
        pytest.raises(ValueError, match="at worker 0, time 9 it is 3 where 1 was expected"),
    ):
        layout_from_starts(start, offset)


def test_gradients_and_half_precision_take_the_torch_path():
    x = torch.randn(8, LARGE // 8, 1, dtype=torch.float64, requires_grad=True)
    carry_on = torch.ones(8, LARGE // 8, 1, dtype=torch.bool)
    functional.discounted_segment_sum(x, carry_on, 0.5).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    value = torch.zeros(8, LARGE // 8, 1, dtype=torch.float16)
    done = torch.zeros(8, LARGE // 8, 1, dtype=torch.bool)
    advantage, target = functional.generalized_advantage_estimate(
        value + 1, value, value, done, done, gamma=0.5, lmbda=1.0
    )
    assert advantage.dtype == target.dtype == torch.float16
    assert advantage[:, 0].eq(2 - 0.5 ** (LARGE // 8 - 1)).all()


def test_code_traced_by_torch_compile_takes_the_torch_path():
    x = torch.zeros(LARGE)
    assert use_native(x)
    # inside the traced graph the kernels are off (their .numpy() calls would break it)
    traced = torch.compile(lambda x: x + int(use_native(x)), backend="eager", fullgraph=True)
    assert traced(x).eq(0).all()
