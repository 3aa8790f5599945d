"""``rppo_td/CartPoleNoVel-v1``: CartPole-v1 with the velocities hidden."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from rppo_td.envs._masks import EntryMask
from rppo_td.envs._memory_gym import register_memory_gym
from rppo_td.envs._minigrid import register_minigrid
from rppo_td.envs._pendulum_novel import register_pendulum_novel
from rppo_td.envs._poc_memory import POC_MEMORY_ID

__all__ = ["CARTPOLE_NOVEL_ID", "VelocityMask", "make_cartpole_novel", "register_envs"]

CARTPOLE_NOVEL_ID = "rppo_td/CartPoleNoVel-v1"


class VelocityMask(EntryMask):
    """Keeps the cart position and pole angle of a CartPole observation.

    Observation ``[4]`` float32 -> ``[2]`` float32; bounds are CartPole's for those entries.

    Example:
        >>> env = VelocityMask(CartPoleEnv())
        >>> env.observation_space.shape
        (2,)
    """

    # CartPole's state is (cart position, cart velocity, pole angle, pole angular velocity)
    size, kept, task = 4, np.array([0, 2]), "CartPole"


def make_cartpole_novel(render_mode: str | None = None, **kwargs: Any) -> gym.Env:
    """Builds CartPole-v1 dynamics behind the velocity mask, without a time limit.

    ``gym.make(CARTPOLE_NOVEL_ID)`` calls this and adds gymnasium's ``TimeLimit`` of 500
    steps (a truncation) from the registration, as for CartPole-v1.

    Args:
        render_mode: passed to ``CartPoleEnv``.
        **kwargs: passed to ``CartPoleEnv`` (e.g. ``sutton_barto_reward``).

    Returns:
        The masked env; use ``gym.make(CARTPOLE_NOVEL_ID)`` for the time limit.
    """
    return VelocityMask(CartPoleEnv(render_mode=render_mode, **kwargs))


def register_envs() -> None:
    """Registers the built-in envs with gymnasium; calling it again does nothing.

    ``CARTPOLE_NOVEL_ID`` and ``POC_MEMORY_ID`` (``rppo_td.envs._poc_memory``).

    Importing ``rppo_td.envs`` calls it (importing ``rppo_td`` does not), and so does
    ``rppo_td.envs.resolve_env_id`` (so ``make_env``, ``make_vector_env``, ``rppo-train`` and
    ``rppo-eval``) on first use. Gymnasium 1.x loads no plugin entry points.

    Example:
        >>> register_envs()
        >>> gym.make(CARTPOLE_NOVEL_ID).observation_space.shape
        (2,)
    """
    if CARTPOLE_NOVEL_ID not in gym.registry:
        gym.register(
            id=CARTPOLE_NOVEL_ID,
            entry_point=make_cartpole_novel,
            reward_threshold=475.0,
            max_episode_steps=500,
        )
    if POC_MEMORY_ID not in gym.registry:
        gym.register(
            id=POC_MEMORY_ID,
            entry_point="rppo_td.envs._poc_memory:PocMemory",
            max_episode_steps=32,
        )
    register_pendulum_novel()
    register_minigrid()
    register_memory_gym()
