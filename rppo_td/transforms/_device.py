"""DeviceMover: moves a tensordict, or some of its keys, to the training device."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import NestedKey, TensorDictBase

from rppo_td._lazy import clear_device, lazy_on_device, shallow_copy
from rppo_td._validation import check_key_list, first_line, get_key
from rppo_td.transforms._base import RolloutTransform

__all__ = ["DeviceMover"]


class DeviceMover(RolloutTransform):
    """Moves a tensordict (all keys, or the ones named) to ``device``.

    Batch unchanged (a ``[W, T]`` rollout or ``[N, Lp]`` sequences). Towards CUDA from the CPU
    it pins host memory first and copies with ``non_blocking=True``, so the copy overlaps with
    host work; CUDA orders later kernels after it. With ``keys`` named, a new tensordict is
    returned whose other keys stay where they were (its own device is None where a key moved
    to another device); without, ``tensordict.to(device)``. The input is not modified.
    ``SequencePadder``'s output stays lazy where its leaves need not move: a leaf not read yet
    is gathered when first read, once (on the same device, or one of the other keys).

    Args:
        device: the target device.
        keys: optional sequence of keys to move (a list, even for one key: a bare ``str`` is
            refused with a ``TypeError``); the rest are kept as they are. Each must hold a
            tensor. They are the ``in_keys`` and ``out_keys`` (empty: every key).

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
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise ValueError(f"device {device!r} is not a torch device: {error}") from None
        _check_available(self.device)
        self.move_keys = None if keys is None else check_key_list("keys", keys)
        moved = [] if self.move_keys is None else list(self.move_keys)
        self._list_keys(moved, list(moved))

    def set_keys(self, **kwargs: NestedKey) -> DeviceMover:
        """Refused: DeviceMover reads no ``RolloutKeys``; it moves the ``keys`` it was given.

        Any keyword is a ``ValueError`` (as TorchRL's ``set_keys`` refuses names it does not
        know); build another ``DeviceMover(device, keys=[...])`` to move other keys.
        """
        if kwargs:
            raise ValueError(
                f"DeviceMover.set_keys got {sorted(kwargs)}, but DeviceMover has no named keys: "
                f"it moves {'every key' if self.move_keys is None else self.move_keys}; build "
                "DeviceMover(device, keys=[...]) to move others"
            )
        return self

    def _rename_hint(self) -> str:
        return "build DeviceMover(device, keys=[...]) to move other keys"

    def _fast_path(self, source: torch.device | None) -> bool:
        return self.device.type == "cuda" and (source is None or source.type == "cpu")

    def _move(self, value: torch.Tensor) -> torch.Tensor:
        if value.device == self.device:
            return value
        if self._fast_path(value.device):
            return value.pin_memory().to(self.device, non_blocking=True)
        return value.to(self.device)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        # a padder's output stays lazy (its leaves gathered when first read) wherever nothing
        # has to move: the copies below share its pending leaves
        if self.move_keys is None:
            if tensordict.device == self.device:
                return shallow_copy(tensordict)
            lazy = lazy_on_device(tensordict, self.device)  # device None, leaves all there
            if lazy is not None:
                return lazy
            if self._fast_path(tensordict.device):
                return tensordict.pin_memory().to(self.device, non_blocking=True)
            return tensordict.to(self.device)
        moved = {key: self._move(get_key(tensordict, key)) for key in self.move_keys}
        out = shallow_copy(tensordict)
        if any(value.device != tensordict.device for value in moved.values()):
            clear_device(out)  # leaves on two devices now
        for key, value in moved.items():
            out.set(key, value)
        return out

    def _repr_args(self) -> str:
        return f"device={self.device}"


def _check_available(device: torch.device) -> None:
    """Raises a ``ValueError`` for a device this machine does not have (CUDA, MPS, ...)."""
    if device.type in ("cpu", "meta"):
        return
    if device.type != "cuda":
        # no availability call common to every backend: an empty tensor there tells
        try:
            torch.empty(0, device=device)
        except (RuntimeError, AssertionError, NotImplementedError) as err:
            # the first sentence: torch's dispatcher lists every backend after it
            reason = first_line(err, sentence=True)
            raise ValueError(f"device {str(device)!r} is not available: {reason}") from err
        return
    if not torch.cuda.is_available():
        raise ValueError(
            f"device {str(device)!r} is not available: torch.cuda.is_available() is False"
        )
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(
            f"device {str(device)!r} is not available: this machine has "
            f"{torch.cuda.device_count()} CUDA device(s)"
        )
