"""Building gymnasium envs from an id, including the ``module:EnvId`` form."""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode, SyncVectorEnv

__all__ = ["make_env", "make_vector_env", "resolve_env_id"]


def resolve_env_id(env_id: str) -> str:
    """Imports the module of a ``module:EnvId`` id and checks the id is registered.

    Args:
        env_id: a registered gymnasium id (``CartPole-v1``, ``rppo_td/CartPoleNoVel-v1``) or
            ``module:EnvId``, where importing ``module`` registers ``EnvId``.

    Returns:
        The gymnasium id without the module part.

    Raises:
        ValueError: the module cannot be imported or the id is not registered.

    Example:
        >>> resolve_env_id("rppo_td.envs:rppo_td/CartPoleNoVel-v1")
        'rppo_td/CartPoleNoVel-v1'
    """
    if not isinstance(env_id, str) or not env_id.strip():
        raise ValueError(f"env must be a non-empty gymnasium id, got {env_id!r}")
    module, sep, name = env_id.partition(":")
    if sep:
        if not module or not name:
            raise ValueError(f"env {env_id!r} must look like 'module:EnvId'")
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise ValueError(
                f"env {env_id!r}: cannot import module {module!r} to register {name!r} ({err})"
            ) from err
    else:
        name = env_id
    try:
        gym.spec(name)
    except gym.error.Error as err:
        raise ValueError(
            f"unknown env {name!r}: not registered with gymnasium ({err}). Use a registered id, "
            "or 'module:EnvId' to import the module that registers it."
        ) from err
    return name


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    """``gym.make`` after ``resolve_env_id``.

    Args:
        env_id: see ``resolve_env_id``.
        **kwargs: passed to ``gym.make``.
    """
    return gym.make(resolve_env_id(env_id), **kwargs)


def make_vector_env(env_id: str, num_envs: int, **kwargs: Any) -> SyncVectorEnv:
    """A ``SyncVectorEnv`` of ``num_envs`` copies, autoresetting in ``SAME_STEP`` mode.

    In ``SAME_STEP`` mode a step that ends an episode returns the *reset* observation and puts
    the pre-reset one in ``info["final_obs"]`` (masked by ``info["_final_obs"]``), so the
    rollout loop can bootstrap a truncated episode from ``V(final_obs)``. Gymnasium's default,
    ``NEXT_STEP``, would instead spend one extra step per episode returning the reset.

    Args:
        env_id: see ``resolve_env_id``.
        num_envs: ``W >= 1``.
        **kwargs: passed to ``gym.make``.
    """
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
    name = resolve_env_id(env_id)
    fns = [_Maker(name, kwargs) for _ in range(num_envs)]
    return SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)


class _Maker:
    """A picklable env factory (a lambda would not pickle)."""

    def __init__(self, name: str, kwargs: dict[str, Any]) -> None:
        self.name = name
        self.kwargs = kwargs

    def __call__(self) -> gym.Env:
        return gym.make(self.name, **self.kwargs)
