"""Built-in environments and env construction helpers.

``rppo_td/CartPoleNoVel-v1`` is CartPole-v1 dynamics and its 500-step time limit (a
truncation), observing only the cart position and the pole angle, so a memory-less policy
cannot infer the velocities. ``rppo_td/PocMemory-v0`` is the seed design's proof-of-concept
memory task (``PocMemory``; preset ``poc-memory``). Importing ``rppo_td.envs`` registers both
with gymnasium, as gymnasium's ``module:EnvId`` convention expects
(``gym.make("rppo_td.envs:rppo_td/CartPoleNoVel-v1")`` works); importing ``rppo_td`` or
``rppo_td.functional`` does not load this package. ``resolve_env_id`` (so ``make_env``,
``make_vector_env`` and the trainer) registers them on first use too, and ``register_envs()``
does so explicitly.

``rppo_td/MiniGrid-MemoryS9-v0`` (and ``S7``, ``S11``, ``S13``, ``S17``; ``-RGB-`` variants
such as ``rppo_td/MiniGrid-MemoryS9-RGB-v0``) is MiniGrid's Memory task with a 3x3 view and
three actions (``rppo_td.envs._minigrid``; presets ``minigrid-memory-s9`` and
``minigrid-memory-s11``); making one needs the ``minigrid`` extra.

``rppo_td/PendulumNoVel-v1`` is Pendulum-v1 observing only ``cos θ`` and ``sin θ`` (the
angular velocity hidden), with Box actions and the 200-step time limit as a truncation
(``rppo_td.envs._pendulum_novel``; preset ``pendulum-novel``).

``make_env`` and ``make_vector_env`` check what an env returns and raise ``EnvError``
(naming the env and the problem) instead of training on bad data, and show the env through
the spaces the agent is built from (discrete spaces from 0, flat action vectors).
``make_vector_env(env_id, W, processes=N)`` steps the same checked copies in ``N`` worker
processes (TorchRL's ``ParallelEnv``, as a ``ProcessVectorEnv``), with the same results. For
``rppo_td/CartPoleNoVel-v1`` in this process ``make_vector_env`` returns
``CartPoleNoVelVectorEnv``: the ``W`` copies stepped as arrays, their episodes to the bit
(``arrays=False`` keeps the checked copies, for code that needs the sub-env objects).
"""

from rppo_td.envs._cartpole_novel import (
    CARTPOLE_NOVEL_ID,
    VelocityMask,
    make_cartpole_novel,
    register_envs,
)
from rppo_td.envs._cartpole_vector import CartPoleNoVelVectorEnv
from rppo_td.envs._checks import EnvBuildError, EnvError
from rppo_td.envs._make import make_env, resolve_env_id
from rppo_td.envs._make_vector import make_vector_env
from rppo_td.envs._pendulum_novel import PENDULUM_NOVEL_ID
from rppo_td.envs._poc_memory import POC_MEMORY_ID, PocMemory
from rppo_td.envs._processes import ProcessVectorEnv

__all__ = [
    "CARTPOLE_NOVEL_ID",
    "CartPoleNoVelVectorEnv",
    "EnvBuildError",
    "EnvError",
    "PENDULUM_NOVEL_ID",
    "POC_MEMORY_ID",
    "PocMemory",
    "ProcessVectorEnv",
    "VelocityMask",
    "make_cartpole_novel",
    "make_env",
    "make_vector_env",
    "register_envs",
    "resolve_env_id",
]

# gymnasium's module:EnvId convention: importing the env package registers its envs
register_envs()
