"""MiniGrid Memory (``rppo_td/MiniGrid-MemoryS9-v0`` and sizes 7-17) behind the ``minigrid`` extra.

MiniGrid's ``MiniGrid-MemoryS{size}-v0``: the agent starts in a small room with a key or a
ball, walks down a hallway to a junction with a key at one end and a ball at the other, and
must step next to the one it saw in the room. The right one pays
``1 - 0.9 * step_count / max_steps`` and ends the episode, the wrong one pays 0 and ends it;
``max_steps = 5 * size**2`` steps is a truncation (MiniGrid's own time limit).

Two changes make it a memory task: the agent sees ``3 x 3`` cells instead of MiniGrid's
``7 x 7`` (with the default view the start object and the junction are in view together on
S7 and S9, so no memory is needed), and the actions are cut to ``Discrete(3)``: 0 turn left,
1 turn right, 2 forward (MiniGrid's other four do nothing here). The mission string is
dropped. Observations are either

- ``"symbolic"`` (the default, fast on a CPU): ``MultiDiscrete`` ``[28]``, the ``3 x 3 x 3``
  grid encoding (object, colour, state index of each cell, row-major over ``x, y``) followed
  by the agent's direction (0-3); the agent one-hot encodes it. A ``uint8`` ``3x3x3`` ``Box``
  would be taken for an image and sent through the CNN, which is wrong for indices.
- ``"rgb"`` (the seed design's setting, for a GPU): the agent's view rendered at 28 pixels a
  tile, ``uint8`` ``[84, 84, 3]`` (``3 * 28 = 84``, no resizing).

Registering the ids does not import ``minigrid``; making one does, and raises an
``ImportError`` naming the extra when it is missing.
"""

from __future__ import annotations

import importlib
from typing import Any, Literal

import gymnasium as gym
import numpy as np

__all__ = [
    "MINIGRID_MEMORY_SIZES",
    "MemoryObservation",
    "minigrid_memory_id",
    "make_minigrid_memory",
    "register_minigrid",
]

MINIGRID_MEMORY_SIZES = (7, 9, 11, 13, 17)
VIEW_SIZE = 3
TILE_SIZE = 28  # pixels per cell of the RGB view: 3 cells * 28 = 84
# our action -> MiniGrid's Actions (left=0, right=1, forward=2)
_ACTIONS = np.array([0, 1, 2])
_DIRECTIONS = 4


def minigrid_memory_id(size: int, observation: Literal["symbolic", "rgb"] = "symbolic") -> str:
    """The id of the Memory task of one size: ``rppo_td/MiniGrid-MemoryS9-v0`` (``-RGB-`` for RGB).

    Example:
        >>> minigrid_memory_id(11, "rgb")
        'rppo_td/MiniGrid-MemoryS11-RGB-v0'
    """
    mode = "-RGB" if observation == "rgb" else ""
    return f"rppo_td/MiniGrid-MemoryS{size}{mode}-v0"


class MemoryObservation(gym.Wrapper):
    """Three actions and a mission-free observation on a MiniGrid env with a 3x3 view.

    Action ``Discrete(3)`` (left, right, forward) -> MiniGrid's action index. Observation
    ``{"image", "direction", "mission"}`` -> symbolic ``[28]`` int64 (``MultiDiscrete``: the
    flat ``image`` then ``direction``) or the ``image`` alone for an RGB view
    (``uint8`` ``[84, 84, 3]``, from MiniGrid's ``RGBImgPartialObsWrapper``).

    Args:
        env: a MiniGrid env (symbolic) or one inside ``RGBImgPartialObsWrapper``.
        observation: ``"symbolic"`` or ``"rgb"``.
        cell_sizes: the number of object, colour and state indices (MiniGrid's constants);
            symbolic only.

    Example:
        >>> env = make_minigrid_memory(9)  # doctest: +SKIP
        >>> env.observation_space.shape, env.action_space  # doctest: +SKIP
        ((28,), Discrete(3))
    """

    def __init__(
        self,
        env: gym.Env,
        *,
        observation: Literal["symbolic", "rgb"] = "symbolic",
        cell_sizes: tuple[int, int, int] = (11, 6, 3),
    ) -> None:
        super().__init__(env)
        if observation not in ("symbolic", "rgb"):
            raise ValueError(f"observation must be 'symbolic' or 'rgb', got {observation!r}")
        image = env.observation_space["image"]  # type: ignore[index]
        self._rgb = observation == "rgb"
        self.action_space = gym.spaces.Discrete(len(_ACTIONS))
        if self._rgb:
            if image.shape != (VIEW_SIZE * TILE_SIZE, VIEW_SIZE * TILE_SIZE, 3):
                raise ValueError(f"expected an [84, 84, 3] RGB view, got {image.shape}")
            self.observation_space = gym.spaces.Box(0, 255, image.shape, dtype=np.uint8)
        else:
            if image.shape != (VIEW_SIZE, VIEW_SIZE, 3):
                raise ValueError(f"expected a [3, 3, 3] symbolic view, got {image.shape}")
            cells = np.tile(np.array(cell_sizes), VIEW_SIZE * VIEW_SIZE)
            nvec = np.append(cells, _DIRECTIONS)
            self.observation_space = gym.spaces.MultiDiscrete(nvec, dtype=np.int64)

    def _observation(self, obs: dict[str, Any]) -> np.ndarray:
        if self._rgb:
            return np.asarray(obs["image"], dtype=np.uint8)
        flat = np.asarray(obs["image"], dtype=np.int64).reshape(-1)
        return np.append(flat, np.int64(obs["direction"]))

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Resets MiniGrid; returns the converted observation."""
        obs, info = self.env.reset(seed=seed, options=options)
        return self._observation(obs), info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Steps MiniGrid with action ``0``/``1``/``2`` (left, right, forward)."""
        if not self.action_space.contains(action):
            raise ValueError(f"action must be 0 (left), 1 (right) or 2 (forward), got {action!r}")
        obs, reward, terminated, truncated, info = self.env.step(int(_ACTIONS[int(action)]))
        return self._observation(obs), float(reward), bool(terminated), bool(truncated), info


def _import_minigrid(env_id: str) -> Any:
    try:
        return importlib.import_module("minigrid")
    except ImportError as err:
        raise ImportError(
            f"{env_id} needs the minigrid extra: pip install 'rppo_td[minigrid]' ({err})"
        ) from err


def make_minigrid_memory(
    size: int = 9,
    *,
    observation: Literal["symbolic", "rgb"] = "symbolic",
    render_mode: str | None = None,
    **kwargs: Any,
) -> gym.Env:
    """Builds MiniGrid's Memory env of ``size`` with a 3x3 view and three actions.

    ``gym.make(minigrid_memory_id(size))`` calls this.

    Args:
        size: the grid's side, one of ``MINIGRID_MEMORY_SIZES``.
        observation: ``"symbolic"`` (``MultiDiscrete`` ``[28]``) or ``"rgb"``
            (``uint8`` ``[84, 84, 3]``).
        render_mode: passed to MiniGrid.
        **kwargs: passed to MiniGrid's ``MemoryEnv`` (``max_steps``, ``random_length``).

    Raises:
        ImportError: ``minigrid`` is not installed.
        ValueError: an unknown size or observation mode.
    """
    if size not in MINIGRID_MEMORY_SIZES:
        raise ValueError(f"size must be one of {list(MINIGRID_MEMORY_SIZES)}, got {size!r}")
    if observation not in ("symbolic", "rgb"):
        raise ValueError(f"observation must be 'symbolic' or 'rgb', got {observation!r}")
    _import_minigrid(minigrid_memory_id(size, observation))
    from minigrid.core.constants import COLOR_TO_IDX, OBJECT_TO_IDX, STATE_TO_IDX
    from minigrid.envs import MemoryEnv
    from minigrid.wrappers import RGBImgPartialObsWrapper

    env: gym.Env = MemoryEnv(
        size=size, agent_view_size=VIEW_SIZE, render_mode=render_mode, **kwargs
    )
    if observation == "rgb":
        env = RGBImgPartialObsWrapper(env, tile_size=TILE_SIZE)
    sizes = (len(OBJECT_TO_IDX), len(COLOR_TO_IDX), len(STATE_TO_IDX))
    return MemoryObservation(env, observation=observation, cell_sizes=sizes)


def register_minigrid() -> None:
    """Registers the Memory ids of every size, symbolic and RGB; again does nothing.

    ``rppo_td/MiniGrid-MemoryS{7,9,11,13,17}-v0`` and ``...-RGB-v0``. No ``TimeLimit`` is
    added: MiniGrid truncates at its own ``max_steps``. ``minigrid`` is imported at make time.

    Example:
        >>> register_minigrid()
        >>> minigrid_memory_id(9) in gym.registry
        True
    """
    for size in MINIGRID_MEMORY_SIZES:
        for observation in ("symbolic", "rgb"):
            env_id = minigrid_memory_id(size, observation)  # type: ignore[arg-type]
            if env_id in gym.registry:
                continue
            gym.register(
                id=env_id,
                entry_point="rppo_td.envs._minigrid:make_minigrid_memory",
                kwargs={"size": size, "observation": observation},
            )
