"""Checks on what an env returns: the gymnasium API, observations against the space, values.

``EnvChecker`` sits directly around what an env's entry point builds, below gymnasium's
``TimeLimit`` (which would otherwise fail first on a bad return, with its own message). On
each call it tests the types of the results with a short chain of cheap checks (exact, slow
checks run only when one fails) and turns an exception raised by the env into one
``EnvError`` naming the env. Observations (form and values) are checked on every call when
the env is used alone; inside a vector env only an episode's final one is (where the env
itself ends it: a time limit's cut is above this wrapper), and ``CheckedVectorEnv`` checks the
batch and every episode's final observation (``observation_problem`` works on one
observation and on a batch alike).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["EnvChecker", "EnvError", "form_problem", "observation_problem", "short_repr"]

_REAL_TYPES = frozenset({float, int, np.float64, np.float32, np.int64, np.int32})
_BOOL_TYPES = frozenset({bool, np.bool_})
_INT_TYPES = frozenset({int, np.int64, np.int32})
_isfinite = math.isfinite
# rewards are stored as float32: a larger one (a float64 1e39) would be stored as inf
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def storable_squares(obs: Any) -> bool:
    """Whether every entry of float observation ``obs`` is sure to stay finite as float32.

    ``obs``: an array, or what a ``Box`` space takes for one (a list, a number).

    One BLAS call (``np.vdot``, cheaper than ``np.isfinite(obs).all()``): the sum of squares is
    finite only if every entry is, and at most float32's largest value squared only if every
    entry's magnitude is at most that value (rollouts store float observations as float32).
    False does not mean a problem: an overflowing sum is checked entry by entry
    (``observation_problem``).
    """
    if type(obs) is not np.ndarray:
        obs = np.asarray(obs)
    squares = np.vdot(obs, obs)
    return math.isfinite(squares) and (obs.dtype.itemsize <= 4 or squares <= _FLOAT32_SQUARED)


_FLOAT32_SQUARED = _FLOAT32_MAX * _FLOAT32_MAX


# the magnitude from which float32 rounds to inf: its largest value plus half its last step
# (2**104 / 2; a tie rounds to the even neighbour, inf); below it, to the largest value
_FLOAT32_EDGE = _FLOAT32_MAX + 2.0**103


def _becomes_inf(arr: np.ndarray) -> bool:
    """Whether finite float ``arr`` (wider than float32) holds a value float32 makes inf."""
    return bool(np.abs(arr).max() >= _FLOAT32_EDGE)


def _storable(reward: Any) -> bool:
    """A real reward that stays finite as float32 (False for NaN and inf too)."""
    return bool(-_FLOAT32_EDGE < reward < _FLOAT32_EDGE)


_ARRAY_SPACES = (
    gym.spaces.Box,
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
)


class EnvError(RuntimeError):
    """An env raised, or returned something that breaks the gymnasium API or its spaces.

    The message names the env id, the call (``reset()``/``step()``) and what was wrong,
    expected against actual; an exception raised by the env is chained as ``__cause__``.

    Example:
        >>> class OldApi(gym.Env):
        ...     observation_space = action_space = gym.spaces.Discrete(2)
        ...     def reset(self, *, seed=None, options=None):
        ...         return 0
        >>> try:
        ...     EnvChecker(OldApi(), "OldApi-v0", check_observations=True).reset()
        ... except EnvError as err:
        ...     print(err)
        env 'OldApi-v0': reset() returned 0 (int), expected a tuple (observation, info dict)...
    """


class EnvBuildError(EnvError):
    """The env could not be built (entry point, constructor, or not a ``gymnasium.Env``).

    Its entry point did not load, its constructor raised, or it returned something other
    than a ``gymnasium.Env``. A setting that cannot run, as an unknown id is (``rppo-train``
    exits with status 2); an ``EnvError`` otherwise is an env failing while it runs (1).
    """


def short_repr(value: Any) -> str:
    """A one-line, truncated ``repr`` of ``value`` for error messages."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        text = repr(value.item())
    elif isinstance(value, np.ndarray):
        text = np.array2string(value, threshold=8, precision=4, separator=", ")
        text = f"array({text}, dtype={value.dtype})"
    else:
        text = repr(value)
    text = " ".join(text.split())
    return text if len(text) <= 120 else text[:117] + "..."


def _describe(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape} and dtype {value.dtype}"
    if value is None:
        return "None"
    return f"{short_repr(value)} ({type(value).__name__})"


def form_problem(obs: Any, space: gym.Space, label: str = "observation") -> str | None:
    """Why ``obs`` does not have the type, shape and dtype ``space`` needs, or None.

    Shapes must match exactly; dtypes must cast to the space's with numpy's ``same_kind``
    rule (so no floats for an integer space), and integers must fit it.
    """
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(obs, Mapping):
            return f"{label} is {_describe(obs)}, expected a dict with keys {list(space.spaces)}"
        for key, sub in space.spaces.items():
            if key not in obs:
                return f"{label} has no key {key!r} (keys {list(obs)}, expected {list(space)})"
            problem = form_problem(obs[key], sub, f"{label}[{key!r}]")
            if problem:
                return problem
        return None
    if isinstance(space, gym.spaces.Tuple):
        if not isinstance(obs, tuple | list) or len(obs) != len(space.spaces):
            return f"{label} is {_describe(obs)}, expected a tuple of {len(space.spaces)}"
        for i, (value, sub) in enumerate(zip(obs, space.spaces, strict=True)):
            problem = form_problem(value, sub, f"{label}[{i}]")
            if problem:
                return problem
        return None
    if not isinstance(space, _ARRAY_SPACES):
        return None  # other spaces are refused when the env is built
    try:
        arr = np.asarray(obs)
    except (TypeError, ValueError) as err:
        return f"{label} is {_describe(obs)}, which is not an array ({err})"
    shape = tuple(space.shape or ())
    if arr.shape != shape:
        return f"{label} has shape {arr.shape}, expected {shape} ({space})"
    dtype = np.dtype(space.dtype) if space.dtype is not None else np.dtype(np.int64)
    # the rule a vector env's batch buffer applies (np.stack(..., out=...)); no floats
    # into an integer space, which would be truncated
    if not np.can_cast(arr.dtype, dtype, "same_kind"):
        return f"{label} has dtype {arr.dtype}, expected one castable to {dtype} ({space})"
    if dtype.kind in "iu" and not np.can_cast(arr.dtype, dtype) and arr.size:
        info = np.iinfo(dtype)
        if arr.min() < info.min or arr.max() > info.max:
            return f"{label} has values {short_repr(arr)} that do not fit {dtype} ({space})"
    return None


def observation_problem(obs: Any, space: gym.Space, label: str = "observation") -> str | None:
    """Why the values of ``obs`` are bad for ``space`` (NaN/inf, out of range), or None.

    Works on one observation and on a batch with leading dims alike (the checks are
    elementwise): float ``Box`` values must be finite, ``Discrete``/``MultiDiscrete`` values in
    ``[start, start + n)`` and ``MultiBinary`` values 0 or 1. The form (shape, dtype) is
    assumed checked already. ``Box`` bounds, float or integer, are not enforced: many envs'
    observations stray past the bounds they declare, and the agent reads them anyway.
    """
    low: Any
    high: Any
    if isinstance(space, gym.spaces.Box):
        if space.dtype is None or space.dtype.kind != "f":
            return None
        arr = np.asarray(obs)
        if not np.isfinite(arr).all():
            return f"{label} contains NaN or inf: {short_repr(arr)}"
        if arr.size and arr.dtype.itemsize > 4 and _becomes_inf(arr):
            return (
                f"{label} holds {float(arr.flat[np.abs(arr).argmax()])!r}, beyond float32's "
                f"range (magnitude at most {_FLOAT32_MAX:.4g}), the dtype rollouts store "
                "observations in: it would be inf; scale the env's observations down"
            )
        return None
    if isinstance(space, gym.spaces.Discrete):
        low, high = int(space.start), int(space.start) + int(space.n)
    elif isinstance(space, gym.spaces.MultiDiscrete):
        low, high = space.start, space.start + space.nvec
    elif isinstance(space, gym.spaces.MultiBinary):
        low, high = 0, 2
    elif isinstance(space, gym.spaces.Dict):
        for key, sub in space.spaces.items():
            problem = observation_problem(obs[key], sub, f"{label}[{key!r}]")
            if problem:
                return problem
        return None
    elif isinstance(space, gym.spaces.Tuple):
        for i, sub in enumerate(space.spaces):
            problem = observation_problem(obs[i], sub, f"{label}[{i}]")
            if problem:
                return problem
        return None
    else:
        return None
    arr = np.asarray(obs)
    if not ((arr >= low) & (arr < high)).all():
        return f"{label} is {short_repr(arr)}, outside {space}"
    return None


def _reward_problem(reward: Any) -> str | None:
    if isinstance(reward, numbers.Real | np.bool_):
        return None
    if isinstance(reward, np.ndarray) and reward.ndim == 0 and reward.dtype.kind in "biuf":
        return None
    return f"reward is {_describe(reward)}, expected a scalar number (float)"


def _flag_problem(value: Any, name: str) -> str | None:
    if isinstance(value, bool | np.bool_):
        return None
    if isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "biu":
        value = value.item()
    if isinstance(value, numbers.Integral) and value in (0, 1):
        return None
    return f"{name} is {_describe(value)}, expected a bool"


class EnvChecker(gym.Wrapper):
    """Checks every ``reset``/``step`` of ``env`` and raises ``EnvError`` naming ``env_id``.

    Raises on: an exception inside the env's ``reset``/``step`` (chained); ``reset`` not
    returning ``(obs, info)`` or ``step`` not returning ``(obs, reward, terminated,
    truncated, info)`` (the old gym APIs); a non-scalar or non-finite reward; a non-bool
    ``terminated``/``truncated``; a non-dict ``info``; an observation whose type, shape or
    dtype does not fit ``env.observation_space`` (``form_problem``), or with NaN/inf or
    out-of-range discrete values (``observation_problem``). Like gymnasium's
    ``OrderEnforcing`` (which ``make_env`` leaves out), a ``step`` before the first ``reset``
    raises ``gymnasium.error.ResetNeeded``; so does a ``step`` after the env ended the
    episode (terminated, or truncated by its own limit), which envs answer with anything
    (moving on past the goal, paying again, or no end flag at all). Gymnasium's ``TimeLimit``,
    above this wrapper, goes on answering truncated after its own limit.

    Observations are checked on every call with ``check_observations``; without it only
    each episode's final one is (``CheckedVectorEnv`` checks the others as one batch, and
    its batch buffer refuses a wrong shape or dtype, which it then traces to the sub-env).

    Args:
        env: the env as its entry point built it.
        env_id: the id named in messages.
        check_observations: check every observation here.

    Example:
        >>> from gymnasium.envs.classic_control.cartpole import CartPoleEnv
        >>> env = EnvChecker(CartPoleEnv(), "CartPole-v1", check_observations=True)
        >>> env.reset(seed=0)[0].shape
        (4,)
    """

    def __init__(self, env: gym.Env, env_id: str, *, check_observations: bool) -> None:
        super().__init__(env)
        self.env_id = env_id
        self.check_observations = check_observations
        # why a step must wait for a reset, None once one is done
        self._needs_reset: str | None = "before reset()"
        space = env.observation_space
        box = isinstance(space, gym.spaces.Box)
        self._float_box = box and space.dtype is not None and space.dtype.kind == "f"
        self._shape = space.shape if box else None
        self._dtype = space.dtype if box else None
        self._discrete = isinstance(space, gym.spaces.Discrete)

    def _error(self, message: str) -> EnvError:
        return EnvError(f"env {self.env_id!r}: {message}")

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """``env.reset`` with its result checked."""
        try:
            result = self.env.reset(seed=seed, options=options)
        except EnvError:
            raise
        except Exception as err:
            raise self._error(f"raised {type(err).__name__} in reset(): {err}") from err
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict)):
            raise self._error(
                f"reset() returned {_describe(result)}, expected a tuple (observation, info "
                "dict); returning the observation only is the old gym API"
            )
        if self.check_observations:
            self._check_observation(result[0], "reset()")
        self._needs_reset = None
        return result

    def step(self, action: Any):
        """``env.step`` with its result checked; one chain of type tests on the common path."""
        if self._needs_reset is not None:
            raise gym.error.ResetNeeded(
                f"env {self.env_id!r}: cannot call step() {self._needs_reset}"
            )
        try:
            result = self.env.step(action)
        except EnvError:
            raise
        except Exception as err:
            raise self._error(f"raised {type(err).__name__} in step(): {err}") from err
        try:
            obs, reward, terminated, truncated, info = result
        except (TypeError, ValueError):
            raise self._step_form_error(result) from None
        if not (
            type(reward) in _REAL_TYPES
            and type(terminated) in _BOOL_TYPES
            and type(truncated) in _BOOL_TYPES
            and type(info) is dict
            and _storable(reward)
        ):
            result = self._step_slow(result)
        if terminated or truncated:
            self._needs_reset = "after the episode ended; call reset()"
            self._check_observation(obs, "step()")
        elif self.check_observations:
            self._check_observation(obs, "step()")
        return result

    def _step_form_error(self, result: Any) -> EnvError:
        if isinstance(result, tuple | list) and len(result) == 4:
            return self._error(
                "step() returned 4 values (observation, reward, done, info), the old gym API; "
                "expected 5: (observation, reward, terminated, truncated, info)"
            )
        return self._error(
            f"step() returned {_describe(result)}, expected a tuple of 5: "
            "(observation, reward, terminated, truncated, info)"
        )

    def _step_slow(self, result: tuple) -> tuple:
        """The exact checks of a step's reward, flags and info; returns them as plain types."""
        obs, reward, terminated, truncated, info = result
        for problem in (
            _reward_problem(reward),
            _flag_problem(terminated, "terminated"),
            _flag_problem(truncated, "truncated"),
            None if isinstance(info, dict) else f"info is {_describe(info)}, expected a dict",
        ):
            if problem:
                raise self._error(f"in step(), {problem}")
        if not _isfinite(reward):
            raise self._error(f"in step(), reward is {reward!r}, expected a finite number")
        if not _storable(reward):  # finite here: beyond float32's range
            raise self._error(
                f"in step(), reward is {reward!r}, beyond float32's range (magnitude at most "
                f"{_FLOAT32_MAX:.4g}), the dtype rollouts store rewards in: it would be inf; "
                "scale the env's rewards down"
            )
        return obs, float(reward), bool(terminated), bool(truncated), info

    def _check_observation(self, obs: Any, where: str) -> None:
        space = self.env.observation_space
        if (self._discrete and type(obs) in _INT_TYPES) or (
            type(obs) is np.ndarray and obs.shape == self._shape and obs.dtype == self._dtype
        ):
            problem = None
        else:
            problem = form_problem(obs, space)
        if problem is None:
            if self._float_box and storable_squares(obs):
                return
            problem = observation_problem(obs, space)
        if problem:
            raise self._error(f"in {where}, {problem}")
