"""``W`` masked CartPoles stepped as arrays, with the episodes of ``W`` separate copies."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.utils import seeding
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from rppo_td.envs._checks import EnvError

__all__ = ["CartPoleNoVelVectorEnv"]

# CartPole-v1's constants (gymnasium's CartPoleEnv)
GRAVITY, MASS_CART, MASS_POLE, HALF_LENGTH, FORCE, TAU = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
TOTAL_MASS = MASS_CART + MASS_POLE
POLE_MASS_LENGTH = MASS_POLE * HALF_LENGTH
X_LIMIT = 2.4
THETA_LIMIT = 12 * 2 * np.pi / 360
KEPT = np.array([0, 2])  # cart position and pole angle
LOW, HIGH = -0.05, 0.05  # the reset bounds of every state entry


class CartPoleNoVelVectorEnv(gym.vector.VectorEnv):
    """``rppo_td/CartPoleNoVel-v1`` x ``W`` as one array program, ``SAME_STEP`` autoreset.

    The episodes are those of ``make_vector_env``'s ``W`` checked copies, to the bit: each
    copy's state is a row of one ``[W, 4]`` float64 array stepped with CartPole-v1's Euler
    update in the same order of operations, copy ``i`` draws its resets from its own
    generator (seeded ``seed + i`` by ``reset(seed=seed)``, as ``SyncVectorEnv`` seeds its
    copies), and a copy is truncated after 500 steps (gymnasium's ``TimeLimit``). Only the
    Python work of ``W`` env objects and their wrappers per step is gone. The properties
    test checks the equality against the checked copies.

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
        self, num_envs: int, *, max_episode_steps: int = 500, sutton_barto_reward: bool = False
    ) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be an int >= 1, got {num_envs!r}")
        if max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1, got {max_episode_steps}")
        self.num_envs = num_envs
        self.autoreset_mode = AutoresetMode.SAME_STEP
        self.max_episode_steps = max_episode_steps
        self.sutton_barto_reward = sutton_barto_reward
        high = np.array([X_LIMIT * 2, np.inf, THETA_LIMIT * 2, np.inf], dtype=np.float32)
        self.single_observation_space = gym.spaces.Box(-high[KEPT], high[KEPT], dtype=np.float32)
        self.single_action_space = gym.spaces.Discrete(2)
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.state = np.zeros((num_envs, 4), dtype=np.float64)
        self.elapsed = np.zeros(num_envs, dtype=np.int64)
        self.generators: list[np.random.Generator | None] = [None] * num_envs
        self._started = False

    # ---- the vector env interface ---------------------------------------------------------
    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Resets every copy; ``seed`` int: copy ``i`` gets ``seed + i``; a list: one each.

        ``options`` may hold ``"low"`` and ``"high"``, the reset bounds of every state entry
        (CartPole's default is ``-0.05`` to ``0.05``).
        """
        if seed is None:
            seeds: list[int | None] = [None] * self.num_envs
        elif isinstance(seed, int) and not isinstance(seed, bool):
            seeds = [seed + i for i in range(self.num_envs)]
        elif isinstance(seed, list | tuple):
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(
                    f"reset(seed=...): expected {self.num_envs} seeds, got {len(seeds)}"
                )
        else:
            raise ValueError(f"reset(seed=...): expected an int, a list or None, got {seed!r}")
        for i, one in enumerate(seeds):
            if one is not None or self.generators[i] is None:
                self.generators[i] = seeding.np_random(one)[0]
        options = options or {}
        low, high = float(options.get("low", LOW)), float(options.get("high", HIGH))
        if not low <= high:
            raise ValueError(f"reset options: expected low <= high, got {low} and {high}")
        self._reset_rows(np.arange(self.num_envs), low, high)
        self._started = True
        return self._observe(), {}

    def step(
        self, actions: Any
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Steps every copy with ``actions`` ``[W]``; resets the copies whose episode ended."""
        if not self._started:
            raise RuntimeError("CartPoleNoVelVectorEnv: call reset() before step()")
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
        """Restores ``get_state()``'s output (of an env with the same ``num_envs``)."""
        if saved.get("num_envs") != self.num_envs:
            raise ValueError(
                f"saved CartPole state: expected {self.num_envs} envs, got {saved.get('num_envs')}"
            )
        self.state = np.array(saved["state"], dtype=np.float64).reshape(self.num_envs, 4)
        self.elapsed = np.array(saved["elapsed"], dtype=np.int64).reshape(self.num_envs)
        self.generators = []
        for bits in saved["generators"]:
            generator = None
            if bits is not None:
                generator = seeding.np_random(0)[0]
                generator.bit_generator.state = bits
            self.generators.append(generator)
        self._started = bool(saved["started"])

    def copies_state(self, envs: list[gym.Env]) -> dict[str, Any]:
        """``get_state()``'s form for ``W`` separate copies (``make_env``'s, reset before).

        Lets a checkpoint of the checked copies resume here exactly.
        """
        if len(envs) != self.num_envs:
            raise ValueError(f"saved envs: expected {self.num_envs} envs, got {len(envs)}")
        rows, elapsed, generators = [], [], []
        for env in envs:
            limit = env
            while not isinstance(limit, gym.wrappers.TimeLimit):
                if not isinstance(limit, gym.Wrapper):
                    raise ValueError(f"saved env {env} has no TimeLimit: not a CartPole copy")
                limit = limit.env
            rows.append(np.asarray(env.unwrapped.state, dtype=np.float64))  # type: ignore[attr-defined]
            elapsed.append(int(limit._elapsed_steps or 0))
            generators.append(env.unwrapped.np_random.bit_generator.state)
        return {
            "num_envs": self.num_envs,
            "state": np.stack(rows),
            "elapsed": np.array(elapsed),
            "generators": generators,
            "started": True,
        }

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
        return self.state[:, KEPT].astype(np.float32)
