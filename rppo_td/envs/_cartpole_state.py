"""What ``CartPoleNoVelVectorEnv`` is given, checked whole before any of it is used.

Each function returns the parsed value or raises ``ValueError`` naming the argument, what was
expected and what was given, so that a refused call leaves the env as it was.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.utils import seeding

__all__ = ["SavedState", "bounds_of", "copies_state", "reset_rows", "saved_state", "seeds_of"]

LOW, HIGH = -0.05, 0.05  # CartPole's reset bounds of every state entry

# what set_state takes: the rows' states and step counts, each copy's generator, started
SavedState = tuple[np.ndarray, np.ndarray, list[np.random.Generator | None], bool]


def seeds_of(seed: Any, num_envs: int) -> list[int | None]:
    """``reset``'s ``seed`` as one entry per copy.

    None (each copy's generator goes on), ``s`` (copy ``i`` gets ``s + i``) or ``W`` entries
    of None or an int >= 0.
    """
    if seed is None:
        return [None] * num_envs
    if _is_int(seed):
        seed = [int(seed) + i for i in range(num_envs)]
    elif isinstance(seed, str | bytes) or not isinstance(seed, Iterable):
        raise ValueError(f"reset(seed=...): expected an int, W ints or None, got {seed!r}")
    seeds = list(seed)
    if len(seeds) != num_envs:
        raise ValueError(f"reset(seed=...): expected {num_envs} seeds, got {len(seeds)}")
    for one in seeds:
        if one is not None and not (_is_int(one) and int(one) >= 0):
            raise ValueError(
                f"reset(seed=...): every seed must be None or an int >= 0, got {one!r}"
            )
    return [None if one is None else int(one) for one in seeds]


def reset_rows(options: dict[str, Any], num_envs: int, started: bool) -> np.ndarray:
    """The copies a reset resets: ``options["reset_mask"]`` (``[W]`` bool), else all."""
    mask = options.get("reset_mask")
    if mask is None:
        return np.arange(num_envs)
    if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.shape != (num_envs,):
        got = f"{mask.dtype} {mask.shape}" if isinstance(mask, np.ndarray) else type(mask).__name__
        raise ValueError(
            f"reset options: 'reset_mask' must be a bool array ({num_envs},), got {got}"
        )
    if not started and not mask.all():
        raise ValueError(
            "reset options: the first reset must reset every copy (reset_mask all True)"
        )
    return np.flatnonzero(mask)


def bounds_of(options: dict[str, Any]) -> tuple[float, float]:
    """``options``' ``"low"`` and ``"high"`` (CartPole's ``-0.05`` and ``0.05`` by default)."""
    values = []
    for name, default in (("low", LOW), ("high", HIGH)):
        value = options.get(name, default)
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number) or isinstance(value, str | bytes):
            raise ValueError(f"reset options: {name!r} must be a finite number, got {value!r}")
        values.append(number)
    low, high = values
    if low > high:
        raise ValueError(f"reset options: expected low <= high, got {low} and {high}")
    return low, high


def saved_state(saved: Any, num_envs: int) -> SavedState:
    """``get_state()``'s dict, checked whole.

    ``W`` finite ``[4]`` float64 states, step counts >= 0, and a generator state for each copy
    (None only before the first reset).
    """
    if not isinstance(saved, dict):
        raise ValueError(f"saved CartPole state: expected a dict, got {type(saved).__name__}")
    missing = {"num_envs", "state", "elapsed", "generators", "started"} - set(saved)
    if missing:
        raise ValueError(f"saved CartPole state: missing {sorted(missing)}")
    if saved["num_envs"] != num_envs:
        raise ValueError(f"saved CartPole state: expected {num_envs} envs, got {saved['num_envs']}")
    state = np.asarray(saved["state"])
    if state.shape != (num_envs, 4) or state.dtype != np.float64 or not np.isfinite(state).all():
        raise ValueError(
            f"saved CartPole state: 'state' must be finite float64 ({num_envs}, 4), got "
            f"{state.dtype} {state.shape}"
        )
    elapsed = np.asarray(saved["elapsed"])
    if elapsed.shape != (num_envs,) or elapsed.dtype.kind not in "iu" or (elapsed < 0).any():
        raise ValueError(
            f"saved CartPole state: 'elapsed' must be ints >= 0 ({num_envs},), got "
            f"{elapsed.dtype} {elapsed.shape}"
        )
    started = saved["started"]
    if not isinstance(started, bool):
        raise ValueError(f"saved CartPole state: 'started' must be a bool, got {started!r}")
    bits = saved["generators"]
    if not isinstance(bits, list | tuple) or len(bits) != num_envs:
        raise ValueError(f"saved CartPole state: expected {num_envs} generator states")
    generators: list[np.random.Generator | None] = []
    for one in bits:
        if one is None:
            if started:
                raise ValueError("saved CartPole state: a started env needs every generator")
            generators.append(None)
            continue
        generator = seeding.np_random(0)[0]
        try:
            generator.bit_generator.state = one
        except (TypeError, ValueError, KeyError) as err:
            raise ValueError(
                f"saved CartPole state: a generator state is unusable ({err})"
            ) from None
        generators.append(generator)
    return state.copy(), elapsed.astype(np.int64), generators, started


def copies_state(
    envs: list[gym.Env], num_envs: int, max_episode_steps: int, sutton_barto_reward: bool
) -> dict[str, Any]:
    """``get_state()``'s dict for ``W`` separate checked copies of the same env, reset before."""
    if not isinstance(envs, list | tuple) or len(envs) != num_envs:
        raise ValueError(f"saved envs: expected {num_envs} envs, got {_count(envs)}")
    rows, elapsed, generators = [], [], []
    for env in envs:
        inner = getattr(env, "unwrapped", None)
        limit = _time_limit(env)
        if not isinstance(inner, CartPoleEnv) or limit is None:
            raise ValueError(f"saved envs: expected CartPole copies with a time limit, got {env}")
        if inner.state is None:
            raise ValueError("saved envs: a CartPole copy was never reset")
        if limit._max_episode_steps != max_episode_steps:
            raise ValueError(
                f"saved envs: their time limit is {limit._max_episode_steps} steps, this env's "
                f"{max_episode_steps}"
            )
        if bool(getattr(inner, "_sutton_barto_reward", False)) != sutton_barto_reward:
            raise ValueError("saved envs: their reward differs from this env's (sutton_barto)")
        rows.append(np.asarray(inner.state, dtype=np.float64))
        elapsed.append(int(limit._elapsed_steps or 0))
        generators.append(inner.np_random.bit_generator.state)
    return {
        "num_envs": num_envs,
        "state": np.stack(rows),
        "elapsed": np.array(elapsed, dtype=np.int64),
        "generators": generators,
        "started": True,
    }


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def _count(envs: Any) -> str:
    return str(len(envs)) if isinstance(envs, list | tuple) else type(envs).__name__


def _time_limit(env: gym.Env) -> gym.wrappers.TimeLimit | None:
    while not isinstance(env, gym.wrappers.TimeLimit):
        if not isinstance(env, gym.Wrapper):
            return None
        env = env.env
    return env
