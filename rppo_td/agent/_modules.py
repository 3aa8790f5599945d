"""TensorDict and TorchRL wrappers of ``RecurrentActorCritic`` for TorchRL collectors."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.data import Composite, Unbounded
from torchrl.envs.transforms import TensorDictPrimer

from rppo_td.agent._actor_critic import RecurrentActorCritic

__all__ = ["RecurrentPolicyModule", "recurrent_state_primer"]


class RecurrentPolicyModule(TensorDictModuleBase):
    """One policy step on a tensordict, as a TorchRL collector calls a policy.

    Batch ``[W]``; reads the observation leaves, ``is_init`` (``[W, 1]`` bool, from TorchRL's
    ``InitTracker``) and the recurrent state keys (``[W, layers, H]``, from
    ``recurrent_state_primer``); writes ``action``, ``action_log_prob`` ``[W]``,
    ``state_value`` ``[W, 1]`` and ``("next", <state key>)``, which the collector moves to
    the root for the next step.

    Args:
        agent: the actor-critic.
        deterministic: take the mode instead of sampling.

    Example:
        >>> import gymnasium as gym
        >>> from tensordict import TensorDict
        >>> net = RecurrentActorCritic(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2),
        ...                            hidden_size=8)
        >>> td = TensorDict({"observation": torch.zeros(3, 2), "is_init": torch.ones(3, 1).bool(),
        ...                  "recurrent_state_h": torch.zeros(3, 1, 16),
        ...                  "recurrent_state_c": torch.zeros(3, 1, 16)}, batch_size=[3])
        >>> RecurrentPolicyModule(net)(td)["next", "recurrent_state_h"].shape
        torch.Size([3, 1, 16])
    """

    def __init__(self, agent: RecurrentActorCritic, *, deterministic: bool = False) -> None:
        super().__init__()
        self.agent = agent
        self.deterministic = deterministic
        self.in_keys = [key for key, _ in agent.leaves] + ["is_init", *agent.state_keys]
        self.out_keys = [
            "action",
            "action_log_prob",
            "state_value",
            *[("next", key) for key in agent.state_keys],
        ]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Writes the out keys into ``tensordict`` and returns it."""
        keys = self.agent.state_keys
        batch = tensordict.batch_size
        flat = tensordict.reshape(-1) if len(batch) != 1 else tensordict
        state = tuple(flat.get(key) for key in keys)
        is_init = flat.get("is_init").reshape(-1)
        obs = flat.select(*[key for key, _ in self.agent.leaves])
        out = self.agent.act(obs, state, is_init, deterministic=self.deterministic)
        results: dict[str | tuple[str, str], torch.Tensor] = {
            "action": out.action,
            "action_log_prob": out.log_prob,
            "state_value": out.value,
            **{("next", key): value for key, value in zip(keys, out.state, strict=True)},
        }
        for key, value in results.items():
            tensordict.set(key, value.reshape(*batch, *value.shape[1:]))
        return tensordict


def recurrent_state_primer(agent: RecurrentActorCritic) -> TensorDictPrimer:
    """TorchRL primer that adds the zero recurrent state ``[layers, H]`` to env resets.

    Args:
        agent: the actor-critic (``agent.state_keys`` must not be empty).
    """
    if not agent.state_keys:
        raise ValueError("recurrence='none' has no recurrent state to prime")
    shape = (agent.num_layers, agent.state_size)
    spec = Composite({key: Unbounded(shape=shape, dtype=torch.float32) for key in agent.state_keys})
    return TensorDictPrimer(spec, expand_specs=True)
