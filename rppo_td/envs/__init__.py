"""Built-in environments and env construction helpers.

Importing ``rppo_td`` registers ``rppo_td/CartPoleNoVel-v1`` with gymnasium: CartPole-v1
dynamics and its 500-step time limit (a truncation), observing only the cart position and
the pole angle, so a memory-less policy cannot infer the velocities.

``make_env`` and ``make_vector_env`` check what an env returns and raise ``EnvError``
(naming the env and the problem) instead of training on bad data, and show the env through
the spaces the agent is built from (discrete spaces from 0, flat action vectors).
"""

from rppo_td.envs._cartpole_novel import CARTPOLE_NOVEL_ID, VelocityMask, make_cartpole_novel
from rppo_td.envs._checks import EnvError
from rppo_td.envs._make import make_env, make_vector_env, resolve_env_id

__all__ = [
    "CARTPOLE_NOVEL_ID",
    "EnvError",
    "VelocityMask",
    "make_cartpole_novel",
    "make_env",
    "make_vector_env",
    "resolve_env_id",
]
