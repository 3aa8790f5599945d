"""Building checked gymnasium envs from an id, including the ``module:EnvId`` form."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from rppo_td.envs._cartpole_novel import register_envs
from rppo_td.envs._checks import EnvChecker, EnvError
from rppo_td.envs._spaces import CanonicalSpaces, canonical_observation_space
from rppo_td.envs._vector import CheckedVectorEnv

__all__ = ["ProcessVectorEnv", "make_env", "make_vector_env", "resolve_env_id"]


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


def make_vector_env(
    env_id: str, num_envs: int, *, processes: int = 0, **kwargs: Any
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
    copy in this process; with ``processes=N >= 1`` it is a ``ProcessVectorEnv``: the same
    copies, ``W / N`` per worker process, stepped by TorchRL's ``ParallelEnv`` and seen
    through the same interface (same seeds, same observations, rewards, flags and
    ``final_obs``).

    Args:
        env_id: see ``resolve_env_id``.
        num_envs: ``W >= 1``.
        processes: worker processes ``N`` (``0``: none); ``N`` must divide ``W``.
        **kwargs: passed to ``gym.make``.

    Raises:
        ValueError: a bad ``num_envs`` or ``processes``, or (see ``make_env``) a bad id.
    """
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 0:
        raise ValueError(f"processes must be an int >= 0, got {processes!r}")
    name = resolve_env_id(env_id)
    if processes:
        # the workers import a module:EnvId's module themselves
        return ProcessVectorEnv(env_id, num_envs, processes=processes, kwargs=kwargs)
    fns = [_Maker(name, kwargs) for _ in range(num_envs)]
    return CheckedVectorEnv(fns, env_id=name)


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
        if callable(self.entry_point):
            return self.entry_point
        return load_env_creator(self.entry_point)

    @property
    def metadata(self) -> Any:
        """The original creator's ``metadata`` (``gym.make`` reads its render modes).

        Raises ``AttributeError`` where it has none, so ``hasattr`` answers as for it.
        """
        return self._load().metadata

    def __call__(self, **kwargs: Any) -> gym.Env:
        try:
            env = self._load()(**kwargs)
        except EnvError:
            raise
        except Exception as err:
            raise EnvError(
                f"env {self.name!r} raised {type(err).__name__} while being built: {err}"
            ) from err
        if not isinstance(env, gym.Env):
            raise EnvError(
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


# ---- multi-process stepping: TorchRL's ParallelEnv seen as a SAME_STEP vector env ---------


class ProcessVectorEnv(gym.vector.VectorEnv):
    """``W`` checked env copies stepped in ``N`` worker processes by TorchRL's ``ParallelEnv``.

    Each worker holds a ``CheckedVectorEnv`` of ``W / N`` copies of ``make_env(env_id)`` in
    ``AutoresetMode.DISABLED`` behind TorchRL's ``GymWrapper``; ``step`` is one
    ``ParallelEnv.step_and_maybe_reset`` (the workers step, then reset their finished envs
    through ``reset_mask``, in one round trip). Seen from here it is a ``SAME_STEP`` vector
    env: ``step`` returns the reset observation where an episode ended and the final one in
    ``info["final_obs"]`` (masked by ``info["_final_obs"]``), and ``reset(seed=s)`` starts
    env ``i`` from ``s + i``, so for the same actions it returns what
    ``make_vector_env(env_id, W)`` returns. Box, Discrete, MultiDiscrete, MultiBinary and
    ``Dict`` observation spaces are supported.

    Workers ignore SIGINT and SIGTERM (the trainer decides when to stop), exit when
    ``close`` is called or when this process dies (their command pipe closes), and a fault
    in a worker (an ``EnvError`` from the checks, or any other exception) raises ``EnvError``
    here with the worker's message, after the workers are shut down.

    Args:
        env_id: see ``resolve_env_id`` (each worker resolves it, importing the module of a
            ``module:EnvId``).
        num_envs: ``W``.
        processes: ``N >= 1``, dividing ``W``.
        kwargs: passed to ``gym.make``.

    Example:
        >>> env = ProcessVectorEnv("rppo_td/CartPoleNoVel-v1", 4, processes=2, kwargs={})
        >>> env.reset(seed=0)[0].shape
        (4, 2)
        >>> env.close()
    """

    def __init__(
        self, env_id: str, num_envs: int, *, processes: int, kwargs: dict[str, Any]
    ) -> None:
        from torchrl.envs import ParallelEnv

        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
            raise ValueError(f"processes must be an int >= 1, got {processes!r}")
        if num_envs % processes:
            raise ValueError(
                f"env {env_id!r}: {processes} worker processes cannot share {num_envs} envs "
                "equally; the number of processes must divide the number of envs"
            )
        self.env_id = resolve_env_id(env_id)
        self.num_envs = num_envs
        self.processes = processes
        self.per_process = num_envs // processes
        probe = _make(self.env_id, kwargs, check_observations=True)  # faults raise here
        self.single_observation_space = probe.observation_space
        self.single_action_space = probe.action_space
        probe.close()
        _check_observation_space(self.single_observation_space, env_id)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.autoreset_mode = AutoresetMode.SAME_STEP
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}
        self.closed = True  # until the workers exist
        # a dying worker writes its fault here (TorchRL cloudpickles and deep-copies the
        # factory, so a multiprocessing queue cannot travel in it; a path can)
        self._errors = tempfile.mkdtemp(prefix="rppo_td-env-errors-")
        self._threads = torch.get_num_threads()
        self._env = ParallelEnv(
            processes,
            _ShardMaker(env_id, kwargs, self.per_process, self._errors),
            mp_start_method="spawn",
            daemon=True,
            shutdown_timeout=2.0,
            num_threads=self._threads,
        )
        self.closed = False
        self._root: Any = None

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict | None = None):
        """Resets every env; ``seed`` ``s`` starts env ``i`` from ``s + i``."""
        if options:
            raise ValueError("ProcessVectorEnv.reset takes no options")
        if seed is None:
            per_worker: list[dict[str, Any]] = [{} for _ in range(self.processes)]
        else:
            seeds = (
                [seed + i for i in range(self.num_envs)] if isinstance(seed, int) else list(seed)
            )
            if len(seeds) != self.num_envs:
                raise ValueError(f"reset: expected {self.num_envs} seeds, got {len(seeds)}")
            p = self.per_process
            per_worker = [{"seed": seeds[k * p : (k + 1) * p]} for k in range(self.processes)]
        self._root = self._call(self._env.reset, list_of_kwargs=per_worker).clone()
        return self._observation(self._root), {}

    def step(self, actions: Any):
        """Steps every env (and resets the finished ones) in the workers."""
        shape = (self.processes, self.per_process, *(self.single_action_space.shape or ()))
        root = self._root
        root.set("action", torch.as_tensor(np.asarray(actions)).reshape(shape))
        out, following = self._call(self._env.step_and_maybe_reset, root)
        nxt = out.get("next")
        w = self.num_envs
        reward = nxt.get("reward").reshape(w).to(torch.float64).numpy()
        terminated = nxt.get("terminated").reshape(w).numpy().copy()
        truncated = nxt.get("truncated").reshape(w).numpy().copy()
        self._root = following.clone()
        info: dict[str, Any] = {}
        done = terminated | truncated
        if done.any():
            final = self._observation(nxt)
            info["final_obs"] = [_index(final, i) if d else None for i, d in enumerate(done)]
            info["_final_obs"] = done
        return self._observation(self._root), reward, terminated, truncated, info

    def close(self, **kwargs: Any) -> None:
        """Shuts the worker processes down (idempotent); keeps this process's torch threads."""
        if self.closed:
            return
        self.closed = True
        try:
            self._env.close(raise_if_closed=False)
        finally:
            torch.set_num_threads(self._threads)
            shutil.rmtree(self._errors, ignore_errors=True)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``; a worker's fault becomes ``EnvError`` (workers shut down)."""
        try:
            return fn(*args, **kwargs)
        except Exception as err:
            reported = self._reported()
            with contextlib.suppress(Exception):  # workers gone already: the fault is the news
                self.close()
            if reported is not None:
                raise reported from None
            first = str(err).splitlines()[0] if str(err) else ""
            raise EnvError(
                f"env {self.env_id!r}: a worker process failed ({type(err).__name__}: {first})"
            ) from err

    def _reported(self) -> EnvError | None:
        """The ``EnvError`` the first dying worker wrote, if any (waits up to 2 s)."""
        deadline = time.monotonic() + 2.0
        while True:
            found = sorted(Path(self._errors).glob("*.json"), key=lambda f: f.stat().st_mtime)
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        try:
            kind, message = json.loads(found[0].read_text())
        except (IndexError, OSError, ValueError):
            return None
        if kind == "EnvError":
            return EnvError(message)
        return EnvError(f"env {self.env_id!r} raised {kind} in a worker process: {message}")

    def _observation(self, td: Any) -> Any:
        """The gymnasium observation ``[W, ...]`` (numpy copies) from TorchRL's ``[N, W/N]``."""
        w = self.num_envs

        def leaf(key: Any, space: gym.Space) -> np.ndarray:
            value = td.get(key).reshape(w, *(space.shape or ())).numpy()
            return value.astype(space.dtype, copy=True)

        return _rebuild(self.single_observation_space, (), leaf)


def _check_observation_space(space: gym.Space, env_id: str) -> None:
    """Refuses observation spaces whose TorchRL keys ``ProcessVectorEnv`` cannot map back."""
    leaf_types = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete)
    if isinstance(space, gym.spaces.Dict):
        for sub in space.spaces.values():
            _check_observation_space(sub, env_id)
    elif not isinstance(space, (*leaf_types, gym.spaces.MultiBinary)):
        raise ValueError(
            f"env {env_id!r}: env processes support Box, Discrete, MultiDiscrete, MultiBinary "
            f"and Dict observations, got {space}; use env_processes=0"
        )


def _rebuild(space: gym.Space, key: tuple[str, ...], leaf: Any) -> Any:
    """The observation of ``space`` with each leaf from ``leaf(torchrl_key, leaf_space)``."""
    if isinstance(space, gym.spaces.Dict):
        return {k: _rebuild(sub, (*key, k), leaf) for k, sub in space.spaces.items()}
    return leaf(key or "observation", space)


def _index(obs: Any, i: int) -> Any:
    """Entry ``i`` of a batched observation (array or dict of arrays)."""
    if isinstance(obs, dict):
        return {k: _index(v, i) for k, v in obs.items()}
    return obs[i]


class _ShardVectorEnv(CheckedVectorEnv):
    """A worker's ``CheckedVectorEnv`` in ``DISABLED`` autoreset mode (TorchRL resets).

    A fault is written to the directory ``errors`` (the parent reads it when the worker is
    found dead) and the worker exits at once, so the trainer shows one error instead of a
    worker's traceback.
    """

    def __init__(self, fns: list[Any], *, env_id: str, errors: str) -> None:
        super().__init__(fns, env_id=env_id)
        self.autoreset_mode = AutoresetMode.DISABLED
        self.metadata = {**self.metadata, "autoreset_mode": AutoresetMode.DISABLED}
        self._error_dir = errors

    def reset(self, *, seed: Any = None, options: dict | None = None):
        """``CheckedVectorEnv.reset``; a fault ends the worker (see the class docstring)."""
        try:
            return super().reset(seed=seed, options=options)
        except Exception as err:
            self._fail(err)
            raise

    def step(self, actions: Any):
        """``CheckedVectorEnv.step``; a fault ends the worker (see the class docstring)."""
        try:
            return super().step(actions)
        except Exception as err:
            self._fail(err)
            raise

    def _fail(self, err: Exception) -> None:
        if mp.parent_process() is None:  # TorchRL probing the env in the main process
            return
        file = Path(self._error_dir) / f"{os.getpid()}.json"
        partial = file.with_suffix(".tmp")
        partial.write_text(json.dumps([type(err).__name__, str(err)]))
        partial.replace(file)  # the parent never reads half a message
        os._exit(1)


class _ShardMaker:
    """Builds one worker's env: ``GymWrapper(_ShardVectorEnv(W / N checked copies))``."""

    def __init__(self, name: str, kwargs: dict[str, Any], num_envs: int, errors: str) -> None:
        self.name = name
        self.kwargs = kwargs
        self.num_envs = num_envs
        self.errors = errors

    def __call__(self) -> Any:
        from torchrl.envs import GymWrapper

        if mp.parent_process() is not None:
            # the trainer decides when to stop; a worker exits on close or when its pipe closes
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        name = resolve_env_id(self.name)
        fns = [_Maker(name, self.kwargs) for _ in range(self.num_envs)]
        env = _ShardVectorEnv(fns, env_id=name, errors=self.errors)
        return GymWrapper(env, categorical_action_encoding=True, device="cpu")
