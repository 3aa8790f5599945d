"""Rollouts through TorchRL: ``GymWrapper`` + ``InitTracker`` + state primer + ``Collector``.

This is the path a user's own TorchRL pipeline would take, and the rival ``VectorCollector``
is measured against (``benchmarks/collectors.py``). Two TorchRL constructions of the ``W``
envs are offered; both step the checked envs of ``rppo_td.envs.make_env``:

- ``"vector"`` (the default, the faster one): one ``GymWrapper`` over gymnasium's own
  ``SyncVectorEnv`` in ``AutoresetMode.DISABLED``, the mode TorchRL prefers: the vector env
  never resets on its own, TorchRL resets the finished sub-envs through
  ``reset(options={"reset_mask": ...})``, so ``("next", <obs>)`` is the true final
  observation with no ``final_obs`` bookkeeping. Seeded as ``VectorCollector`` is (env ``i``
  from ``seed + i``), so both collect the same episodes for the same actions.
- ``"serial"``: TorchRL's ``SerialEnv`` of one ``GymWrapper`` per env (seeded by TorchRL's
  ``SerialEnv.set_seed`` chain, so its episodes differ from ``VectorCollector``'s).
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, Literal

import gymnasium as gym
import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import BaseCollector, Collector
from torchrl.envs import (
    Compose,
    GymWrapper,
    InitTracker,
    RenameTransform,
    SerialEnv,
    Transform,
    TransformedEnv,
)

from rppo_td.envs import make_env, resolve_env_id
from rppo_td.modules import RecurrentActorCritic, recurrent_state_primer
from rppo_td.train._vector_collector import EpisodeStats

__all__ = ["Batching", "TorchRLCollector", "make_torchrl_env"]

log = logging.getLogger(__name__)

Batching = Literal["vector", "serial"]


def make_torchrl_env(
    env_id: str, net: RecurrentActorCritic, *, num_workers: int, batching: Batching = "vector"
) -> TransformedEnv:
    """``W`` checked envs as one TorchRL env of batch ``[W]``, with ``InitTracker`` and the primer.

    Each copy is ``rppo_td.envs.make_env(env_id)`` (the checked env, in the spaces the net was
    built from), so a faulty env raises the same ``EnvError`` as on the vector path. Discrete
    actions use categorical (index) encoding, as ``VectorCollector`` does. The primer adds the
    zero recurrent states (``net.state_keys``, each ``[W, layers, H]``) to every reset.

    Args:
        env_id: gymnasium id (see ``rppo_td.envs.resolve_env_id``).
        net: the actor-critic (its state keys and shapes).
        num_workers: ``W >= 1``.
        batching: ``"vector"``: ``GymWrapper`` over a ``gymnasium.vector.SyncVectorEnv``
            (``AutoresetMode.DISABLED``); ``"serial"``: ``SerialEnv`` of ``GymWrapper``.

    Raises:
        ValueError: a non-``Box`` observation space (TorchRL names other spaces' keys its own
            way), a bad ``num_workers`` or ``batching``.

    Example:
        >>> import gymnasium as gym
        >>> net = RecurrentActorCritic(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2),
        ...                            hidden_size=8)
        >>> env = make_torchrl_env("rppo_td/CartPoleNoVel-v1", net, num_workers=3)
        >>> td = env.reset()
        >>> td["observation"].shape, td["is_init"].shape, td["recurrent_state_h"].shape
        (torch.Size([3, 2]), torch.Size([3, 1]), torch.Size([3, 1, 8]))
        >>> env.close()
    """
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
    if batching not in ("vector", "serial"):
        raise ValueError(f"batching must be 'vector' or 'serial', got {batching!r}")
    name = resolve_env_id(env_id)
    probe = make_env(name)
    space = probe.observation_space
    probe.close()
    if not isinstance(space, gym.spaces.Box):
        raw = gym.make(name)  # the env's own space, before make_env's canonical one
        own = raw.observation_space
        raw.close()
        # one line: a MultiDiscrete's repr spreads its array over several
        raise ValueError(
            f"--collector torchrl supports Box observations only (TorchRL names other spaces' "
            f"keys its own way); {name} observes {' '.join(str(own).split())}; use "
            "--collector vector"
        )
    transforms: list[Transform] = [InitTracker()]
    if net.state_keys:
        transforms.append(recurrent_state_primer(net))
    if batching == "vector":
        vector = gym.vector.SyncVectorEnv(
            [functools.partial(_acting_env, name)] * num_workers,
            autoreset_mode=gym.vector.AutoresetMode.DISABLED,
        )
        base: GymWrapper | SerialEnv = GymWrapper(
            vector, categorical_action_encoding=True, device="cpu"
        )
    else:
        base = SerialEnv(num_workers, functools.partial(_wrapped_env, name))
        keys = base.observation_spec.keys()
        if "pixels" in keys and "observation" not in keys:
            # GymWrapper names one env's uint8 image Box "pixels" (over a vector env it keeps
            # "observation"); the net reads "observation", as on the vector path
            transforms.insert(0, RenameTransform(["pixels"], ["observation"]))
    return TransformedEnv(base, Compose(*transforms))


def _acting_env(name: str) -> gym.Env:
    """``make_env(name)``, its ``Box`` actions clipped into the space on the way in.

    The policy's Gaussian samples are not bounded; as ``VectorCollector`` and the evaluation
    do, the env gets them clipped while the rollout keeps the sampled action, whose
    log-probability the loss compares.
    """
    env = make_env(name)
    if isinstance(env.action_space, gym.spaces.Box):
        return gym.wrappers.ClipAction(env)
    return env


def _wrapped_env(name: str) -> GymWrapper:
    return GymWrapper(_acting_env(name), categorical_action_encoding=True, device="cpu")


class TorchRLCollector(BaseCollector):
    """TorchRL ``Collector`` rollouts in the library's ``[W, T]`` layout, on ``device``.

    Keys (batch ``[W, T]``): the observation leaves, ``action``, ``action_log_prob``,
    ``state_value``, ``is_init`` (``[W, T, 1]`` bool) and every state key (the state
    *entering* the step, ``[W, T, layers, H]``, zero where ``is_init``); under ``"next"``: the
    observation leaves (the final, pre-reset observation where an episode ended), every state
    key (the state after the step), ``reward``, ``terminated``, ``truncated`` and ``done``
    (``[W, T, 1]``). The same layout as ``VectorCollector``'s; ``("next", "state_value")`` is
    left to ``GAE(value_network=RecurrentCritic(net))``. TorchRL's extra keys (root ``done``
    flags of the reset, ``("next", "is_init")``, ``("collector", "traj_ids")``) are dropped.
    ``episodes`` counts the finished episodes' returns and lengths.

    Args:
        env_id: gymnasium id.
        net: the actor-critic ``policy`` is built from (its keys).
        policy: e.g. ``TensorDictSequential(RecurrentActor(net), RecurrentCritic(net))``.
        num_workers: ``W``.
        rollout_steps: ``T``.
        seed: env seed (see the module docstring for how each ``batching`` uses it).
        device: where the policy runs and the rollouts are stored.
        batching: the TorchRL construction of the envs (``make_torchrl_env``).

    Example:
        >>> import gymnasium as gym
        >>> from tensordict.nn import TensorDictSequential
        >>> from rppo_td.modules import RecurrentActor, RecurrentCritic
        >>> net = RecurrentActorCritic(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2),
        ...                            hidden_size=8)
        >>> policy = TensorDictSequential(RecurrentActor(net), RecurrentCritic(net))
        >>> collector = TorchRLCollector("rppo_td/CartPoleNoVel-v1", net, policy, num_workers=3,
        ...                              rollout_steps=5, seed=0)
        >>> td = collector.rollout()
        >>> td.batch_size, td["is_init"].shape, td["next", "recurrent_state_h"].shape
        (torch.Size([3, 5]), torch.Size([3, 5, 1]), torch.Size([3, 5, 1, 8]))
        >>> collector.shutdown()
    """

    def __init__(
        self,
        env_id: str,
        net: RecurrentActorCritic,
        policy: TensorDictModuleBase,
        *,
        num_workers: int,
        rollout_steps: int,
        seed: int,
        device: torch.device | str = "cpu",
        batching: Batching = "vector",
    ) -> None:
        super().__init__()
        if (
            isinstance(rollout_steps, bool)
            or not isinstance(rollout_steps, int)
            or rollout_steps < 1
        ):
            raise ValueError(f"rollout_steps must be an int >= 1, got {rollout_steps!r}")
        self.net = net
        self.policy = policy
        self.num_workers = num_workers
        self.rollout_steps = rollout_steps
        self.frames_per_batch = self.requested_frames_per_batch = num_workers * rollout_steps
        self.total_frames = -1
        self.batching = batching
        self.device = torch.device(device)
        self.env = make_torchrl_env(env_id, net, num_workers=num_workers, batching=batching)
        if batching == "serial":
            self.env.set_seed(seed)
        self.collector = Collector(
            self.env,
            policy,
            frames_per_batch=self.frames_per_batch,
            total_frames=-1,
            env_device="cpu",
            policy_device=self.device,
            storing_device=self.device,
        )
        if batching == "vector":
            # the collector's own first reset is unseeded; a seeded reset of the vector env
            # starts env i from seed + i, as VectorCollector.set_seed does
            self.collector.reset(seed=seed)
        self._iterator: Iterator[TensorDictBase] | None = None
        self._warned_resume = False
        self.episodes = EpisodeStats(num_workers)
        obs_keys: list[NestedKey] = list(net.observation_keys)
        self.keys: list[NestedKey] = [
            *obs_keys,
            "action",
            "action_log_prob",
            "state_value",
            "is_init",
            *net.state_keys,
            *[("next", key) for key in obs_keys],
            *[("next", key) for key in net.state_keys],
            ("next", "reward"),
            ("next", "terminated"),
            ("next", "truncated"),
            ("next", "done"),
        ]

    # ---- TorchRL's collector interface --------------------------------------------------
    def iterator(self) -> Iterator[TensorDictBase]:
        """Yields rollouts forever."""
        while True:
            yield self.rollout()

    def rollout(self) -> TensorDict:
        """One ``[W, T]`` rollout on ``device`` (see the class docstring for its keys)."""
        if self._iterator is None:
            self._iterator = iter(self.collector)
        td: TensorDictBase = next(self._iterator)
        w, t = self.num_workers, self.rollout_steps
        if tuple(td.batch_size) != (w, t):
            raise RuntimeError(
                f"TorchRL's collector returned batch {list(td.batch_size)}, expected {[w, t]}"
            )
        out: TensorDict = td.select(*self.keys)
        init = out.get("is_init")
        for key in self.net.state_keys:
            # the primer zeroes the state at a reset already; zero it here too, explicitly,
            # so a policy reading it never sees a state carried across an episode start
            state = out.get(key)
            where = init.view(w, t, *([1] * (state.ndim - 2)))
            out.set(key, torch.where(where, 0.0, state))
        flags = out.get("next").select("reward", "done").to("cpu")
        reward = flags.get("reward").view(w, t).double().numpy()
        done = flags.get("done").view(w, t).numpy()
        for step in range(t):
            self.episodes.update(reward[:, step], done[:, step])
        return out

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Reseeds the envs (as at construction) and restarts every episode; returns ``seed``."""
        if self.batching == "serial":
            self.collector.set_seed(seed, static_seed=static_seed)
            self.collector.reset()
        else:
            self.collector.reset(seed=seed)
        self.episodes = EpisodeStats(self.num_workers)
        return seed

    def state_dict(self) -> OrderedDict:
        """Nothing: TorchRL's path does not checkpoint env state (a resume restarts the envs)."""
        return OrderedDict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Nothing to restore; warns (once) that the envs restart from a reset."""
        if not self._warned_resume:
            log.warning(
                "--collector torchrl does not checkpoint env state: the envs restart from a "
                "reset on resume (the run continues, but not exactly as an uninterrupted one)"
            )
            self._warned_resume = True

    def shutdown(
        self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True
    ) -> None:
        """Shuts TorchRL's collector down and closes the envs (call it: it can hang at exit)."""
        self.collector.shutdown(timeout=timeout, close_env=close_env, raise_on_error=raise_on_error)
