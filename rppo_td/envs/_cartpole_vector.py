"""``W`` masked CartPoles stepped as arrays, with the episodes of ``W`` separate copies."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.error import ResetNeeded
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from rppo_td._validation import check_int_at_least
from rppo_td.envs._cartpole_state import (
    HIGH,
    LOW,
    bounds_of,
    copies_state,
    reset_rows,
    saved_state,
    seeds_of,
)
from rppo_td.envs._checks import EnvError

__all__ = ["CartPoleNoVelVectorEnv"]

# CartPole-v1's constants (gymnasium's CartPoleEnv)
GRAVITY, MASS_CART, MASS_POLE, HALF_LENGTH, FORCE, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
TOTAL_MASS = MASS_CART + MASS_POLE
POLE_MASS_LENGTH = MASS_POLE * HALF_LENGTH
X_LIMIT = 2.4
THETA_LIMIT = 12 * 2 * np.pi / 360
KEPT = np.array([0, 2])  # cart position and pole angle
_NO_COPIES = (
    "CartPoleNoVelVectorEnv steps its copies as arrays and has no sub-env objects for {}; "
    "make_vector_env(..., arrays=False) gives the checked copies in a SyncVectorEnv"
)


class CartPoleNoVelVectorEnv(gym.vector.VectorEnv):
    """``rppo_td/CartPoleNoVel-v1`` x ``W`` as one array program, ``SAME_STEP`` autoreset.

    The episodes are those of ``make_vector_env``'s ``W`` checked copies, to the bit: each
    copy's state is a row of one ``[W, 4]`` float64 array stepped with CartPole-v1's Euler
    update in the same order of operations, copy ``i`` draws its resets from its own
    generator (seeded ``seed + i`` by ``reset(seed=seed)``, as ``SyncVectorEnv`` seeds its
    copies), and a copy is truncated after ``max_episode_steps`` (500, gymnasium's
    ``TimeLimit``). Only the Python work of ``W`` env objects and their wrappers per step is
    gone; ``tests/unit/test_cartpole_vector.py`` checks the equality against the copies.

    Observations ``[W, 2]`` float32 (cart position, pole angle); actions ``[W]`` integers
    in ``{0, 1}``; rewards ``[W]`` float64 (1 per step, or with ``sutton_barto_reward`` -1
    on a termination and 0 otherwise); ``terminated`` and ``truncated`` ``[W]`` bool. Where
    an episode ends the step returns the copy's reset observation and puts the final one in
    ``info["final_obs"]`` (an object array, masked by ``info["_final_obs"]``), as
    ``SyncVectorEnv`` does in ``SAME_STEP`` mode.

    ``get_state`` and ``set_state`` hand its whole state (arrays and generators) out and back
    for a checkpoint, so that a resumed run goes on exactly.

    Args:
        num_envs: ``W >= 1``.
        max_episode_steps: the time limit (a truncation).
        sutton_barto_reward: CartPole's alternative reward.

    Example:
        >>> env = CartPoleNoVelVectorEnv(3)
        >>> obs, info = env.reset(seed=0)
        >>> obs.shape, env.single_action_space
        ((3, 2), Discrete(2))
        >>> obs, reward, terminated, truncated, info = env.step(np.array([0, 1, 1]))
        >>> reward.shape, terminated.dtype
        ((3,), dtype('bool'))
    """

    metadata = {  # noqa: RUF012 (VectorEnv declares it an instance attribute)
        "autoreset_mode": AutoresetMode.SAME_STEP,
        "render_modes": [],
        "render_fps": 50,
    }

    def __init__(
        self,
        num_envs: int,
        *,
        max_episode_steps: int | None = 500,
        sutton_barto_reward: bool = False,
    ) -> None:
        check_int_at_least("num_envs", num_envs, 1)
        if max_episode_steps is None:  # gym.make's None: the registered limit
            max_episode_steps = 500
        check_int_at_least("max_episode_steps", max_episode_steps, 1)
        self.num_envs = num_envs
        self.autoreset_mode = AutoresetMode.SAME_STEP
        self.max_episode_steps = max_episode_steps
        self.sutton_barto_reward = bool(sutton_barto_reward)
        high = np.array([X_LIMIT * 2, np.inf, THETA_LIMIT * 2, np.inf], dtype=np.float32)
        self.single_observation_space = gym.spaces.Box(-high[KEPT], high[KEPT], dtype=np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.state = np.zeros((num_envs, 4), dtype=np.float64)
        self.elapsed = np.zeros(num_envs, dtype=np.int64)
        self.generators: list[np.random.Generator | None] = [None] * num_envs
        self._seeds = [-1] * num_envs  # each copy's np_random_seed (-1: set from a state)
        self._started = False

    # ---- the vector env interface ---------------------------------------------------------
    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Resets the copies (all, or ``options["reset_mask"]``'s); returns every copy's obs.

        ``seed``: None (each copy's generator goes on), ``s`` (copy ``i`` gets ``s + i``) or
        one entry per copy. ``options`` may hold ``"low"`` and ``"high"``, the reset bounds of
        every state entry (CartPole's default is ``-0.05`` to ``0.05``), and ``"reset_mask"``
        (``[W]`` bool: the copies to reset). Everything is checked before anything changes.
        """
        options = dict(options or {})
        seeds = seeds_of(seed, self.num_envs)
        rows = reset_rows(options, self.num_envs, self._started)
        low, high = bounds_of(options)
        for i in rows:
            if seeds[i] is not None or self.generators[i] is None:
                self.generators[i], self._seeds[i] = seeding.np_random(seeds[i])
        self._reset_rows(rows, low, high)
        self._started = True
        return self._observe(), {}

    @property  # as SyncVectorEnv's: one per copy
    def np_random_seed(self) -> tuple[int, ...]:  # type: ignore[override]
        """Each copy's seed (``-1`` where its generator came from a saved state)."""
        return tuple(self._seeds)

    @property  # type: ignore[misc]
    def np_random(self) -> tuple[np.random.Generator | None, ...]:  # type: ignore[override]
        """Each copy's generator (None before the first reset)."""
        return tuple(self.generators)

    def step(
        self, actions: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Steps every copy with ``actions`` ``[W]``; resets the copies whose episode ended."""
        if not self._started:
            raise ResetNeeded("CartPoleNoVelVectorEnv: call reset() before step()")
        push = self._push(actions)
        x, x_dot, theta, theta_dot = self.state.T
        cos, sin = np.cos(theta), np.sin(theta)
        temp = (push + POLE_MASS_LENGTH * np.square(theta_dot) * sin) / TOTAL_MASS
        theta_acc = (GRAVITY * sin - cos * temp) / (
            HALF_LENGTH * (4.0 / 3.0 - MASS_POLE * np.square(cos) / TOTAL_MASS)
        )
        x_acc = temp - POLE_MASS_LENGTH * theta_acc * cos / TOTAL_MASS
        x, x_dot = x + TAU * x_dot, x_dot + TAU * x_acc
        theta, theta_dot = theta + TAU * theta_dot, theta_dot + TAU * theta_acc
        self.state = np.stack((x, x_dot, theta, theta_dot), axis=1)
        terminated = (x < -X_LIMIT) | (x > X_LIMIT) | (theta < -THETA_LIMIT) | (theta > THETA_LIMIT)
        self.elapsed += 1
        truncated = self.elapsed >= self.max_episode_steps
        if self.sutton_barto_reward:
            reward = np.where(terminated, -1.0, 0.0)
        else:
            reward = np.ones(self.num_envs, dtype=np.float64)
        obs = self._observe()
        info: dict[str, Any] = {}
        done = terminated | truncated
        if done.any():
            ended = np.flatnonzero(done)
            final = np.full(self.num_envs, None, dtype=object)
            for i in ended:
                final[i] = obs[i].copy()
            info = {"final_obs": final, "_final_obs": done.copy(), "final_info": {}}
            info["_final_info"] = done.copy()
            # an autoreset uses CartPole's own bounds, as a copy's reset() without options
            self._reset_rows(ended, LOW, HIGH)
            obs[ended] = self.state[ended][:, KEPT]
        return obs, reward, terminated, truncated, info

    def render(self) -> None:
        """Refused: the copies as arrays draw nothing."""
        raise NotImplementedError(
            "CartPoleNoVelVectorEnv does not render; make_vector_env(..., "
            "render_mode='rgb_array') gives the checked copies, which do"
        )

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Refused: there are no sub-env objects (``SyncVectorEnv`` has them)."""
        raise NotImplementedError(_NO_COPIES.format(f"get_attr({name!r})"))

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Refused: there are no sub-env objects (``SyncVectorEnv`` has them)."""
        raise NotImplementedError(_NO_COPIES.format(f"call({name!r})"))

    def set_attr(self, name: str, values: Any) -> None:
        """Refused: there are no sub-env objects (``SyncVectorEnv`` has them)."""
        raise NotImplementedError(_NO_COPIES.format(f"set_attr({name!r})"))

    def close_extras(self, **kwargs: Any) -> None:
        """Nothing to release."""

    # ---- checkpoints ----------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """Everything the next steps depend on, copied: for ``pickle`` and ``set_state``."""
        return {
            "num_envs": self.num_envs,
            "state": self.state.copy(),
            "elapsed": self.elapsed.copy(),
            "generators": [None if g is None else g.bit_generator.state for g in self.generators],
            "started": self._started,
        }

    def set_state(self, saved: dict[str, Any]) -> None:
        """Restores ``get_state()``'s output (of an env with the same ``num_envs``).

        The whole of ``saved`` is checked first (``ValueError`` naming what is wrong), so a
        refused state leaves the env as it was.
        """
        self.state, self.elapsed, self.generators, self._started = saved_state(saved, self.num_envs)
        self._seeds = [-1] * self.num_envs

    def copies_state(self, envs: list[gym.Env]) -> dict[str, Any]:
        """``get_state()``'s form for ``W`` separate copies (``make_env``'s, reset before).

        Lets a checkpoint of the checked copies resume here exactly; copies of another env,
        time limit or reward are refused.
        """
        return copies_state(envs, self.num_envs, self.max_episode_steps, self.sutton_barto_reward)

    # ---- helpers --------------------------------------------------------------------------
    def _push(self, actions: Any) -> np.ndarray:
        """``[W]`` actions -> ``[W]`` forces, refusing anything but ``W`` integers in {0, 1}."""
        actions = np.asarray(actions)
        if (
            actions.shape != (self.num_envs,)
            or actions.dtype.kind not in "iu"
            or actions.min() < 0
            or actions.max() > 1
        ):
            raise EnvError(
                f"env 'rppo_td/CartPoleNoVel-v1': expected {self.num_envs} integer actions in "
                f"{{0, 1}} (shape ({self.num_envs},)), got shape {actions.shape} dtype "
                f"{actions.dtype}: {actions.ravel()[:8].tolist()}"
            )
        return np.where(actions == 1, FORCE, -FORCE)

    def _reset_rows(self, rows: np.ndarray, low: float, high: float) -> None:
        for i in rows:
            generator = self.generators[i]
            assert generator is not None  # reset() made one for every copy
            self.state[i] = generator.uniform(low=low, high=high, size=(4,))
        self.elapsed[rows] = 0

    def _observe(self) -> np.ndarray:
        return np.ascontiguousarray(self.state[:, KEPT], dtype=np.float32)
