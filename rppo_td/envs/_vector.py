"""A ``SyncVectorEnv`` that checks each batch of observations at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from rppo_td.envs._checks import EnvError, form_problem, observation_problem, storable_squares

__all__ = ["CheckedVectorEnv"]

# what numpy raises when the sub-envs' observations do not fit the batch buffer
_BATCH_ERRORS = (TypeError, ValueError, KeyError, IndexError)


def _index(obs: Any, i: int) -> Any:
    """Entry ``i`` of a batched observation (array, or dict/tuple of arrays)."""
    if isinstance(obs, dict):
        return {k: _index(v, i) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_index(v, i) for v in obs)
    return obs[i]


class CheckedVectorEnv(SyncVectorEnv):
    """``SyncVectorEnv`` in ``SAME_STEP`` autoreset mode that checks each batch once.

    Its sub-envs check what they return (``EnvChecker`` with ``check_observations=False``:
    every result's form, the reward and flags, and the final observation of an episode that
    ends below gymnasium's ``TimeLimit``). This class checks the final observation of every
    episode that ends (``info["final_obs"]``, a time limit's cut included) and the
    ``[W, ...]`` observations: where the batch buffer refuses one (wrong
    shape or dtype) it names the sub-env and the problem (``form_problem``), and the values
    go through ``observation_problem`` once per batch (for a float ``Box``, one
    ``np.vdot``). Problems raise ``EnvError`` naming the env and the sub-env.

    Args:
        env_fns: one factory per sub-env.
        env_id: the id named in messages.

    Example:
        >>> from rppo_td.envs import make_vector_env
        >>> env = make_vector_env("rppo_td/CartPoleNoVel-v1", 2)
        >>> env.reset(seed=0)[0].shape
        (2, 2)
    """

    def __init__(self, env_fns: Sequence[Callable[[], gym.Env]], *, env_id: str) -> None:
        super().__init__(env_fns, autoreset_mode=AutoresetMode.SAME_STEP)
        self.env_id = env_id
        space = self.single_observation_space
        self._float_box = isinstance(space, gym.spaces.Box) and space.dtype.kind == "f"

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict | None = None):
        """``SyncVectorEnv.reset`` with the observations checked."""
        try:
            obs, info = super().reset(seed=seed, options=options)
        except _BATCH_ERRORS as err:
            self._trace(err, "reset()")
            raise
        self._check_values(obs, "reset()")
        return obs, info

    def step(self, actions: Any):
        """``SyncVectorEnv.step`` with the observations checked."""
        try:
            obs, reward, terminated, truncated, info = super().step(actions)
        except _BATCH_ERRORS as err:
            self._trace(err, "step() or its autoreset")
            raise
        # one BLAS call (storable_squares); where it says no, the exact check may find nothing
        if not self._float_box or not storable_squares(obs):
            self._check_values(obs, "step() or its autoreset")
        ended = info.get("_final_obs")
        if ended is not None and ended.any():
            self._check_final(info["final_obs"], ended)
        return obs, reward, terminated, truncated, info

    def _check_final(self, final: Any, ended: np.ndarray) -> None:
        """The final observations of the episodes that ended (``info["final_obs"]``).

        The sub-env's ``EnvChecker`` sits below gymnasium's ``TimeLimit``, so it does not
        know that a step is the one a time limit cuts: that episode's final observation,
        which the collector bootstraps from, is checked here, for every ended episode alike.
        """
        space = self.single_observation_space
        for i in np.flatnonzero(ended):
            problem = form_problem(final[i], space) or observation_problem(final[i], space)
            if problem:
                raise self._error(int(i), f"in step(), the episode's final observation: {problem}")

    def _error(self, i: int, message: str) -> EnvError:
        return EnvError(f"env {self.env_id!r} (sub-env {i} of {self.num_envs}): {message}")

    def _trace(self, err: Exception, where: str) -> None:
        """Raises ``EnvError`` for the first sub-env whose observation caused ``err``."""
        space = self.single_observation_space
        for i, obs in enumerate(getattr(self, "_env_obs", ())):
            problem = form_problem(obs, space)
            if problem:
                raise self._error(i, f"in {where}, {problem}") from err

    def _check_values(self, obs: Any, where: str) -> None:
        space = self.single_observation_space
        if observation_problem(obs, space) is None:
            return
        for i in range(self.num_envs):
            problem = observation_problem(_index(obs, i), space)
            if problem:
                raise self._error(i, f"in {where}, {problem}")
