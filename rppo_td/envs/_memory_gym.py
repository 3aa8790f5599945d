"""Memory Gym behind the ``memory-gym`` extra: Mortar Mayhem, Mystery Path, Searing Spotlights.

``register_memory_gym`` registers ``rppo_td/<task>`` ids (``MEMORY_GYM_IDS``) with string
entry points, so registering never imports ``memory_gym``; making one imports it and raises an
``ImportError`` naming the install commands where it is missing. memory-gym pins
``gymnasium==0.29.0`` and ``pygame==2.4.0`` in every release, so it cannot be an ordinary
dependency next to gymnasium 1.x: the extra installs ``pygame-ce`` and memory-gym goes in
without its pins (``INSTALL_HINT``).

Each env is memory-gym's own (its default reset parameters) seen through
``MemoryGymAdapter``:

- observations are ``uint8`` ``[84, 84, 3]`` images (memory-gym >= 1.0.1 returns them so;
  1.0.0 returned float32 in ``[0, 1]``, which the adapter turns back into ``uint8``). The
  agent's image encoder divides by 255, so the rollout keeps 1 byte per pixel and the network
  sees ``[0, 1]``.
- memory-gym returns ``truncated=False`` always and ends a time-out as ``done``. Mystery Path
  and Searing Spotlights end themselves when their step count reaches ``max_steps`` (a reset
  parameter; 128 for Mystery Path Grid, 512 for Mystery Path, 256 for Searing Spotlights): the
  adapter reports that end as ``truncated=True, terminated=False``, unless the same step was a
  real end (``info["success"] == 1``, or Searing Spotlights' ``info["agent_health"] <= 0``).
  Mortar Mayhem has no time limit: it ends only on a failed command or after the last one, and
  every end is ``terminated``.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import load_env_creator

__all__ = [
    "INSTALL_HINT",
    "MEMORY_GYM_IDS",
    "MemoryGymAdapter",
    "import_memory_gym",
    "make_memory_gym",
    "register_memory_gym",
]

# rppo_td id -> memory-gym's id
MEMORY_GYM_IDS = {
    "rppo_td/MortarMayhem-v0": "MortarMayhem-v0",
    "rppo_td/MortarMayhem-Grid-v0": "MortarMayhem-Grid-v0",
    "rppo_td/MysteryPath-v0": "MysteryPath-v0",
    "rppo_td/MysteryPath-Grid-v0": "MysteryPath-Grid-v0",
    "rppo_td/SearingSpotlights-v0": "SearingSpotlights-v0",
}

INSTALL_HINT = (
    "pip install 'rppo_td[memory-gym]' (or pip install -e '.[memory-gym]' in an rppo_td "
    'checkout), then pip install --no-deps "memory-gym>=1.0.1" '
    "(memory-gym pins gymnasium==0.29.0, which would replace the gymnasium 1.x rppo_td needs, "
    "so it goes in without its dependencies)"
)


def import_memory_gym() -> ModuleType:
    """Imports ``memory_gym`` (registering its ids) with pygame's audio and video off.

    pygame reads ``SDL_AUDIODRIVER`` and ``SDL_VIDEODRIVER`` when it starts; without a sound
    card it would print ALSA errors. Values already set are kept.

    Raises:
        ImportError: memory-gym (or pygame) is not installed; the message names the extra and
            the install commands.
    """
    _headless_pygame()
    try:
        return importlib.import_module("memory_gym")
    except ImportError as err:
        raise ImportError(
            f"the Memory Gym envs need the memory-gym extra ({err}); install it with: "
            f"{INSTALL_HINT}"
        ) from err


def _headless_pygame() -> None:
    """No sound card, no window, no greeting: set before pygame is first imported."""
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")


def _real_end(info: dict[str, Any]) -> bool:
    """True where memory-gym's ``info`` at an end says success or death, not a time-out."""
    return info.get("success", 0) == 1 or info.get("agent_health", 1.0) <= 0


class MemoryGymAdapter(gym.Wrapper):
    """A memory-gym env with ``uint8`` image observations and time-outs as truncations.

    Observation ``[H, W, C]`` uint8 (or float in ``[0, 1]``) -> ``[H, W, C]`` uint8. At an end
    (memory-gym's ``terminated``), the step count reaching the env's ``max_steps`` reset
    parameter without a success or a death gives ``(terminated, truncated) = (False, True)``;
    every other end stays ``(True, False)``. An env without ``max_steps`` (Mortar Mayhem) has
    no time-outs. Rewards come out as ``float``.

    ``close`` ends pygame (memory-gym's own ``close`` calls ``pygame.quit()``, which would stop
    every other memory-gym env of the process) only when it closes the process's last open
    adapter; closing any other one just destroys its debug window.

    Example:
        >>> class Float(gym.Env):
        ...     observation_space = gym.spaces.Box(0.0, 1.0, (4, 4, 3), dtype=np.float32)
        ...     action_space = gym.spaces.Discrete(4)
        ...     reset_params = {"max_steps": 2}
        ...     def reset(self, *, seed=None, options=None):
        ...         return np.full((4, 4, 3), 0.5, dtype=np.float32), {}
        ...     def step(self, action):
        ...         return np.ones((4, 4, 3), np.float32), 0, action == 3, False, {"success": 0}
        >>> env = MemoryGymAdapter(Float())
        >>> obs, _ = env.reset()
        >>> env.observation_space.dtype, obs.shape, int(obs.max())
        (dtype('uint8'), (4, 4, 3), 128)
        >>> env.step(0)[2:4], env.step(3)[2:4]  # the 2nd step ends: the time limit
        ((False, False), (False, True))
    """

    #: adapters built and not yet closed in this process (pygame is shared by all of them)
    _open = 0

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._closed = False
        space = env.observation_space
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 3:
            raise ValueError(
                f"MemoryGymAdapter expects an image Box observation [H, W, C], got {space}"
            )
        if space.dtype != np.uint8 and space.dtype.kind != "f":
            raise ValueError(
                f"MemoryGymAdapter expects uint8 or float images, got dtype {space.dtype}"
            )
        self._from_float = space.dtype.kind == "f"  # memory-gym 1.0.0: float32 in [0, 1]
        self.observation_space = gym.spaces.Box(0, 255, space.shape, dtype=np.uint8)
        self._steps = 0
        self._max_steps: int | None = None
        self._ended = False
        MemoryGymAdapter._open += 1

    def close(self) -> None:
        """Closes this env; pygame ends with the process's last open adapter (see the class)."""
        if self._closed:
            return
        self._closed = True
        MemoryGymAdapter._open -= 1
        if MemoryGymAdapter._open <= 0:
            MemoryGymAdapter._open = 0
            self.env.close()
            return
        # what memory-gym's close does apart from pygame.quit()
        window = getattr(self.env.unwrapped, "debug_window", None)
        if window is not None:
            window.destroy()

    def _image(self, obs: Any) -> np.ndarray:
        if self._from_float:
            return np.rint(np.clip(obs, 0.0, 1.0) * 255.0).astype(np.uint8)
        return np.asarray(obs, dtype=np.uint8)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Resets the env and reads its time limit (``max_steps``) from ``options``' result."""
        obs, info = self.env.reset(seed=seed, options=options)
        self._steps = 0
        self._ended = False
        # memory-gym completes the reset parameters from its defaults during reset
        params = getattr(self.env.unwrapped, "reset_params", None) or {}
        limit = params.get("max_steps")
        self._max_steps = None if limit is None else int(limit)
        return self._image(obs), info

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """One step; a time-out end comes out as truncated, not terminated.

        Raises ``gymnasium.error.ResetNeeded`` after the episode ended: memory-gym's envs step
        on past their end, some without any end flag (Mystery Path after its time-out).
        """
        if self._ended:
            raise gym.error.ResetNeeded(
                f"{self.spec.id if self.spec else 'memory-gym env'}: cannot call step() after "
                "the episode ended; call reset()"
            )
        obs, reward, done, truncated, info = self.env.step(action)
        self._steps += 1
        timed_out = (
            bool(done)
            and self._max_steps is not None
            and self._steps >= self._max_steps
            and not _real_end(info)
        )
        terminated = bool(done) and not timed_out
        truncated = bool(truncated) or timed_out
        self._ended = terminated or truncated
        return self._image(obs), float(reward), terminated, truncated, info


def make_memory_gym(memory_gym_id: str, render_mode: str | None = None) -> gym.Env:
    """Builds memory-gym's ``memory_gym_id`` behind ``MemoryGymAdapter``.

    The registered ``rppo_td/...`` ids call this with their memory-gym id; gymnasium's
    ``TimeLimit`` is not added (the envs keep their own limits, see the module docstring).

    Args:
        memory_gym_id: one of the values of ``MEMORY_GYM_IDS`` (or any memory-gym id with an
            image observation).
        render_mode: passed to the env (``None``, ``"rgb_array"`` or ``"debug_rgb_array"``).

    Raises:
        ImportError: memory-gym is not installed (see ``import_memory_gym``).
    """
    import_memory_gym()
    entry_point = gym.spec(memory_gym_id).entry_point  # memory-gym registers "module:Class"
    creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    if creator is None:
        raise ValueError(f"memory-gym id {memory_gym_id!r} has no entry point")
    env = creator(render_mode=render_mode)
    if not isinstance(env, gym.Env):
        raise TypeError(f"memory-gym id {memory_gym_id!r} built {type(env).__name__}, not an Env")
    return MemoryGymAdapter(env)


def register_memory_gym() -> None:
    """Registers the ids of ``MEMORY_GYM_IDS``; calling it again does nothing.

    Registering does not import ``memory_gym``; ``gym.make`` of an id does.

    Example:
        >>> register_memory_gym()
        >>> gym.spec("rppo_td/MortarMayhem-Grid-v0").kwargs
        {'memory_gym_id': 'MortarMayhem-Grid-v0'}
    """
    for env_id, memory_gym_id in MEMORY_GYM_IDS.items():
        if env_id not in gym.registry:
            gym.register(
                id=env_id,
                entry_point="rppo_td.envs._memory_gym:make_memory_gym",
                kwargs={"memory_gym_id": memory_gym_id},
            )
