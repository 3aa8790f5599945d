"""Compiled CPU loops (numba) for the index arithmetic of large rollouts.

The torch paths of GAE, chunking and the sequence layout are whole-tensor expressions: each
is 5 to 20 ops, each op one pass over memory plus a fixed dispatch cost. On a CPU one loop
that carries its state from step to step does the same work in one pass: on a 256 x 128
rollout, timed alone on the project's 2-core Intel Xeon VM, the segment sum went from 0.3-0.9
ms to 0.08 ms, chunking from 0.25-0.7 ms to 0.05 ms, the layout from 0.35-0.4 ms to 0.11 ms
(``benchmarks/native_kernels.py`` times a whole update's data work with and without them).

A kernel runs where ``use_native`` says so: a CPU tensor of at least ``NATIVE_MIN_ELEMENTS``
elements that needs no gradient, with numba installed (a dependency of rppo_td; without it
every function keeps its torch path) and ``RPPO_TD_NATIVE`` not set to ``0``. Smaller
rollouts keep the torch path: their ops cost microseconds, and a process that never reaches
the bound never imports numba (about 0.2 s) nor compiles a kernel (a few seconds, once per
installation: the machine code is cached beside this file, or in numba's user cache).

The kernels are the torch paths' exact counterparts (property tests compare them: integer
outputs equal, sums to float64 rounding); GPU tensors, autograd and code traced by
``torch.compile`` take the torch paths.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch

__all__ = ["NATIVE_MIN_ELEMENTS", "native_floats", "native_kernels", "use_native"]

# Below this many elements the torch path's ops cost microseconds each: the kernels would
# save less in a run than numba's import costs once.
NATIVE_MIN_ELEMENTS = 1 << 12

_forced: bool | None = None


@contextlib.contextmanager
def native_kernels(enabled: bool) -> Iterator[None]:
    """Turns the compiled kernels on or off inside a ``with`` block (tests, benchmarks).

    ``native_kernels(True)`` uses them at every size (where numba is installed, on CPU,
    without gradients); ``native_kernels(False)`` never. Not thread-safe: it sets a
    module-wide switch, restored on exit.

    Example:
        >>> with native_kernels(False):
        ...     pass  # every function takes its torch path here
    """
    global _forced
    before, _forced = _forced, bool(enabled)
    try:
        yield
    finally:
        _forced = before


@functools.cache
def _numba_installed() -> bool:
    if os.environ.get("RPPO_TD_NATIVE", "1").strip() == "0":
        return False
    return importlib.util.find_spec("numba") is not None


def use_native(*tensors: torch.Tensor) -> bool:
    """Whether the kernels run on ``tensors`` (the first one's size decides, see module doc)."""
    # is_compiling first: torch.compile's tracer warns on the cached _numba_installed
    if torch.compiler.is_compiling() or _forced is False or not _numba_installed():
        return False
    first = tensors[0]
    if any(t.device.type != "cpu" or t.requires_grad for t in tensors):
        return False
    return _forced is True or first.numel() >= NATIVE_MIN_ELEMENTS


def native_floats(*floats: torch.Tensor) -> bool:
    """``use_native`` for float tensors the kernels read: float32 or float64 only."""
    return all(x.dtype in (torch.float32, torch.float64) for x in floats) and use_native(*floats)


@functools.cache
def _kernels() -> SimpleNamespace:
    """Compiles (or loads from numba's cache) the kernels on first use."""
    import math

    import numba

    def jit(function: Any) -> Any:
        # machine code cached on disk where numba finds a writable place, else compiled
        # once per process (numba refuses cache=True at decoration when it finds none)
        try:
            return numba.njit(cache=True, nogil=True)(function)
        except RuntimeError:
            return numba.njit(nogil=True)(function)

    @jit
    def segment_sum(x: Any, keep: Any, decay: float, out: Any) -> None:
        rows, steps = x.shape
        for r in range(rows):
            total = 0.0  # float64, whatever x's dtype
            for t in range(steps - 1, -1, -1):
                if not keep[r, t]:
                    total = 0.0
                total = x[r, t] + decay * total
                out[r, t] = total

    @jit
    def gae(
        reward: Any,
        value: Any,
        next_value: Any,
        terminated: Any,
        done: Any,
        gamma: float,
        decay: float,
        advantage: Any,
        target: Any,
    ) -> None:
        rows, steps = reward.shape
        for r in range(rows):
            total = 0.0  # float64, whatever the inputs' dtype
            for t in range(steps - 1, -1, -1):
                if done[r, t]:
                    total = 0.0
                bootstrap = 0.0 if terminated[r, t] else gamma * next_value[r, t]
                total = reward[r, t] + bootstrap - value[r, t] + decay * total
                advantage[r, t] = total
                target[r, t] = total + value[r, t]

    @jit
    def all_finite(x: Any) -> bool:
        for i in range(x.shape[0]):  # noqa: SIM110 (numba compiles loops, not all(...))
            if not math.isfinite(x[i]):
                return False
        return True

    @jit
    def chunk(start: Any, length: int, sequence_id: Any, offset: Any) -> None:
        sequence = -1
        position = 0
        for i in range(start.shape[0]):
            position = 0 if start[i] else position + 1
            within = position % length if length > 0 else position
            if within == 0:
                sequence += 1
            sequence_id[i] = sequence
            offset[i] = within

    @jit
    def count_sequences(start: Any, offset: Any) -> tuple[int, int, int]:
        # (N, Lp, first bad step or -1); step 0 is a start whatever start[0] says
        sequences = 0
        longest = 0
        for i in range(start.shape[0]):
            if i == 0 or start[i]:
                sequences += 1
                expected = 0
            else:
                expected = offset[i - 1] + 1
            if offset[i] != expected:
                return sequences, longest, i
            longest = max(longest, offset[i] + 1)
        return sequences, longest, -1

    @jit
    def scatter_layout(start: Any, offset: Any, flat_index: Any, loss_mask: Any) -> None:
        # every position is written: real steps, then each row's padding as 0 / False
        row = -1
        for i in range(start.shape[0]):
            if i == 0 or start[i]:
                if row >= 0:
                    flat_index[row, offset[i - 1] + 1 :] = 0
                    loss_mask[row, offset[i - 1] + 1 :] = False
                row += 1
            flat_index[row, offset[i]] = i
            loss_mask[row, offset[i]] = True
        if row >= 0:
            last = offset[start.shape[0] - 1] + 1
            flat_index[row, last:] = 0
            loss_mask[row, last:] = False

    return SimpleNamespace(
        segment_sum=segment_sum,
        gae=gae,
        all_finite=all_finite,
        chunk=chunk,
        count_sequences=count_sequences,
        scatter_layout=scatter_layout,
    )


def segment_sum_rows(x: torch.Tensor, keep: torch.Tensor, decay: float) -> torch.Tensor:
    """``y[:, t] = x[:, t] + decay * keep[:, t] * y[:, t + 1]``, ``y[:, T] = 0``, in float64.

    Args:
        x: ``[R, T]`` float32 or float64 on the CPU.
        keep: ``[R, T]`` bool.
        decay: a real number in ``[0, 1]``.

    Returns:
        ``[R, T]``, ``x``'s dtype (the sums run in float64, as the torch path's).
    """
    x = x.contiguous()
    out = torch.empty_like(x)
    _kernels().segment_sum(x.numpy(), keep.contiguous().numpy(), float(decay), out.numpy())
    return out


def gae_rows(
    reward: torch.Tensor,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    terminated: torch.Tensor,
    done: torch.Tensor,
    *,
    gamma: float,
    lmbda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``gae_unchecked`` over ``[R, T]`` rows (time last) in one pass, sums in float64.

    Args:
        reward: ``[R, T]`` float32 or float64 on the CPU.
        state_value: ``[R, T]`` float32 or float64.
        next_state_value: ``[R, T]`` float32 or float64.
        terminated: ``[R, T]`` bool.
        done: ``[R, T]`` bool, where the sum stops.
        gamma: discount in ``[0, 1]``.
        lmbda: GAE lambda in ``[0, 1]``.

    Returns:
        ``(advantage, value_target)``, each ``[R, T]`` in ``state_value``'s dtype.
    """
    advantage = torch.empty(reward.shape, dtype=state_value.dtype)
    target = torch.empty_like(advantage)
    _kernels().gae(
        *(x.contiguous().numpy() for x in (reward, state_value, next_state_value)),
        terminated.contiguous().numpy(),
        done.contiguous().numpy(),
        float(gamma),
        float(gamma * lmbda),
        advantage.numpy(),
        target.numpy(),
    )
    return advantage, target


def all_finite(x: torch.Tensor) -> bool:
    """Whether float32 or float64 CPU ``x`` (any shape) holds no NaN and no infinity."""
    return bool(_kernels().all_finite(x.reshape(-1).numpy()))


def chunk_flat(start: torch.Tensor, length: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``chunk_episodes_unchecked`` over flat ``[n]`` bool starts: ``(sequence_id, offset)``."""
    start = start.contiguous()
    sequence_id = torch.empty(start.shape, dtype=torch.int64)
    offset = torch.empty(start.shape, dtype=torch.int64)
    _kernels().chunk(start.numpy(), int(length or 0), sequence_id.numpy(), offset.numpy())
    return sequence_id, offset


def layout_flat(start: torch.Tensor, offset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``layout_from_starts`` over flat ``[n]`` bool starts and int64 offsets.

    Returns ``(flat_index, loss_mask)``, each ``[N, Lp]``; raises ``LookupError`` when an
    offset does not run 0, 1, ... from its start (the caller's torch path words the error).
    """
    start = start.contiguous()
    offset = offset.contiguous()
    kernels = _kernels()
    start_np, offset_np = start.numpy(), offset.numpy()
    sequences, longest, bad = kernels.count_sequences(start_np, offset_np)
    if bad >= 0:
        raise LookupError(bad)
    flat_index = torch.empty((sequences, longest), dtype=torch.int64)
    loss_mask = torch.empty((sequences, longest), dtype=torch.bool)
    kernels.scatter_layout(start_np, offset_np, flat_index.numpy(), loss_mask.numpy())
    return flat_index, loss_mask
