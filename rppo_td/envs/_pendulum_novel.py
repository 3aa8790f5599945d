"""``rppo_td/PendulumNoVel-v1``: Pendulum-v1 with the angular velocity hidden.

Pendulum-v1 observes ``[cos θ, sin θ, θdot]``; this task observes ``[cos θ, sin θ]`` only, so
a policy must infer the angular velocity from the angles it has seen (a memory task with
continuous actions). Dynamics, reward (``-(θ² + 0.1 θdot² + 0.001 u²)``, between about -16.3
and 0 per step), the ``Box(-2, 2, (1,))`` torque and the 200-step time limit (a truncation:
Pendulum never terminates) are Pendulum-v1's.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.pendulum import PendulumEnv

from rppo_td.envs._masks import EntryMask

__all__ = [
    "PENDULUM_NOVEL_ID",
    "AngularVelocityMask",
    "make_pendulum_novel",
    "register_pendulum_novel",
]

PENDULUM_NOVEL_ID = "rppo_td/PendulumNoVel-v1"


class AngularVelocityMask(EntryMask):
    """Keeps ``cos θ`` and ``sin θ`` of a Pendulum observation.

    Observation ``[3]`` float32 -> ``[2]`` float32; bounds are Pendulum's for those entries
    (``[-1, 1]``).

    Example:
        >>> env = AngularVelocityMask(PendulumEnv())
        >>> env.observation_space.shape
        (2,)
    """

    # Pendulum's observation is (cos θ, sin θ, θdot)
    size, kept, task = 3, np.array([0, 1]), "Pendulum"


def make_pendulum_novel(render_mode: str | None = None, **kwargs: Any) -> gym.Env:
    """Builds Pendulum-v1 dynamics behind the velocity mask, without a time limit.

    ``gym.make(PENDULUM_NOVEL_ID)`` calls this and adds gymnasium's ``TimeLimit`` of 200
    steps (a truncation) from the registration, as for Pendulum-v1.

    Args:
        render_mode: passed to ``PendulumEnv``.
        **kwargs: passed to ``PendulumEnv`` (e.g. ``g``, the gravity).

    Returns:
        The masked env; use ``gym.make(PENDULUM_NOVEL_ID)`` for the time limit.
    """
    return AngularVelocityMask(PendulumEnv(render_mode=render_mode, **kwargs))


def register_pendulum_novel() -> None:
    """Registers ``PENDULUM_NOVEL_ID`` with gymnasium; calling it again does nothing.

    ``rppo_td.envs.register_envs`` calls it.

    Example:
        >>> register_pendulum_novel()
        >>> gym.make(PENDULUM_NOVEL_ID).observation_space.shape
        (2,)
    """
    if PENDULUM_NOVEL_ID not in gym.registry:
        gym.register(
            id=PENDULUM_NOVEL_ID,
            entry_point=make_pendulum_novel,
            max_episode_steps=200,
        )
