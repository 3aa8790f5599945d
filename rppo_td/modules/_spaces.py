"""Observation spaces as lists of tensordict leaves, and numpy batches as tensors."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import NestedKey, TensorDict

__all__ = ["ObservationLeaf", "is_image", "observation_leaves", "observation_to_tensordict"]

OBSERVATION_KEY = "observation"

ObservationLeaf = tuple[NestedKey, gym.Space]
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
        return [
            leaf
            for name, sub in space.spaces.items()
            for leaf in observation_leaves(sub, (*base, str(name)))
        ]
    if isinstance(space, gym.spaces.Tuple):
        return [
            leaf
            for i, sub in enumerate(space.spaces)
            for leaf in observation_leaves(sub, (*base, str(i)))
        ]
    raise ValueError(
        f"observation space {space} is not supported: use Box, Discrete, MultiDiscrete, "
        "MultiBinary, or Tuple/Dict spaces of those"
    )


def is_image(space: gym.Space) -> bool:
    """True for a ``uint8`` ``Box`` image: ``HxWxC`` or ``CxHxW`` with ``C`` in 1, 3, 4.

    Or ``HxW``: grayscale, as gymnasium's ``AtariPreprocessing`` returns it.
    """
    if not isinstance(space, gym.spaces.Box) or space.dtype != np.uint8:
        return False
    if len(space.shape) == 2:
        return True
    if len(space.shape) != 3:
        return False
    return space.shape[-1] in (1, 3, 4) or space.shape[0] in (1, 3, 4)


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
