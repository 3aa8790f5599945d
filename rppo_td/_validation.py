"""Entry checks shared by the functional layer and the transforms.

Every check raises ``ValueError`` or ``KeyError`` naming the offending key or argument, the
expected and the actual shape or dtype. None of them broadcasts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import NestedKey, TensorDictBase

__all__ = [
    "check_balance",
    "check_dtype",
    "check_finite",
    "check_floating",
    "check_sequence_length",
    "check_shape",
    "check_unit_interval",
    "get_key",
    "rollout_shape",
]


def _name(key: NestedKey | str) -> str:
    return repr(key)


def get_key(td: TensorDictBase, key: NestedKey, *, hint: str = "") -> torch.Tensor:
    """Returns ``td[key]`` or raises a ``KeyError`` naming the key and what is there."""
    value = td.get(key, None)
    if value is None:
        leaves = sorted(str(k) for k in td.keys(include_nested=True, leaves_only=True))
        extra = f" {hint}" if hint else ""
        raise KeyError(f"key {_name(key)} is missing from the tensordict (has {leaves}).{extra}")
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"key {_name(key)} must hold a tensor, got {type(value).__name__}")
    return value


def rollout_shape(td: TensorDictBase, who: str) -> tuple[int, int]:
    """Returns ``(W, T)`` of a ``[W, T]`` rollout or raises a ``ValueError``."""
    if td.batch_dims != 2:
        raise ValueError(
            f"{who} expects a rollout with batch dims [W, T] (worker, time), got batch size "
            f"{list(td.batch_size)}; use td.unsqueeze(0) for a single worker"
        )
    w, t = td.batch_size
    return int(w), int(t)


def check_shape(name: NestedKey | str, x: torch.Tensor, expected: Sequence[int]) -> None:
    """Raises a ``ValueError`` unless ``x.shape == expected`` exactly (no broadcasting)."""
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{_name(name)} must have shape {list(expected)}, got {list(x.shape)}")


def check_dtype(name: NestedKey | str, x: torch.Tensor, dtype: torch.dtype) -> None:
    """Raises a ``ValueError`` unless ``x.dtype == dtype``."""
    if x.dtype != dtype:
        raise ValueError(f"{_name(name)} must have dtype {dtype}, got {x.dtype}")


def check_floating(name: NestedKey | str, x: torch.Tensor) -> None:
    """Raises a ``ValueError`` unless ``x`` is a floating-point tensor."""
    if not x.is_floating_point():
        raise ValueError(f"{_name(name)} must be a floating-point tensor, got {x.dtype}")


def check_finite(named: dict[NestedKey, torch.Tensor]) -> None:
    """Raises a ``ValueError`` naming every tensor that holds a NaN or an infinity.

    One device synchronisation for all tensors together.
    """
    if not named:
        return
    # A NaN or an infinity anywhere makes the float64 sum non-finite, and the sums read each
    # tensor once; only then does the per-tensor check run, to name the culprits (it also
    # clears float64 inputs whose finite values overflowed the sum).
    total = torch.stack([x.sum(dtype=torch.float64) for x in named.values()]).sum()
    if bool(torch.isfinite(total)):
        return
    flags = torch.stack([torch.isfinite(x).all() for x in named.values()]).tolist()
    bad = [_name(name) for name, ok in zip(named, flags, strict=True) if not ok]
    if bad:
        raise ValueError(f"{', '.join(bad)} must be finite, found NaN or inf")


def check_unit_interval(name: str, value: float) -> None:
    """Raises a ``ValueError`` unless ``0 <= value <= 1`` (``gamma``, ``lmbda``)."""
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


def check_sequence_length(value: object) -> None:
    """Raises a ``ValueError`` unless ``value`` is an int ``>= 1`` or None."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"sequence_length must be an int >= 1 or None, got {value!r}")


def check_balance(value: object) -> None:
    """Raises a ``ValueError`` unless ``value`` is ``"steps"`` or ``"sequences"``."""
    if value not in ("steps", "sequences"):
        raise ValueError(f"balance must be 'steps' or 'sequences', got {value!r}")
