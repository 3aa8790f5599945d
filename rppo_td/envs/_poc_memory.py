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

# the rgb_array frame: 2 * _CELLS + 1 cells of _PIXELS between margins, lamps, track, ticks
_PIXELS = 32
_MARGIN = 16
_HEIGHT = 96
_WIDTH = 2 * _MARGIN + (2 * _CELLS + 1) * _PIXELS
_LAMP_ROWS = slice(8, 26)
_TRACK_ROWS = slice(34, 62)
_TICK_ROWS = slice(72, 84)
_TICK_PITCH = 6
_BACKGROUND = (250, 250, 250)
_CELL = (215, 215, 215)
_PAYS = (70, 170, 80)
_PUNISHES = (205, 65, 55)
_LAMP_OFF = (228, 228, 228)
_AGENT = (40, 80, 200)
_TICK = (90, 90, 90)


class PocMemory(gym.Env):
    """The proof-of-concept memory task (see the module docstring).

    Example:
        >>> env = PocMemory()
        >>> obs, _ = env.reset(seed=0)
        >>> obs.shape, float(abs(obs[0])), float(obs[1])
        ((3,), 1.0, 0.0)
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}  # noqa: RUF012 (gymnasium's)

    def __init__(self, render_mode: str | None = None) -> None:
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.render_mode = render_mode
        # each env its own spaces (their random generators, seeded apart), as gymnasium's
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (3,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._cell = 0  # position = cell * 0.2, kept as an integer: no drift
        self._steps = 0
        self._ended = False
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
        self._ended = False
        self._right_pays = bool(self.np_random.integers(2))
        return self._observation(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Moves one cell (not during the first 2 steps); pays at either end.

        Raises ``gymnasium.error.ResetNeeded`` after the episode ended at an end of the track
        (it would move past the end and pay again).
        """
        if not self.action_space.contains(action):
            raise ValueError(f"action must be 0 (left) or 1 (right), got {action!r}")
        if self._ended:
            raise gym.error.ResetNeeded(
                "PocMemory: cannot call step() after the episode ended; call reset()"
            )
        if self._steps >= _SHOW_STEPS:
            self._cell += 1 if int(action) == 1 else -1
        self._steps += 1
        if abs(self._cell) < _CELLS:
            return self._observation(), -_TIME_PENALTY, False, False, {}
        paid = (self._cell > 0) == self._right_pays
        self._ended = True
        return self._observation(), _GOAL_REWARD if paid else -_GOAL_REWARD, True, False, {}

    def render(self) -> np.ndarray | None:  # type: ignore[override]
        """The state as a ``[96, 384, 3]`` uint8 frame (``render_mode="rgb_array"``), else None.

        Example:
            >>> env = PocMemory(render_mode="rgb_array")
            >>> _ = env.reset(seed=0)
            >>> env.render().shape
            (96, 384, 3)
        """
        if self.render_mode is None:
            return None
        frame = np.empty((_HEIGHT, _WIDTH, 3), dtype=np.uint8)
        frame[:] = _BACKGROUND
        ends = {-_CELLS: not self._right_pays, _CELLS: self._right_pays}  # cell -> pays
        shown = self._steps < _SHOW_STEPS
        for cell in range(-_CELLS, _CELLS + 1):
            left = _MARGIN + (cell + _CELLS) * _PIXELS
            colour = _CELL if cell not in ends else _PAYS if ends[cell] else _PUNISHES
            frame[_TRACK_ROWS, left + 1 : left + _PIXELS - 1] = colour
            if cell in ends:
                lamp = (_PAYS if ends[cell] else _PUNISHES) if shown else _LAMP_OFF
                frame[_LAMP_ROWS, left + 6 : left + _PIXELS - 6] = lamp
        centre_x = _MARGIN + (self._cell + _CELLS) * _PIXELS + _PIXELS // 2
        centre_y = (_TRACK_ROWS.start + _TRACK_ROWS.stop) // 2
        rows, columns = np.ogrid[:_HEIGHT, :_WIDTH]
        disk = (rows - centre_y) ** 2 + (columns - centre_x) ** 2 <= 10**2
        frame[disk] = _AGENT
        ticks = min(self._steps, (_WIDTH - 2 * _MARGIN) // _TICK_PITCH)
        for tick in range(ticks):
            left = _MARGIN + tick * _TICK_PITCH
            frame[_TICK_ROWS, left : left + _TICK_PITCH - 2] = _TICK
        return frame
