"""Building checked gymnasium envs from an id, including the ``module:EnvId`` form."""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from typing import Any

import gymnasium as gym
from gymnasium.envs.registration import load_env_creator

from rppo_td.envs._cartpole_novel import register_envs
from rppo_td.envs._checks import EnvBuildError, EnvChecker, EnvError
from rppo_td.envs._spaces import CanonicalSpaces, canonical_observation_space

# _CheckedCreator stays here: pickled env copies (a checkpoint's envs-*.pkl) name it by module
__all__ = ["make_env", "resolve_env_id"]


def resolve_env_id(env_id: str) -> str:
    """Imports the module of a ``module:EnvId`` id and checks the id is registered.

    Registers the built-in envs first (``register_envs``), so their ids always resolve.

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
    register_envs()
    module, sep, name = env_id.partition(":")
    if sep:
        if not module or not name:
            raise ValueError(f"env {env_id!r} must look like 'module:EnvId'")
        try:
            _import_user_module(module)
        except ImportError as err:
            raise ValueError(
                f"env {env_id!r}: cannot import module {module!r} to register {name!r} ({err})"
            ) from err
        except Exception as err:  # the user's module itself failed: its error, in one line
            first = str(err).splitlines()[0] if str(err) else ""
            raise ValueError(
                f"env {env_id!r}: importing module {module!r} to register {name!r} raised "
                f"{type(err).__name__}: {first}"
            ) from err
    else:
        name = env_id
    try:
        gym.spec(name)
    except gym.error.Error as err:
        if sep:
            raise ValueError(
                f"unknown env {env_id!r}: module {module!r} was imported but {name!r} is not "
                f"registered with gymnasium ({err}). Check the id that the module registers."
            ) from err
        if isinstance(err, gym.error.DeprecatedEnv):  # registered, in a newer version only
            raise ValueError(f"env {name!r} is deprecated in gymnasium: {err}") from err
        raise ValueError(
            f"unknown env {name!r}: not registered with gymnasium ({err}). Use a registered id, "
            "or 'module:EnvId' to import the module that registers it."
        ) from err
    return name


def _import_user_module(module: str) -> None:
    """``import module``, also from the current directory, as ``python -m`` would find it.

    A console script (``rppo-train``) has its own folder on ``sys.path``, not the current
    directory, so ``--env my_envs:Id`` with ``my_envs.py`` here failed where ``python -m
    rppo_td.train`` found it. The directory is appended (installed packages come first) and
    stays for the run: env processes and a checkpoint's env copies import the module again.
    """
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        here = os.getcwd()
        top = module.split(".", 1)[0]
        if err.name != top or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as again:
            if again.name == top:
                sys.path.remove(here)
            raise


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    """``gym.make`` after ``resolve_env_id``, checked and in the agent's canonical spaces.

    The env its entry point builds is wrapped in ``EnvChecker`` (directly below gymnasium's
    ``TimeLimit``), which raises ``EnvError`` naming the env on an exception inside
    ``reset``/``step``, the old gym APIs, an observation that does not fit the space or holds
    NaN/inf, a non-scalar or non-finite reward, or non-bool flags. ``EnvChecker`` does the job
    of gymnasium's ``OrderEnforcing``, which is left out, and gymnasium's
    ``PassiveEnvChecker`` is off unless ``disable_env_checker=False`` is passed. Spaces the
    agent cannot take as they are go through ``CanonicalSpaces`` (discrete spaces from 0,
    flat action vectors); others are refused.

    Args:
        env_id: see ``resolve_env_id``.
        **kwargs: passed to ``gym.make``.

    Raises:
        ValueError: an unknown id, or a space the agent cannot use (naming the env).
        EnvError: the env's constructor raised or returned something that is not an env.

    Example:
        >>> make_env("rppo_td/CartPoleNoVel-v1").observation_space.shape
        (2,)
    """
    return _make(resolve_env_id(env_id), kwargs, check_observations=True)


def _make(name: str, kwargs: dict[str, Any], *, check_observations: bool) -> gym.Env:
    register_envs()  # a _Maker unpickled in a fresh process
    spec = gym.spec(name)
    creator = _CheckedCreator(name, spec.entry_point, check_observations=check_observations)
    kwargs = {"disable_env_checker": True, **kwargs}
    # EnvChecker also refuses a step before reset, so gymnasium's OrderEnforcing is left out
    checked = dataclasses.replace(spec, entry_point=creator, order_enforce=False)
    env = gym.make(checked, **kwargs)
    canonical = CanonicalSpaces(env, name)
    return canonical if canonical.changes_spaces else env


class _CheckedCreator:
    """An env spec's entry point that wraps what the original builds in ``EnvChecker``.

    Picklable (it holds the original entry point, a string or a module-level callable), so
    the built env pickles as before.
    """

    def __init__(self, name: str, entry_point: Any, *, check_observations: bool) -> None:
        self.name = name
        self.entry_point = entry_point
        self.check_observations = check_observations

    def _load(self) -> Any:
        """The original creator.

        Errors importing its module (a missing dependency, a wrong ``module:Class``) become an
        ``EnvError`` naming the env.
        """
        if callable(self.entry_point):
            return self.entry_point
        try:
            return load_env_creator(self.entry_point)
        except Exception as err:
            raise EnvBuildError(
                f"env {self.name!r} could not load its entry point {self.entry_point!r}: "
                f"{type(err).__name__}: {err}"
            ) from err

    @property
    def metadata(self) -> Any:
        """The original creator's ``metadata`` (``gym.make`` reads its render modes).

        Raises ``AttributeError`` where it has none, so ``hasattr`` answers as for it.
        """
        return self._load().metadata

    def __call__(self, **kwargs: Any) -> gym.Env:
        creator = self._load()
        try:
            env = creator(**kwargs)
        except EnvError:
            raise
        except Exception as err:
            raise EnvBuildError(
                f"env {self.name!r} raised {type(err).__name__} while being built: {err}"
            ) from err
        if not isinstance(env, gym.Env):
            raise EnvBuildError(
                f"env {self.name!r}: its entry point returned {type(env).__name__}, "
                "expected a gymnasium.Env (old gym envs are not supported)"
            )
        # where CanonicalSpaces converts observations, it needs them checked first
        check = self.check_observations or (
            canonical_observation_space(env.observation_space, env_id=self.name)
            is not env.observation_space
        )
        return EnvChecker(env, self.name, check_observations=check)

    def __repr__(self) -> str:
        return f"checked({self.entry_point!r})"


class _Maker:
    """A picklable env factory (a lambda would not pickle)."""

    def __init__(self, name: str, kwargs: dict[str, Any]) -> None:
        self.name = name
        self.kwargs = kwargs

    def __call__(self) -> gym.Env:
        return _make(self.name, self.kwargs, check_observations=False)
