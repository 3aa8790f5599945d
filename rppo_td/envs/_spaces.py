"""Env spaces in the form the agent is built from, and the wrapper that converts to it.

The agent samples discrete actions from 0 and one-hot encodes discrete observations from 0,
with flat (1-D) action vectors. ``canonical_observation_space`` and
``canonical_action_space`` map an env's spaces to that form, or refuse a space the agent
cannot use, naming the env; ``CanonicalSpaces`` converts the values both ways.

| env space | the agent sees | the env receives / the agent gets |
|---|---|---|
| ``Discrete(n, start=s)`` | ``Discrete(n)`` | ``action + s`` / ``obs - s`` |
| ``MultiDiscrete(nvec, start)`` | ``MultiDiscrete(nvec.ravel())`` | ``+ start`` / ``- start`` |
| ``MultiBinary(n)`` action (``n`` int or tuple) | ``MultiDiscrete([2] * size)`` | reshaped, int8 |
| float ``Box`` action of ndim != 1 | the flat ``Box`` | reshaped |

Multi-dimensional ``MultiDiscrete`` spaces are flattened and the values reshaped both ways.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["CanonicalSpaces", "canonical_action_space", "canonical_observation_space"]

_LEAVES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)


def _obs_space(space: Any, label: str, env_id: str) -> gym.Space:
    """The canonical form of one (sub)space; the same object where nothing changes."""
    if isinstance(space, gym.spaces.Dict):
        subs = [(k, _obs_space(s, f"{label}[{k!r}]", env_id)) for k, s in space.spaces.items()]
        if all(new is space.spaces[k] for k, new in subs):
            return space
        return gym.spaces.Dict(subs)
    if isinstance(space, gym.spaces.Tuple):
        items = [_obs_space(s, f"{label}[{i}]", env_id) for i, s in enumerate(space.spaces)]
        if all(new is old for new, old in zip(items, space.spaces, strict=True)):
            return space
        return gym.spaces.Tuple(items)
    if not isinstance(space, _LEAVES):
        raise ValueError(
            f"env {env_id!r}: {label} space {space} is not supported: use Box, Discrete, "
            "MultiDiscrete, MultiBinary, or Dict/Tuple spaces of those"
        )
    if int(np.prod(space.shape or ())) == 0:
        raise ValueError(
            f"env {env_id!r}: {label} space {space} has no entries (shape {space.shape}); "
            "drop it from the observation space"
        )
    if isinstance(space, gym.spaces.Discrete) and int(space.start) != 0:
        return gym.spaces.Discrete(int(space.n))
    if isinstance(space, gym.spaces.MultiDiscrete) and (space.start.any() or space.nvec.ndim != 1):
        return gym.spaces.MultiDiscrete(space.nvec.reshape(-1), dtype=space.dtype)
    return space


def canonical_observation_space(space: gym.Space, *, env_id: str) -> gym.Space:
    """``space`` with every ``Discrete``/``MultiDiscrete`` leaf starting at 0, and 1-D.

    Args:
        space: an env's observation space.
        env_id: the id named in errors.

    Returns:
        ``space`` itself when nothing changes, else a new space.

    Raises:
        ValueError: an unsupported leaf (``Text``, ``Graph``, ``Sequence``, ...), a zero-size
            leaf, or no leaves at all (an empty ``Dict``/``Tuple``).

    Example:
        >>> canonical_observation_space(gym.spaces.Discrete(3, start=-1), env_id="E")
        Discrete(3)
    """
    out = _obs_space(space, "observation", env_id)
    if not _has_leaf(out):
        raise ValueError(f"env {env_id!r}: observation space {space} has no entries")
    return out


def _has_leaf(space: gym.Space) -> bool:
    """False for a ``Dict``/``Tuple`` with no leaves below it (leaves are never empty)."""
    if isinstance(space, gym.spaces.Dict):
        return any(_has_leaf(s) for s in space.spaces.values())
    if isinstance(space, gym.spaces.Tuple):
        return any(_has_leaf(s) for s in space.spaces)
    return True


def canonical_action_space(space: gym.Space, *, env_id: str) -> gym.Space:
    """The action space the agent samples from: start-0 discrete spaces, flat vectors.

    Args:
        space: an env's action space.
        env_id: the id named in errors.

    Returns:
        ``Discrete(n)``, a 1-D ``MultiDiscrete`` or a 1-D float ``Box`` (``space`` itself when
        it already is one).

    Raises:
        ValueError: an integer ``Box``, a zero-size space, or any other space type.

    Example:
        >>> canonical_action_space(gym.spaces.MultiBinary((2, 2)), env_id="E")
        MultiDiscrete([2 2 2 2])
    """
    prefix = f"env {env_id!r}: action space {space}"
    if isinstance(space, gym.spaces.Discrete):
        return space if int(space.start) == 0 else gym.spaces.Discrete(int(space.n))
    if not isinstance(space, gym.spaces.MultiDiscrete | gym.spaces.MultiBinary | gym.spaces.Box):
        raise ValueError(
            f"{prefix} is not supported: use Discrete, MultiDiscrete, MultiBinary or a "
            "floating-point Box"
        )
    if int(np.prod(space.shape)) == 0:
        raise ValueError(f"{prefix} has no entries (shape {space.shape})")
    if isinstance(space, gym.spaces.MultiDiscrete):
        if not space.start.any() and space.nvec.ndim == 1:
            return space
        return gym.spaces.MultiDiscrete(space.nvec.reshape(-1), dtype=space.dtype)
    if isinstance(space, gym.spaces.MultiBinary):
        return gym.spaces.MultiDiscrete(np.full(int(np.prod(space.shape)), 2))
    if space.dtype.kind != "f":
        raise ValueError(
            f"{prefix} has dtype {space.dtype}: Box actions must be floating point (the policy "
            "is a Gaussian); use MultiDiscrete for integer actions"
        )
    if len(space.shape) == 1:
        return space
    return gym.spaces.Box(space.low.reshape(-1), space.high.reshape(-1), dtype=space.dtype)


def _to_canonical(obs: Any, space: gym.Space, canonical: Any) -> Any:
    """One env observation -> the form of ``canonical`` (a space of the same structure)."""
    if canonical is space:
        return obs
    if isinstance(space, gym.spaces.Dict):
        subs = canonical.spaces
        return {k: _to_canonical(obs[k], s, subs[k]) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        parts = zip(obs, space.spaces, canonical.spaces, strict=True)
        return tuple(_to_canonical(o, s, c) for o, s, c in parts)
    if isinstance(space, gym.spaces.Discrete):
        return np.int64(obs) - np.int64(space.start)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return (np.asarray(obs, dtype=space.dtype) - space.start).reshape(-1)
    return obs


def _from_canonical(action: Any, space: gym.Space, canonical: gym.Space) -> Any:
    """One canonical action -> the env's action space."""
    if canonical is space:
        return action
    if isinstance(space, gym.spaces.Discrete):
        return np.int64(action) + np.int64(space.start)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return np.asarray(action, dtype=space.dtype).reshape(space.shape) + space.start
    return np.asarray(action, dtype=space.dtype).reshape(space.shape)


class CanonicalSpaces(gym.Wrapper):
    """Shows ``env`` through canonical spaces: actions shifted/reshaped in, observations out.

    Spaces as ``canonical_observation_space``/``canonical_action_space``; the final
    observation of an episode goes through the same conversion as every other.

    Args:
        env: the env.
        env_id: the id named in errors.

    Example:
        >>> from gymnasium.envs.classic_control.cartpole import CartPoleEnv
        >>> CanonicalSpaces(CartPoleEnv(), "CartPole-v1").action_space
        Discrete(2)
    """

    def __init__(self, env: gym.Env, env_id: str) -> None:
        super().__init__(env)
        self._env_obs_space = env.observation_space
        self._env_action_space = env.action_space
        self.observation_space = canonical_observation_space(env.observation_space, env_id=env_id)
        self.action_space = canonical_action_space(env.action_space, env_id=env_id)

    @property
    def changes_spaces(self) -> bool:
        """False when both spaces are already canonical (the wrapper is then not needed)."""
        return (
            self.observation_space is not self._env_obs_space
            or self.action_space is not self._env_action_space
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """``env.reset`` with the observation converted."""
        obs, info = self.env.reset(seed=seed, options=options)
        return _to_canonical(obs, self._env_obs_space, self.observation_space), info

    def step(self, action: Any):
        """``env.step`` of the converted action, with the observation converted."""
        env_action = _from_canonical(action, self._env_action_space, self.action_space)
        obs, reward, terminated, truncated, info = self.env.step(env_action)
        obs = _to_canonical(obs, self._env_obs_space, self.observation_space)
        return obs, reward, terminated, truncated, info
