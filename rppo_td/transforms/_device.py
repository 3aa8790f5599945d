"""DeviceMover: moves a tensordict, or some of its keys, to the training device."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import NestedKey, TensorDictBase

from rppo_td._validation import get_key
from rppo_td.transforms._base import RolloutTransform

__all__ = ["DeviceMover"]


class DeviceMover(RolloutTransform):
    """Moves a tensordict (all keys, or the ones named) to ``device``.

    Batch unchanged (a ``[W, T]`` rollout or ``[N, Lp]`` sequences). Towards CUDA from the CPU
    it pins host memory first and copies with ``non_blocking=True``, so the copy overlaps with
    host work; CUDA orders later kernels after it. With ``keys`` named, a new tensordict is
    returned whose other keys stay where they were (its own device is then None); without,
    ``tensordict.to(device)``. The input is not modified.

    Args:
        device: the target device.
        keys: optional keys to move; the rest are kept as they are.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"a": torch.zeros(2, 3)}, batch_size=[2, 3])
        >>> DeviceMover("cpu")(td)["a"].device
        device(type='cpu')
    """

    def __init__(
        self, device: torch.device | str, *, keys: Sequence[NestedKey] | None = None
    ) -> None:
        super().__init__()
        self.device = torch.device(device)
        self.move_keys = None if keys is None else list(keys)

    def _fast_path(self, source: torch.device | None) -> bool:
        return self.device.type == "cuda" and (source is None or source.type == "cpu")

    def _move(self, value: torch.Tensor) -> torch.Tensor:
        if value.device == self.device:
            return value
        if self._fast_path(value.device):
            return value.pin_memory().to(self.device, non_blocking=True)
        return value.to(self.device)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if self.move_keys is None:
            if self._fast_path(tensordict.device):
                return tensordict.pin_memory().to(self.device, non_blocking=True)
            return tensordict.to(self.device)
        out = tensordict.clone(recurse=False)
        out.clear_device_()
        for key in self.move_keys:
            out.set(key, self._move(get_key(tensordict, key)))
        return out

    def extra_repr(self) -> str:
        return f"device={self.device}, keys={self.move_keys}"
