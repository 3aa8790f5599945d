"""Rollouts from a gymnasium vector env into a TorchRL-keyed ``[W, T]`` TensorDict."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from rppo_td.agent import RecurrentActorCritic, observation_to_tensordict

__all__ = ["EpisodeStats", "VectorCollector"]


class EpisodeStats:
    """Running return and length per env; finished episodes are appended to lists."""

    def __init__(self, num_envs: int) -> None:
        self.running_return = np.zeros(num_envs, dtype=np.float64)
        self.running_length = np.zeros(num_envs, dtype=np.int64)
        self.returns: list[float] = []
        self.lengths: list[int] = []

    def update(self, reward: np.ndarray, done: np.ndarray) -> None:
        """Adds ``reward`` ``[W]``; closes the episodes where ``done`` ``[W]``."""
        self.running_return += reward
        self.running_length += 1
        if done.any():
            self.returns.extend(self.running_return[done].tolist())
            self.lengths.extend(self.running_length[done].tolist())
            self.running_return[done] = 0.0
            self.running_length[done] = 0

    def pop(self) -> tuple[list[float], list[int]]:
        """Returns and clears the episodes finished since the last call."""
        out = (self.returns, self.lengths)
        self.returns, self.lengths = [], []
        return out


class VectorCollector:
    """Steps a ``SyncVectorEnv`` (``SAME_STEP`` autoreset) with the agent for ``T`` steps.

    Each call returns a ``[W, T]`` TensorDict with TorchRL's keys: the observation leaves,
    ``action``, ``action_log_prob`` ``[W, T]``, ``state_value`` ``[W, T, 1]``, ``is_init``
    ``[W, T, 1]``, the recurrent state entering each step (``[W, T, layers, H]``), and under
    ``"next"``: ``reward``, ``terminated``, ``truncated``, ``done`` (``[W, T, 1]``), the next
    observation and ``state_value``. Where an episode ends, ``("next", <obs>)`` is the final
    observation (``info["final_obs"]``), not the reset one. ``("next", "state_value")`` is
    ``state_value[:, t + 1]`` within an episode; at a truncation it is ``V(final obs)`` from
    the state after the step (one extra forward pass, only on steps where some env truncates),
    so GAE bootstraps time limits correctly; at a termination it is 0 (never used); at
    ``t = T - 1`` it is ``V`` of the observation the next rollout starts from.

    Args:
        env: a ``SyncVectorEnv`` built with ``AutoresetMode.SAME_STEP``
            (``rppo_td.envs.make_vector_env``).
        agent: the actor-critic; called without gradients.
        rollout_steps: ``T``.
        seed: seeds the first ``reset``.
        device: where the agent lives; observations go there, results come back to CPU.
    """

    def __init__(
        self,
        env: gym.vector.VectorEnv,
        agent: RecurrentActorCritic,
        *,
        rollout_steps: int,
        seed: int,
        device: torch.device | str = "cpu",
    ) -> None:
        mode = getattr(env, "autoreset_mode", None)
        if mode != gym.vector.AutoresetMode.SAME_STEP:
            raise ValueError(f"VectorCollector needs AutoresetMode.SAME_STEP, env has {mode}")
        self.env = env
        self.agent = agent
        self.rollout_steps = rollout_steps
        self.num_envs = env.num_envs
        self.device = torch.device(device)
        action_space = env.single_action_space
        self._clip = (
            (action_space.low, action_space.high)
            if isinstance(action_space, gym.spaces.Box)
            else None
        )
        obs, _ = env.reset(seed=seed)
        action_space.seed(seed)
        self.obs = self._to_td(obs)
        self.state = agent.initial_state(self.num_envs, self.device)
        self.is_init = torch.ones(self.num_envs, dtype=torch.bool)
        self.stats = EpisodeStats(self.num_envs)

    def _to_td(self, obs: Any) -> TensorDict:
        return observation_to_tensordict(obs, self.agent.leaves, (self.num_envs,))

    def _final_obs(self, next_obs: TensorDict, info: dict, done: np.ndarray) -> TensorDict:
        """``next_obs`` with the final (pre-reset) observation where an episode ended."""
        if not done.any():
            return next_obs
        final = next_obs.clone()
        for i in np.flatnonzero(info["_final_obs"]):
            final[int(i)] = observation_to_tensordict(info["final_obs"][i], self.agent.leaves, ())
        return final

    def rollout(self) -> TensorDict:
        """Collects ``T`` steps from every env; returns the ``[W, T]`` rollout (on CPU)."""
        agent, dev, cpu = self.agent, self.device, torch.device("cpu")
        w = self.num_envs
        names = ("action", "action_log_prob", "state_value", "is_init", *agent.state_keys)
        record: dict[str, list] = {name: [] for name in (*names, "obs", "next_obs", "final_value")}
        flags: dict[str, list[np.ndarray]] = {n: [] for n in ("reward", "terminated", "truncated")}
        for _ in range(self.rollout_steps):
            state = agent.reset_state(self.state, self.is_init.to(dev))
            out = agent.act(self.obs.to(dev), state, self.is_init.to(dev))
            action = out.action.to(cpu)
            env_action = action.numpy()
            if self._clip is not None:
                env_action = np.clip(env_action, *self._clip)
            obs, reward, terminated, truncated, info = self.env.step(env_action)
            done = terminated | truncated
            next_obs = self._to_td(obs)
            final_obs = self._final_obs(next_obs, info, done)
            final_value = torch.zeros(w, 1)
            if (truncated & ~terminated).any():
                final_value = agent.value(final_obs.to(dev), out.state).to(cpu)
            values = (action, out.log_prob, out.value, self.is_init.unsqueeze(-1), *state)
            for name, value in zip(names, values, strict=True):
                record[name].append(value.to(cpu))
            record["obs"].append(self.obs)
            record["next_obs"].append(final_obs)
            record["final_value"].append(final_value)
            flags["reward"].append(reward)
            flags["terminated"].append(terminated)
            flags["truncated"].append(truncated)
            self.stats.update(np.asarray(reward, dtype=np.float64), done)
            self.obs, self.state = next_obs, out.state
            self.is_init = torch.as_tensor(done)
        td: TensorDict = torch.stack(record.pop("obs"), dim=1)  # type: ignore[assignment]
        nxt: TensorDict = torch.stack(record.pop("next_obs"), dim=1)  # type: ignore[assignment]
        for name, stacked in record.items():
            target = nxt if name == "final_value" else td
            target.set("state_value" if name == "final_value" else name, torch.stack(stacked, 1))
        reward = torch.as_tensor(np.stack(flags["reward"], 1), dtype=torch.float32)
        terminated = torch.as_tensor(np.stack(flags["terminated"], 1))
        truncated = torch.as_tensor(np.stack(flags["truncated"], 1))
        nxt.set("reward", reward.unsqueeze(-1))
        nxt.set("terminated", terminated.unsqueeze(-1))
        nxt.set("truncated", truncated.unsqueeze(-1))
        nxt.set("done", (terminated | truncated).unsqueeze(-1))
        td.set("next", nxt)
        self._fill_next_values(td)
        return td

    def _fill_next_values(self, td: TensorDict) -> None:
        """``("next", "state_value")[:, t] = state_value[:, t + 1]`` where not done."""
        dev = self.device
        state = self.agent.reset_state(self.state, self.is_init.to(dev))
        last = self.agent.value(self.obs.to(dev), state).cpu()
        following = torch.cat([td["state_value"][:, 1:], last.unsqueeze(1)], dim=1)
        done = td["next", "done"]
        td["next", "state_value"] = torch.where(done, td["next", "state_value"], following)

    def state_dict(self) -> dict[str, Any]:
        """Observation, recurrent state and episode stats, as tensors (no env copies).

        ``torch.load(weights_only=True)`` reads it back; the envs are ``env_copies()``.
        """
        return {
            "obs": self.obs.to_dict(),
            "state": list(self.state),
            "is_init": self.is_init,
            "running_return": torch.from_numpy(self.stats.running_return.copy()),
            "running_length": torch.from_numpy(self.stats.running_length.copy()),
        }

    def env_copies(self) -> list[gym.Env] | None:
        """The sub-envs to pickle for an exact resume (None if the env has none)."""
        return getattr(self.env, "envs", None)

    def load_state_dict(self, state: dict[str, Any], envs: list[gym.Env] | None = None) -> None:
        """Restores ``state_dict()``; ``envs`` (unpickled ``env_copies()``) replace the envs.

        Without ``envs`` the envs keep their fresh reset and the first step of every worker
        starts an episode.
        """
        if envs is not None:
            if len(envs) != self.num_envs:
                raise ValueError(f"saved envs: expected {self.num_envs} envs, got {len(envs)}")
            # SAME_STEP mode keeps no pending resets between steps, so swapping is safe
            self.env.envs = list(envs)  # type: ignore[attr-defined]
            self.obs = TensorDict(state["obs"], batch_size=[self.num_envs])
            self.state = tuple(state["state"])
            self.is_init = state["is_init"]
            self.stats.running_return = state["running_return"].numpy().copy()
            self.stats.running_length = state["running_length"].numpy().copy()
        else:
            self.state = self.agent.initial_state(self.num_envs, self.device)
            self.is_init = torch.ones(self.num_envs, dtype=torch.bool)
