"""Observation masks: keep some entries of a flat Box observation (hide the velocities)."""

from __future__ import annotations

from typing import ClassVar

import gymnasium as gym
import numpy as np

__all__ = ["EntryMask"]


class EntryMask(gym.ObservationWrapper):
    """Keeps the entries ``kept`` of a flat ``Box`` observation of ``size`` entries.

    Observation ``[size]`` float32 -> ``[len(kept)]`` float32; the bounds are the env's for
    those entries. Subclasses set ``size``, ``kept`` and ``task`` (what the env is, for the
    error message).
    """

    size: ClassVar[int]
    kept: ClassVar[np.ndarray]
    task: ClassVar[str]

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or space.shape != (self.size,):
            raise ValueError(
                f"{type(self).__name__} expects {self.task}'s Box observation of shape "
                f"({self.size},), got {space}"
            )
        self.observation_space = gym.spaces.Box(
            low=space.low[self.kept], high=space.high[self.kept], dtype=np.float32
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        """``[size]`` -> ``[len(kept)]``: the kept entries."""
        return np.asarray(observation, dtype=np.float32)[self.kept]
