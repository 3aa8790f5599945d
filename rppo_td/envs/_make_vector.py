"""``make_vector_env``: ``W`` checked env copies, stepped in this process or in worker processes."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from rppo_td._validation import check_int_at_least
from rppo_td.envs._cartpole_novel import CARTPOLE_NOVEL_ID
from rppo_td.envs._cartpole_vector import CartPoleNoVelVectorEnv
from rppo_td.envs._make import _Maker, resolve_env_id
from rppo_td.envs._processes import ProcessVectorEnv
from rppo_td.envs._vector import CheckedVectorEnv

__all__ = ["make_vector_env"]

# what CartPoleNoVelVectorEnv takes of gym.make's keyword arguments (render_mode only as None;
# disable_env_checker concerns gymnasium's passive checker, which it has no use for)
NATIVE_CARTPOLE_KWARGS = {"max_episode_steps", "sutton_barto_reward"}
IGNORED_KWARGS = {"disable_env_checker"}


def make_vector_env(
    env_id: str, num_envs: int, *, processes: int = 0, arrays: bool = True, **kwargs: Any
) -> gym.vector.VectorEnv:
    """A checked vector env of ``num_envs`` ``make_env`` copies, ``SAME_STEP`` autoreset.

    In ``SAME_STEP`` mode a step that ends an episode returns the *reset* observation and puts
    the pre-reset one in ``info["final_obs"]`` (masked by ``info["_final_obs"]``), so the
    rollout loop can bootstrap a truncated episode from ``V(final_obs)``. Gymnasium's default,
    ``NEXT_STEP``, would instead spend one extra step per episode returning the reset.

    The sub-envs are ``make_env``'s, but check only the API, reward and flags of each step
    (and each episode's final observation); ``CheckedVectorEnv`` checks the batch of
    observations at once, which costs a few percent of a CartPole step.

    With ``processes=0`` it is a ``CheckedVectorEnv`` (a ``SyncVectorEnv``) stepping every
    copy in this process; for ``rppo_td/CartPoleNoVel-v1`` (with ``arrays`` and no keyword
    arguments but ``max_episode_steps``, ``sutton_barto_reward``, ``render_mode=None`` and
    ``disable_env_checker``) it is a ``CartPoleNoVelVectorEnv``, which steps all copies as
    arrays with the same episodes, bit for bit, about five times faster; with
    ``processes=N >= 1`` it is a ``ProcessVectorEnv``: the same
    copies, ``W / N`` per worker process, stepped by TorchRL's ``ParallelEnv`` and seen
    through the same interface (same seeds, same observations, rewards, flags and
    ``final_obs``).

    Args:
        env_id: see ``resolve_env_id``.
        num_envs: ``W >= 1``.
        processes: worker processes ``N`` (``0``: none); ``N`` must divide ``W``.
        arrays: step ``rppo_td/CartPoleNoVel-v1`` as arrays where the keyword arguments
            allow; False always gives the checked copies (which have sub-env objects for
            ``get_attr``, ``call`` and pickling one by one).
        **kwargs: passed to ``gym.make``.

    Raises:
        ValueError: a bad ``num_envs`` or ``processes``, or (see ``make_env``) a bad id.

    Example:
        >>> env = make_vector_env("rppo_td/CartPoleNoVel-v1", 3)
        >>> obs, info = env.reset(seed=0)
        >>> obs.shape, env.single_action_space
        ((3, 2), Discrete(2))
        >>> env.close()
    """
    check_int_at_least("num_envs", num_envs, 1)
    check_int_at_least("processes", processes, 0)
    name = resolve_env_id(env_id)
    if processes:
        # the workers import a module:EnvId's module themselves
        return ProcessVectorEnv(env_id, num_envs, processes=processes, kwargs=kwargs)
    if arrays and name == CARTPOLE_NOVEL_ID and kwargs.get("render_mode") is None:
        native = {k: v for k, v in kwargs.items() if k not in IGNORED_KWARGS | {"render_mode"}}
        if set(native) <= NATIVE_CARTPOLE_KWARGS:
            return CartPoleNoVelVectorEnv(num_envs, **native)
    fns = [_Maker(name, kwargs) for _ in range(num_envs)]
    return CheckedVectorEnv(fns, env_id=name)
