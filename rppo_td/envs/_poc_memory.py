"""``rppo_td/PocMemory-v0``: the seed design's proof-of-concept memory task.

A 1-D track from -1 to +1 in steps of 0.2; the agent starts at 0 and moves left or right
(``Discrete(2)``: 0 left, 1 right). One end pays, the other punishes, drawn at random per
episode. The observation ``(3,)`` is ``[left flag, position, right flag]``; the flags say which
end pays (+1 the paying end, -1 the other) during the first 2 steps only, zero afterwards, and
during those 2 steps the agent cannot move. Reaching the paying end gives
``+(1 + 0.1 * min_steps)`` = +1.6, the other -1.6 (both terminate; ``min_steps = 1 / 0.2 + 1
= 6``, as in the seed design); every other step costs 0.1. The shortest episode is 7 steps (2
shown, 5 moves), so a policy that remembers the flags returns ``1.6 - 6 * 0.1 = 1.0``; one
that guesses returns about ``-0.6`` on average. ``gym.make`` adds a 32-step time limit (a
truncation).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["POC_MEMORY_ID", "PocMemory"]

POC_MEMORY_ID = "rppo_td/PocMemory-v0"

_STEP = 0.2
_CELLS = 5  # cells from the centre to either end: 1 / 0.2
_SHOW_STEPS = 2
_MIN_STEPS = _CELLS + 1  # the seed design's count, 1 / step + 1
_TIME_PENALTY = 0.1
_GOAL_REWARD = 1.0 + _TIME_PENALTY * _MIN_STEPS


class PocMemory(gym.Env):
    """The proof-of-concept memory task (see the module docstring).

    Example:
        >>> env = PocMemory()
        >>> obs, _ = env.reset(seed=0)
        >>> obs.shape, float(abs(obs[0])), float(obs[1])
        ((3,), 1.0, 0.0)
    """

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self._cell = 0  # position = cell * 0.2, kept as an integer: no drift
        self._steps = 0
        self._right_pays = True

    def _observation(self) -> np.ndarray:
        flags = (0.0, 0.0)
        if self._steps < _SHOW_STEPS:
            flags = (-1.0, 1.0) if self._right_pays else (1.0, -1.0)
        return np.array([flags[0], self._cell * _STEP, flags[1]], dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Starts at 0 with the paying end drawn from the env's generator."""
        super().reset(seed=seed)
        self._cell = 0
        self._steps = 0
        self._right_pays = bool(self.np_random.integers(2))
        return self._observation(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Moves one cell (not during the first 2 steps); pays at either end."""
        if not self.action_space.contains(action):
            raise ValueError(f"action must be 0 (left) or 1 (right), got {action!r}")
        if self._steps >= _SHOW_STEPS:
            self._cell += 1 if int(action) == 1 else -1
        self._steps += 1
        if abs(self._cell) < _CELLS:
            return self._observation(), -_TIME_PENALTY, False, False, {}
        paid = (self._cell > 0) == self._right_pays
        return self._observation(), _GOAL_REWARD if paid else -_GOAL_REWARD, True, False, {}
