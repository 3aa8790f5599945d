"""Multi-process env stepping: TorchRL's ``ParallelEnv`` seen as a ``SAME_STEP`` vector env.

``make_vector_env(env_id, W, processes=N)`` builds a ``ProcessVectorEnv``; each of its ``N``
workers builds its ``W / N`` checked copies with ``rppo_td.envs._make``, as in-process.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from rppo_td._validation import check_int_at_least
from rppo_td.envs._checks import EnvBuildError, EnvError
from rppo_td.envs._make import _make, _Maker, resolve_env_id
from rppo_td.envs._vector import CheckedVectorEnv

__all__ = ["ProcessVectorEnv"]


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

        check_int_at_least("processes", processes, 1)
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
        # the workers ignore SIGTERM, which is how multiprocessing ends daemon children at
        # interpreter exit before it joins them: an env never closed (a Trainer built and
        # never run) held the exit forever. Registered now, after multiprocessing's own exit
        # function, so it runs first (atexit is last in, first out); also run when this env
        # is collected.
        self._shut_down = weakref.finalize(self, _shut_down, self._env, self._errors, self._threads)
        self._shut_down.atexit = False
        atexit.register(self._shut_down)
        self.closed = False
        self._answered = False  # whether any call to the workers came back
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
        atexit.unregister(self._shut_down)
        self._shut_down()

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``; a worker's fault becomes ``EnvError`` (workers shut down)."""
        try:
            out = fn(*args, **kwargs)
        except Exception as err:
            reported = self._reported()
            with contextlib.suppress(Exception):  # workers gone already: the fault is the news
                self.close()
            if reported is not None:
                raise reported from None
            first = str(err).splitlines()[0] if str(err) else ""
            hint = ""
            if not self._answered and isinstance(err, EOFError | ConnectionError):
                # the pipe closed before any worker answered
                hint = _SPAWN_HINT_STDIN if _main_from_stdin() else _SPAWN_HINT
            raise EnvError(
                f"env {self.env_id!r}: a worker process failed ({type(err).__name__}: "
                f"{first}){hint}"
            ) from err
        self._answered = True
        return out

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
        if kind == "EnvBuildError":
            return EnvBuildError(message)
        return EnvError(f"env {self.env_id!r} raised {kind} in a worker process: {message}")

    def _observation(self, td: Any) -> Any:
        """The gymnasium observation ``[W, ...]`` (numpy copies) from TorchRL's ``[N, W/N]``."""
        w = self.num_envs

        def leaf(key: Any, space: gym.Space) -> np.ndarray:
            value = td.get(key).reshape(w, *(space.shape or ())).numpy()
            return value.astype(space.dtype, copy=True)

        return _rebuild(self.single_observation_space, (), leaf)


# why a worker died before it answered: the workers are spawned and import the main module
_SPAWN_HINT = (
    "; a worker that dies as it starts is often a script that makes the envs when imported: "
    "the workers are spawned and import the main module again, so put that code under "
    "`if __name__ == '__main__':` (the worker's own traceback is on stderr)"
)
_SPAWN_HINT_STDIN = (
    "; the workers are spawned and import the main module again, which a script read from "
    "stdin (python - < script.py) cannot give them: run the script from its file, or use "
    "env_processes=0"
)


def _main_from_stdin() -> bool:
    """Whether the main module is a script read from stdin (``python - < script.py``)."""
    return getattr(sys.modules.get("__main__"), "__file__", None) == "<stdin>"


def _shut_down(env: Any, errors: str, threads: int) -> None:
    """``ProcessVectorEnv.close``'s work: the workers stopped, the error folder removed."""
    # from __dict__: ParallelEnv's __getattr__ would start workers that were never started
    workers = list(vars(env).get("_workers", ()))
    try:
        env.close(raise_if_closed=False)
    finally:
        _kill_left(workers)
        torch.set_num_threads(threads)
        shutil.rmtree(errors, ignore_errors=True)


def _kill_left(workers: list[Any], wait: float = 1.0) -> None:
    """Kills the worker processes still alive after ``ParallelEnv.close``.

    Where one worker died, TorchRL's ``close`` fails on it before it shuts the others down,
    and they ignore SIGTERM (``_ShardMaker``): a live one held this process at exit forever.
    """
    deadline = time.monotonic() + wait
    for process in workers:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    for process in workers:
        if process.is_alive():
            process.kill()
            process.join(timeout=wait)


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
        from torchrl.data import Unbounded
        from torchrl.envs import GymWrapper

        if mp.parent_process() is not None:
            # the trainer decides when to stop; a worker exits on close or when its pipe closes
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        name = resolve_env_id(self.name)
        fns = [_Maker(name, self.kwargs) for _ in range(self.num_envs)]
        env = _ShardVectorEnv(fns, env_id=name, errors=self.errors)
        wrapped = GymWrapper(env, categorical_action_encoding=True, device="cpu")
        # rewards cross to the parent as the envs returned them (float64), as in-process; the
        # wrapper's float32 would round them (a PocMemory return of -3.08 read -3.0800000459)
        spec = wrapped.reward_spec
        wrapped.reward_spec = Unbounded(shape=spec.shape, dtype=torch.float64, device=spec.device)
        return wrapped
