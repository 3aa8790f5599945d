"""A TorchRL collector over a gymnasium vector env: ``[W, T]`` rollouts built on the device."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import BaseCollector
from torchrl.envs.utils import ExplorationType, set_exploration_type

from rppo_td.modules import ObservationLeaf, observation_to_tensordict

__all__ = ["EpisodeStats", "VectorCollector"]


class EpisodeStats:
    """Running return and length per env; finished episodes are appended to lists.

    Each finished episode also keeps the step it ended at (counted from the last ``pop``),
    so that the episodes of several ranks can be put in the order they ended.
    """

    def __init__(self, num_envs: int) -> None:
        self.running_return = np.zeros(num_envs, dtype=np.float64)
        self.running_length = np.zeros(num_envs, dtype=np.int64)
        self.returns: list[float] = []
        self.lengths: list[int] = []
        self.ends: list[int] = []
        self._step = 0

    def update(self, reward: np.ndarray, done: np.ndarray) -> None:
        """Adds ``reward`` ``[W]``; closes the episodes where ``done`` ``[W]``."""
        self.running_return += reward
        self.running_length += 1
        if done.any():
            self.returns.extend(self.running_return[done].tolist())
            self.lengths.extend(self.running_length[done].tolist())
            self.ends.extend([self._step] * int(done.sum()))
            self.running_return[done] = 0.0
            self.running_length[done] = 0
        self._step += 1

    def pop(self) -> tuple[list[float], list[int], list[int]]:
        """Returns and clears the episodes finished since the last call.

        ``(returns, lengths, ends)``: ``ends`` the step (since the last call) each ended at.
        """
        out = (self.returns, self.lengths, self.ends)
        self.returns, self.lengths, self.ends, self._step = [], [], [], 0
        return out


class VectorCollector(BaseCollector):
    """TorchRL's collector interface over a ``SAME_STEP`` vector env (in-process or not).

    Iterating yields ``[W, T]`` rollouts (``frames_per_batch = W * T``) with TorchRL's keys,
    built on ``device``: the observation leaves, ``is_init`` ``[W, T, 1]``, whatever the
    policy writes (``action``, ``action_log_prob``, ``state_value``, ...), the recurrent
    states *entering* each step and, under ``"next"``, the states after it (the policy's
    ``("next", <key>)`` outputs), the next observation, ``reward``, ``terminated``,
    ``truncated`` and ``done`` (``[W, T, 1]``). Where an episode ends, ``("next", <obs>)``
    is the final observation (``info["final_obs"]``), not the reset one, so a value network
    on ``"next"`` bootstraps time limits correctly; the recurrent states carried into a new
    episode are zero. Only the actions leave the device. The policy runs without gradients
    under ``set_exploration_type(RANDOM)``.

    A recurrent key is any ``("next", key)`` the policy writes (the ``step_mdp`` rule); on
    the first step, where every env starts an episode, the entering state is zero.

    Args:
        env: a vector env in ``AutoresetMode.SAME_STEP`` (``rppo_td.envs.make_vector_env``:
            a ``SyncVectorEnv``, or with ``processes=N`` a ``ProcessVectorEnv`` stepping the
            envs in ``N`` TorchRL worker processes; the same rollouts either way).
        policy: a TensorDict module (e.g. ``TensorDictSequential(RecurrentActor(net),
            RecurrentCritic(net))``) reading the observation leaves and ``is_init``.
        leaves: the observation leaves (``observation_leaves(env.single_observation_space)``).
        frames_per_batch: ``W * T``; must be a multiple of ``W``.
        total_frames: stop after this many frames; ``-1``: never.
        seed: seeds the first ``reset``.
        device: where the rollouts are built (the policy's device).
    """

    def __init__(
        self,
        env: gym.vector.VectorEnv,
        policy: TensorDictModuleBase,
        *,
        leaves: list[ObservationLeaf],
        frames_per_batch: int,
        total_frames: int = -1,
        seed: int,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        mode = getattr(env, "autoreset_mode", None)
        if mode != gym.vector.AutoresetMode.SAME_STEP:
            raise ValueError(f"VectorCollector needs AutoresetMode.SAME_STEP, env has {mode}")
        if frames_per_batch <= 0 or frames_per_batch % env.num_envs:
            raise ValueError(
                f"frames_per_batch must be a positive multiple of the {env.num_envs} envs, "
                f"got {frames_per_batch}"
            )
        self.env = env
        self.policy = policy
        self.leaves = leaves
        self.num_envs = env.num_envs
        self.frames_per_batch = self.requested_frames_per_batch = frames_per_batch
        self.rollout_steps = frames_per_batch // env.num_envs
        self.total_frames = total_frames
        self.device = torch.device(device)
        action_space = env.single_action_space
        self._clip = (
            (action_space.low, action_space.high)
            if isinstance(action_space, gym.spaces.Box)
            else None
        )
        self.episodes = EpisodeStats(self.num_envs)
        self._frames = 0
        self.set_seed(seed)

    # ---- TorchRL's collector interface --------------------------------------------------
    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Resets every env with ``seed`` (env ``i`` gets ``seed + i``); returns ``seed``."""
        obs, _ = self.env.reset(seed=seed)
        self.env.single_action_space.seed(seed)
        self._carry = self._obs(obs)
        first = torch.ones(self.num_envs, 1, dtype=torch.bool, device=self.device)
        self._carry.set("is_init", first)
        self.episodes = EpisodeStats(self.num_envs)
        return seed

    def iterator(self) -> Iterator[TensorDictBase]:
        """Yields rollouts until ``total_frames`` (forever with ``-1``)."""
        while self.total_frames < 0 or self._frames < self.total_frames:
            yield self.rollout()

    def rollout(self) -> TensorDict:
        """Collects ``T`` steps from every env; returns the ``[W, T]`` rollout on ``device``."""
        steps: list[TensorDictBase] = []
        rewards: list[np.ndarray] = []
        terminated: list[np.ndarray] = []
        truncated: list[np.ndarray] = []
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            for _ in range(self.rollout_steps):
                td = self._carry
                self.policy(td)
                action = td.get("action").cpu().numpy()
                if self._clip is not None:
                    action = np.clip(action, *self._clip)
                obs, reward, term, trunc, info = self.env.step(action)
                done = term | trunc
                self.episodes.update(np.asarray(reward, dtype=np.float64), done)
                rewards.append(reward)
                terminated.append(term)
                truncated.append(trunc)
                following = self._obs(obs)
                nxt = td.get("next", None)
                if nxt is None:
                    nxt = TensorDict({}, [self.num_envs], device=self.device)
                    td.set("next", nxt)
                recurrent = list(nxt.keys())
                if not steps:
                    # the first step starts every episode: the entering state is zero
                    for key in recurrent:
                        if key not in td.keys():  # noqa: SIM118
                            td.set(key, torch.zeros_like(nxt.get(key)))
                nxt.update(self._final_obs(following, info, done))
                steps.append(td)
                done_t = torch.as_tensor(done, device=self.device).view(-1, 1)
                carry = following
                for key in recurrent:
                    state = nxt.get(key)
                    where = done_t.view(-1, *([1] * (state.ndim - 1)))
                    carry.set(key, torch.where(where, 0.0, state))
                carry.set("is_init", done_t)
                self._carry = carry
        rollout: TensorDict = torch.stack(steps, dim=1)  # type: ignore[assignment]
        shape = (self.num_envs, self.rollout_steps, 1)
        term = torch.as_tensor(np.stack(terminated, 1)).view(shape)
        trunc = torch.as_tensor(np.stack(truncated, 1)).view(shape)
        reward = torch.as_tensor(np.stack(rewards, 1), dtype=torch.float32).view(shape)
        flags = TensorDict(
            {"reward": reward, "terminated": term, "truncated": trunc, "done": term | trunc},
            batch_size=shape[:2],
        )
        rollout.get("next").update(self._to_device(flags))
        self._frames += self.frames_per_batch
        return rollout

    def shutdown(
        self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True
    ) -> None:
        """Closes the envs (and shuts down the worker processes of a ``ProcessVectorEnv``)."""
        if close_env:
            self.env.close()

    def state_dict(self) -> OrderedDict:
        """What the next rollout starts from, as tensors (no env copies).

        ``torch.load(weights_only=True)`` reads it back; the envs are ``env_copies()``.
        """
        return OrderedDict(
            carry=self._carry.to("cpu").to_dict(),
            running_return=torch.from_numpy(self.episodes.running_return.copy()),
            running_length=torch.from_numpy(self.episodes.running_length.copy()),
            frames=self._frames,
        )

    def env_copies(self) -> list[gym.Env] | dict[str, Any] | None:
        """The envs' state to pickle for an exact resume.

        The sub-envs of a ``SyncVectorEnv``; the ``get_state()`` of a vector env that has
        one (``CartPoleNoVelVectorEnv``); None where the env has nothing here to hand out (a
        ``ProcessVectorEnv``: its sub-envs live in the worker processes), and a resume then
        restarts the envs.
        """
        if hasattr(self.env, "get_state"):
            return self.env.get_state()
        return getattr(self.env, "envs", None)

    def load_state_dict(
        self, state_dict: dict[str, Any], envs: list[gym.Env] | dict[str, Any] | None = None
    ) -> None:
        """Restores ``state_dict()``; ``envs`` (unpickled ``env_copies()``) replace the envs.

        A vector env with ``set_state`` takes its own ``get_state()``, or the sub-envs of
        the same env made as separate copies (a checkpoint of earlier versions). Without
        ``envs`` the envs keep their fresh reset and the first step of every worker starts
        an episode.
        """
        self._frames = int(state_dict.get("frames", 0))
        if envs is None:
            return
        if hasattr(self.env, "set_state"):
            if isinstance(envs, list):
                envs = self.env.copies_state(envs)  # type: ignore[attr-defined]
            self.env.set_state(envs)  # type: ignore[attr-defined]
        else:
            if not isinstance(envs, list):
                raise ValueError(
                    f"saved envs: expected {self.num_envs} sub-envs, got a "
                    f"{type(envs).__name__} (the state of another kind of vector env)"
                )
            if len(envs) != self.num_envs:
                raise ValueError(f"saved envs: expected {self.num_envs} envs, got {len(envs)}")
            # SAME_STEP mode keeps no pending resets between steps, so swapping is safe
            self.env.envs = list(envs)  # type: ignore[attr-defined]
        self._carry = TensorDict(state_dict["carry"], batch_size=[self.num_envs]).to(self.device)
        self.episodes.running_return = state_dict["running_return"].numpy().copy()
        self.episodes.running_length = state_dict["running_length"].numpy().copy()

    # ---- helpers ----------------------------------------------------------------------------
    def _obs(self, obs: Any) -> TensorDict:
        return self._to_device(observation_to_tensordict(obs, self.leaves, (self.num_envs,)))

    def _to_device(self, td: TensorDict) -> TensorDict:
        """``td`` on the device: a pinned host copy sent without blocking (as is on the CPU)."""
        if self.device.type == "cpu":
            return td
        if self.device.type == "cuda":
            td = td.pin_memory()
        return td.to(self.device, non_blocking=True)

    def _final_obs(self, next_obs: TensorDict, info: dict, done: np.ndarray) -> TensorDict:
        """``next_obs`` with the final (pre-reset) observation where an episode ended."""
        if not done.any():
            return next_obs
        final = next_obs.clone()
        for i in np.flatnonzero(info["_final_obs"]):
            one = observation_to_tensordict(info["final_obs"][i], self.leaves, ())
            final[int(i)] = one.to(self.device)
        return final
