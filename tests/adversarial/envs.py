"""Faulty and unusual gymnasium envs for the adversarial pass (registered on import).

Pass them to the trainer as ``tests.adversarial.envs:adv/<Name>-v0`` with the repo on the
Python path. An env that receives an action outside its action space writes a marker file into
``$ADV_MARKER_DIR`` (so that even a swallowed exception is seen) and raises.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class InvalidActionError(Exception):
    """Raised by an env given an action outside its space (not a ValueError on purpose)."""


def _mark(name: str, text: str) -> None:
    folder = os.environ.get("ADV_MARKER_DIR")
    if folder:
        Path(folder, f"{name}.{os.getpid()}.{time.monotonic_ns()}").write_text(text)


class Toy(gym.Env):
    """A tiny memory task: observe a cue at t=0 then noise; episodes of 4..12 steps.

    Terminates at a random length (so both terminations and, with the TimeLimit of the
    registration, truncations happen). Reward 1 for action 0 on even steps, else 0.
    """

    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0
        self.length = 8
        self.total_steps = 0

    def _obs(self):
        return self.np_random.uniform(-1, 1, 2).astype(np.float32)

    def _check_action(self, action) -> None:
        if not self.action_space.contains(action):
            _mark("invalid_action", f"{type(self).__name__}: {action!r} not in {self.action_space}")
            raise InvalidActionError(f"action {action!r} is outside {self.action_space}")

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.length = int(self.np_random.integers(4, 13))
        return self._obs(), {}

    def _reward(self, action) -> float:
        a = np.asarray(action).ravel()
        return float(a[0] == self.action_space_first() and self.t % 2 == 0)

    def action_space_first(self):
        space = self.action_space
        if isinstance(space, spaces.Discrete):
            return space.start
        if isinstance(space, spaces.MultiDiscrete):
            return space.start[0]
        return 0

    def step(self, action):
        self._check_action(action)
        self.total_steps += 1
        reward = self._reward(action)
        self.t += 1
        terminated = self.t >= self.length
        return self._obs(), reward, terminated, False, {}


class RaiseAt(Toy):
    """Raises ``RuntimeError`` at its ``$ADV_RAISE_AT``-th step (unset: never)."""

    def step(self, action):
        at = os.environ.get("ADV_RAISE_AT")
        if at and self.total_steps + 1 >= int(at):
            raise RuntimeError(f"adversarial env failure at step {self.total_steps + 1}")
        return super().step(action)


class NaNObs(Toy):
    """Observations turn NaN after 30 steps."""

    def _obs(self):
        obs = super()._obs()
        if self.total_steps >= 30:
            obs[0] = np.nan
        return obs


class InfReward(Toy):
    """Reward +inf after 30 steps."""

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return obs, (np.inf if self.total_steps >= 30 else r), term, trunc, info


class WrongShapeObs(Toy):
    """Observations of shape (3,) for a (2,) space, from the start."""

    def _obs(self):
        return self.np_random.uniform(-1, 1, 3).astype(np.float32)


class WrongShapeLater(Toy):
    """Observations of shape (3,) after 30 steps."""

    def _obs(self):
        n = 3 if self.total_steps >= 30 else 2
        return self.np_random.uniform(-1, 1, n).astype(np.float32)


class Float64Obs(Toy):
    """float64 observations in a float32 Box (harmless: a cast)."""

    def _obs(self):
        return self.np_random.uniform(-1, 1, 2)


class StringObs(Toy):
    """Observations that are strings."""

    def _obs(self):
        return np.array(["a", "b"])


class ArrayReward(Toy):
    """A reward of shape (2,)."""

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return obs, np.array([r, r + 1.0]), term, trunc, info


class ZeroDimReward(Toy):
    """A 0-d numpy array reward (valid)."""

    def step(self, action):
        obs, r, term, trunc, info = super().step(action)
        return obs, np.array(r), term, trunc, info


class NoneReward(Toy):
    """A reward of None."""

    def step(self, action):
        obs, _r, term, trunc, info = super().step(action)
        return obs, None, term, trunc, info


class OldAPI(Toy):
    """gym < 0.26: ``reset`` returns the observation, ``step`` a 4-tuple."""

    def reset(self, *, seed=None, options=None):
        obs, _ = super().reset(seed=seed, options=options)
        return obs

    def step(self, action):
        obs, r, term, _trunc, info = super().step(action)
        return obs, r, term, info


class MultiDiscreteStart(Toy):
    """MultiDiscrete actions with a start ``[1, -2]`` (actions 1..3 and -2..-1)."""

    def __init__(self) -> None:
        super().__init__()
        self.action_space = spaces.MultiDiscrete([3, 2], start=[1, -2])


class DiscreteStart(Toy):
    """Discrete actions ``{-1, 0, 1}`` (``start=-1``)."""

    def __init__(self) -> None:
        super().__init__()
        self.action_space = spaces.Discrete(3, start=-1)


class DiscreteObsStart(Toy):
    """Discrete observations ``{3, ..., 7}`` (``start=3``)."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.Discrete(5, start=3)

    def _obs(self):
        return int(self.np_random.integers(3, 8))


class MultiDiscreteObsStart(Toy):
    """MultiDiscrete observations with a start ``[2, -1]``."""

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = spaces.MultiDiscrete([3, 4], start=[2, -1])

    def _obs(self):
        return np.array(
            [self.np_random.integers(2, 5), self.np_random.integers(-1, 3)], dtype=np.int64
        )


class BoxActionOffset(Toy):
    """Box actions in ``[5, 6]``: the trainer must clip into the space."""

    def __init__(self) -> None:
        super().__init__()
        self.action_space = spaces.Box(5.0, 6.0, (1,), np.float32)

    def _check_action(self, action) -> None:
        a = np.asarray(action, dtype=np.float32)
        if a.shape != (1,) or not np.all((a >= 5.0) & (a <= 6.0)):
            _mark("invalid_action", f"Box action {action!r} outside [5, 6]")
            raise InvalidActionError(f"action {action!r} outside [5, 6]")

    def action_space_first(self):
        return 5.0


class Unpicklable(Toy):
    """Holds a lambda and a lock: cannot be pickled."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.fn = lambda: 0


def _register(name: str, cls: type, max_steps: int | None = 10) -> None:
    env_id = f"adv/{name}-v0"
    if env_id not in gym.registry:
        gym.register(
            id=env_id, entry_point=f"{__name__}:{cls.__name__}", max_episode_steps=max_steps
        )


for _name, _cls in [
    ("Toy", Toy),
    ("RaiseAt", RaiseAt),
    ("NaNObs", NaNObs),
    ("InfReward", InfReward),
    ("WrongShapeObs", WrongShapeObs),
    ("WrongShapeLater", WrongShapeLater),
    ("Float64Obs", Float64Obs),
    ("StringObs", StringObs),
    ("ArrayReward", ArrayReward),
    ("ZeroDimReward", ZeroDimReward),
    ("NoneReward", NoneReward),
    ("OldAPI", OldAPI),
    ("MultiDiscreteStart", MultiDiscreteStart),
    ("DiscreteStart", DiscreteStart),
    ("DiscreteObsStart", DiscreteObsStart),
    ("MultiDiscreteObsStart", MultiDiscreteObsStart),
    ("BoxActionOffset", BoxActionOffset),
    ("Unpicklable", Unpicklable),
]:
    _register(_name, _cls)
