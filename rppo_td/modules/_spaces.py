"""Observation spaces as lists of tensordict leaves, and numpy batches as tensors."""

from __future__ import annotations

from typing import Any, Literal

import gymnasium as gym
import numpy as np
import torch
from tensordict import NestedKey, TensorDict

__all__ = [
    "ImageLayout",
    "ObservationLeaf",
    "check_image_layout",
    "image_channels_last",
    "image_shaped",
    "is_image",
    "observation_leaves",
    "observation_to_tensordict",
]

OBSERVATION_KEY = "observation"

ObservationLeaf = tuple[NestedKey, gym.Space]
#: how a ``[H, W, C]`` / ``[C, H, W]`` image is read: from its shape, or as given
ImageLayout = Literal["auto", "channels_first", "channels_last"]
IMAGE_LAYOUTS = ("auto", "channels_first", "channels_last")
_CHANNELS = (1, 3, 4)
_LEAF_SPACES = (
    gym.spaces.Box,
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
)


def observation_leaves(
    space: gym.Space, prefix: NestedKey = OBSERVATION_KEY
) -> list[ObservationLeaf]:
    """Flattens an observation space into ``(key, leaf space)`` pairs.

    ``Box``, ``Discrete``, ``MultiDiscrete`` and ``MultiBinary`` spaces are one leaf under
    ``"observation"``; ``Dict`` spaces nest their keys (``("observation", "position")``) and
    ``Tuple`` spaces their indices (``("observation", "0")``), recursively.

    Args:
        space: a gymnasium observation space.
        prefix: the key of this space.

    Returns:
        The leaves in a fixed order (the order features are concatenated in).

    Raises:
        ValueError: a space type this library does not encode (e.g. ``Text``, ``Graph``).

    Example:
        >>> space = gym.spaces.Dict({"a": gym.spaces.Discrete(3), "b": gym.spaces.Box(0, 1, (2,))})
        >>> [key for key, _ in observation_leaves(space)]
        [('observation', 'a'), ('observation', 'b')]
    """
    base = prefix if isinstance(prefix, tuple) else (prefix,)
    if isinstance(space, _LEAF_SPACES):
        _check_pixels(space, prefix)
        return [(prefix, space)]
    if isinstance(space, gym.spaces.Dict):
        for name in space.spaces:
            if not isinstance(name, str):
                raise ValueError(
                    f"observation {prefix!r}: a Dict space's keys name tensordict keys and "
                    f"must be str, got {name!r} ({type(name).__name__})"
                )
        return [
            leaf
            for name, sub in space.spaces.items()
            for leaf in observation_leaves(sub, (*base, name))
        ]
    if isinstance(space, gym.spaces.Tuple):
        return [
            leaf
            for i, sub in enumerate(space.spaces)
            for leaf in observation_leaves(sub, (*base, str(i)))
        ]
    raise ValueError(
        f"observation space {space} (key {prefix!r}) is not supported: use Box, Discrete, "
        "MultiDiscrete, MultiBinary, or Tuple/Dict spaces of those"
    )


def is_image(space: gym.Space) -> bool:
    """True for a ``uint8`` ``Box`` image: ``HxWxC`` or ``CxHxW`` with ``C`` in 1, 3, 4.

    Or ``HxW``: grayscale, as gymnasium's ``AtariPreprocessing`` returns it.
    """
    if not isinstance(space, gym.spaces.Box) or space.dtype != np.uint8:
        return False
    return len(space.shape) == 2 or image_shaped(space)


def image_shaped(space: gym.Space) -> bool:
    """True for a ``Box`` of any dtype shaped ``HxWxC`` or ``CxHxW`` with ``C`` in 1, 3, 4.

    Only a ``uint8`` one is an image to the agent (``is_image``): a float one reaches the
    MLP flattened, which ``rppo-train`` warns of.
    """
    if not isinstance(space, gym.spaces.Box):
        return False
    shape = space.shape
    return len(shape) == 3 and (shape[-1] in _CHANNELS or shape[0] in _CHANNELS)


def check_image_layout(layout: object) -> None:
    """Raises a ``ValueError`` unless ``layout`` is one of ``IMAGE_LAYOUTS``."""
    if layout not in IMAGE_LAYOUTS:
        raise ValueError(f"image_layout must be one of {list(IMAGE_LAYOUTS)}, got {layout!r}")


def image_channels_last(shape: tuple[int, ...], layout: ImageLayout, key: NestedKey) -> bool:
    """Whether an image of ``shape`` (``is_image``) is ``[H, W, C]`` (True) or ``[C, H, W]``.

    ``[H, W]`` (grayscale) reads as one channel last. With ``layout="auto"`` the end that is
    1, 3 or 4 is the channel axis; a shape where both ends are (``[3, 4, 4]``: a 4x4 RGB
    image channels first, or a 3x4 one with 4 channels last) is refused by name rather than
    guessed, and ``layout`` must then say which. A layout whose channel axis is not 1, 3 or 4
    is refused too.

    Raises:
        ValueError: an ambiguous shape under ``"auto"``, an unknown ``layout``, or a channel
            axis of another size.

    Example:
        >>> image_channels_last((84, 84, 3), "auto", "observation")
        True
        >>> image_channels_last((3, 4, 4), "channels_first", "observation")
        False
    """
    check_image_layout(layout)
    if len(shape) == 2:
        return True
    first, last = shape[0] in _CHANNELS, shape[-1] in _CHANNELS
    if layout == "auto":
        if first and last:
            raise ValueError(
                f"observation {key!r}: the uint8 image shape {tuple(shape)} reads either way, "
                f"[C, H, W] with C = {shape[0]} or [H, W, C] with C = {shape[-1]}; set "
                "image_layout='channels_first' or 'channels_last' (--image-layout of rppo-train, "
                "or of rppo-eval for a run saved before the setting existed: channels_last)"
            )
        return last
    channels = shape[-1] if layout == "channels_last" else shape[0]
    if channels not in _CHANNELS:
        raise ValueError(
            f"observation {key!r}: image_layout={layout!r} reads the uint8 image shape "
            f"{tuple(shape)} with C = {channels}, but images have 1, 3 or 4 channels"
        )
    return layout == "channels_last"


def _check_pixels(space: gym.Space, key: NestedKey) -> None:
    """Refuses a ``uint8`` ``Box`` of 3 or more dims that is not an image (``is_image``).

    Fed to an MLP it would train on raw 0-255 values; 1-D ``uint8`` boxes stay vectors.
    """
    if (
        isinstance(space, gym.spaces.Box)
        and space.dtype == np.uint8
        and len(space.shape) >= 3
        and not is_image(space)
    ):
        raise ValueError(
            f"observation {key!r}: a uint8 Box of shape {space.shape} is not an image this "
            "library reads; images are [H, W], [H, W, C] or [C, H, W] with C in 1, 3, 4 "
            "(stack frames along C, at most 4; give other data a float Box or MultiDiscrete)"
        )


def _leaf_dtype(space: gym.Space) -> torch.dtype:
    if isinstance(space, gym.spaces.Box):
        return torch.uint8 if is_image(space) else torch.float32
    if isinstance(space, gym.spaces.MultiBinary):
        return torch.float32
    return torch.int64


def _pick(obs: Any, key: NestedKey) -> Any:
    parts = key[1:] if isinstance(key, tuple) else ()
    for part in parts:
        obs = obs[part] if isinstance(obs, dict) else obs[int(part)]
    return obs


def observation_to_tensordict(
    obs: Any, leaves: list[ObservationLeaf], batch_size: tuple[int, ...]
) -> TensorDict:
    """Converts a (batched) gymnasium observation to a tensordict of its leaves.

    Args:
        obs: numpy array, or dict/tuple of arrays, each with ``batch_size`` leading dims.
        leaves: from ``observation_leaves``.
        batch_size: e.g. ``(W,)`` for a vector env's batch.

    Returns:
        A tensordict of ``batch_size`` holding every leaf key: Box as float32 (images as
        uint8), Discrete/MultiDiscrete as int64, MultiBinary as float32.
    """
    out = TensorDict(batch_size=batch_size)
    for key, space in leaves:
        value = torch.as_tensor(np.asarray(_pick(obs, key)), dtype=_leaf_dtype(space))
        out.set(key, value)
    return out
