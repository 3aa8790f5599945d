"""Rollouts through TorchRL: ``GymWrapper`` + ``InitTracker`` + state primer + ``Collector``.

This is the path a user's own TorchRL pipeline would take. On a 2-core CPU it is several times
slower per step than ``VectorCollector`` (figures in the README), so ``--collector vector`` is
the default; both write the same ``[W, T]`` keys.
"""

from __future__ import annotations

import logging
from typing import Any

import gymnasium as gym
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.collectors import Collector
from torchrl.envs import Compose, GymWrapper, InitTracker, SerialEnv, TransformedEnv

from rppo_td.agent import RecurrentActorCritic, RecurrentPolicyModule, recurrent_state_primer
from rppo_td.envs import make_env, resolve_env_id
from rppo_td.train._vector_collector import EpisodeStats

__all__ = ["TorchRLCollector", "make_torchrl_env"]

log = logging.getLogger(__name__)


def make_torchrl_env(
    env_id: str, agent: RecurrentActorCritic, *, num_envs: int, device: torch.device | str = "cpu"
) -> TransformedEnv:
    """``SerialEnv`` of ``GymWrapper(make_env(env_id))`` with ``InitTracker`` and the primer.

    Each copy is the checked env of ``rppo_td.envs.make_env``, in the spaces the agent was
    built from, so a faulty env raises the same ``EnvError`` as on the vector path. Discrete
    actions use categorical (index) encoding, as ``VectorCollector`` does.
    """
    name = resolve_env_id(env_id)
    probe = make_env(name)
    space = probe.observation_space
    probe.close()
    if not isinstance(space, gym.spaces.Box):
        raise ValueError(
            f"--collector torchrl supports Box observations only (TorchRL names other spaces' "
            f"keys its own way), got {space}; use --collector vector"
        )

    def make_one() -> GymWrapper:
        return GymWrapper(make_env(name), categorical_action_encoding=True, device="cpu")

    transforms: list = [InitTracker()]
    if agent.state_keys:
        transforms.append(recurrent_state_primer(agent))
    return TransformedEnv(SerialEnv(num_envs, make_one), Compose(*transforms))


class TorchRLCollector:
    """TorchRL ``Collector`` rollouts reshaped into the library's ``[W, T]`` layout.

    Adds ``("next", "state_value")`` (``V`` of the next observation from the state after the
    step; TorchRL keeps the pre-reset observation under ``"next"``, so truncations bootstrap
    correctly) and keeps only the library's keys.

    Args:
        env_id: gymnasium id.
        agent: the actor-critic.
        num_envs: ``W``.
        rollout_steps: ``T``.
        seed: env seed.
        device: where the agent lives.
    """

    def __init__(
        self,
        env_id: str,
        agent: RecurrentActorCritic,
        *,
        num_envs: int,
        rollout_steps: int,
        seed: int,
        device: torch.device | str = "cpu",
    ) -> None:
        self.agent = agent
        self.num_envs = num_envs
        self.rollout_steps = rollout_steps
        self.env = make_torchrl_env(env_id, agent, num_envs=num_envs)
        self.env.set_seed(seed)
        self.collector = Collector(
            self.env,
            RecurrentPolicyModule(agent),
            frames_per_batch=num_envs * rollout_steps,
            total_frames=-1,
            policy_device=device,
        )
        self._iterator = iter(self.collector)
        self.stats = EpisodeStats(num_envs)
        obs_keys = [key for key, _ in agent.leaves]
        self.keys = [
            *obs_keys,
            "action",
            "action_log_prob",
            "state_value",
            "is_init",
            *agent.state_keys,
            *[("next", k) for k in obs_keys],
            ("next", "reward"),
            ("next", "terminated"),
            ("next", "truncated"),
            ("next", "done"),
        ]

    def rollout(self) -> TensorDict:
        """One ``[W, T]`` batch from the collector, with ``("next", "state_value")``."""
        td: TensorDictBase = next(self._iterator)
        if tuple(td.batch_size) != (self.num_envs, self.rollout_steps):
            raise RuntimeError(
                f"collector returned batch {list(td.batch_size)}, expected "
                f"{[self.num_envs, self.rollout_steps]}"
            )
        out = td.select(*self.keys).clone()
        agent = self.agent
        init = out["is_init"]
        for key in agent.state_keys:
            out[key] = torch.where(init.unsqueeze(-1), 0.0, out[key])
        w, t = self.num_envs, self.rollout_steps
        next_obs = out["next"].select(*[key for key, _ in agent.leaves]).reshape(w * t)
        state = tuple(
            td["next", key].reshape(w * t, *td[key].shape[2:]) for key in agent.state_keys
        )
        device = next(agent.parameters()).device
        value = agent.value(next_obs.to(device), tuple(s.to(device) for s in state))
        out["next", "state_value"] = value.cpu().reshape(w, t, 1)
        reward = out["next", "reward"].squeeze(-1).double().numpy()
        done = out["next", "done"].squeeze(-1).numpy()
        for step in range(t):
            self.stats.update(reward[:, step], done[:, step])
        return out

    def state_dict(self) -> dict[str, Any]:
        """Nothing: a resumed TorchRL-collected run restarts its envs (logged)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Envs restart from a reset; the run otherwise continues from the checkpoint."""
        log.warning("--collector torchrl does not checkpoint env state; envs restart on resume")

    def close(self) -> None:
        """Shuts the collector and envs down."""
        self.collector.shutdown()
