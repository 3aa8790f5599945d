"""The recurrent actor-critic: encoder -> LSTM/GRU/none -> policy and value heads."""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import gymnasium as gym
import torch
from tensordict import TensorDictBase
from torch import nn

from rppo_td.agent._encoders import ObservationEncoder
from rppo_td.agent._heads import make_action_head
from rppo_td.agent._normalizer import ObservationNormalizer
from rppo_td.agent._spaces import observation_leaves

__all__ = ["ActorCriticOutput", "RecurrentActorCritic", "Recurrence"]

Recurrence = Literal["lstm", "gru", "none"]
STATE_KEYS = {"lstm": ("recurrent_state_h", "recurrent_state_c"), "gru": ("recurrent_state_h",)}


class ActorCriticOutput(NamedTuple):
    """What ``RecurrentActorCritic.act`` returns for ``W`` envs."""

    action: torch.Tensor
    log_prob: torch.Tensor
    value: torch.Tensor
    state: tuple[torch.Tensor, ...]


def _mlp_head(in_features: int, hidden: int, layers: int, out: int, gain: float) -> nn.Sequential:
    modules: list[nn.Module] = []
    width = in_features
    for _ in range(layers):
        linear = nn.Linear(width, hidden)
        nn.init.orthogonal_(linear.weight, math.sqrt(2))
        nn.init.zeros_(linear.bias)
        modules += [linear, nn.ReLU()]
        width = hidden
    last = nn.Linear(width, out)
    nn.init.orthogonal_(last.weight, gain)
    nn.init.zeros_(last.bias)
    return nn.Sequential(*modules, last)


class _Trunk(nn.Module):
    """Encoder then LSTM/GRU (or nothing): obs ``[B, L]`` -> features ``[B, L, H]``."""

    def __init__(self, leaves, recurrence: str, hidden_size: int, num_layers: int) -> None:
        super().__init__()
        self.encoder = ObservationEncoder(leaves, hidden_size=hidden_size)
        self.core: nn.Module | None = None
        if recurrence == "lstm":
            self.core = nn.LSTM(hidden_size, hidden_size, num_layers, batch_first=True)
        elif recurrence == "gru":
            self.core = nn.GRU(hidden_size, hidden_size, num_layers, batch_first=True)

    def forward(
        self, obs: TensorDictBase, state: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Obs ``[B, L]``, states ``[B, layers, H]`` -> ``[B, L, H]`` and final states."""
        features = self.encoder(obs)
        if self.core is None:
            return features, ()
        hidden = tuple(s.transpose(0, 1).contiguous() for s in state)
        out, final = self.core(features, hidden if len(hidden) == 2 else hidden[0])
        final = final if isinstance(final, tuple) else (final,)
        return out, tuple(s.transpose(0, 1) for s in final)


class RecurrentActorCritic(nn.Module):
    """Actor-critic with a shared encoder and recurrent core, built from the env's spaces.

    Observations are tensordicts of the leaves ``observation_leaves(observation_space)``.
    The recurrent state is a tuple of ``[*B, num_layers, hidden_size]`` tensors, stored in
    rollouts under ``state_keys`` (``recurrent_state_h`` and, for an LSTM,
    ``recurrent_state_c``): the state *entering* a step. ``recurrence="none"`` keeps the same
    encoder and heads with no memory (empty state).

    Args:
        observation_space: any space ``observation_leaves`` accepts.
        action_space: Discrete, 1-D MultiDiscrete or 1-D Box.
        recurrence: ``"lstm"``, ``"gru"`` or ``"none"``.
        hidden_size: width of the encoder, the recurrent core and the head layers.
        num_layers: recurrent layers.
        head_layers: hidden layers in each of the policy and value heads.
        shared_critic: one encoder and core for both heads; False (default) gives the critic
            its own, so value-loss gradients never move the policy's features. Separate
            states are stored side by side: ``[..., :H]`` actor, ``[..., H:]`` critic.
        normalize_observations: standardise float vector leaves with running statistics
            (``ObservationNormalizer``; updated by the trainer between rollouts).

    Example:
        >>> from tensordict import TensorDict
        >>> net = RecurrentActorCritic(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2),
        ...                            recurrence="lstm", hidden_size=8)
        >>> obs = TensorDict({"observation": torch.zeros(3, 2)}, batch_size=[3])
        >>> out = net.act(obs, net.initial_state(3), torch.ones(3, dtype=torch.bool))
        >>> out.action.shape, out.value.shape, out.state[0].shape
        (torch.Size([3]), torch.Size([3, 1]), torch.Size([3, 1, 16]))
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        *,
        recurrence: Recurrence = "lstm",
        hidden_size: int = 64,
        num_layers: int = 1,
        head_layers: int = 1,
        shared_critic: bool = False,
        normalize_observations: bool = True,
    ) -> None:
        super().__init__()
        if recurrence not in ("lstm", "gru", "none"):
            raise ValueError(f"recurrence must be 'lstm', 'gru' or 'none', got {recurrence!r}")
        for name, value, low in (
            ("hidden_size", hidden_size, 1),
            ("num_layers", num_layers, 1),
            ("head_layers", head_layers, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        self.recurrence = recurrence
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.shared_critic = shared_critic
        self.leaves = observation_leaves(observation_space)
        self.normalizer = ObservationNormalizer(self.leaves) if normalize_observations else None
        self.actor_trunk = _Trunk(self.leaves, recurrence, hidden_size, num_layers)
        self.critic_trunk = (
            None if shared_critic else _Trunk(self.leaves, recurrence, hidden_size, num_layers)
        )
        self.action_head = make_action_head(action_space, hidden_size)
        self.policy_mlp: nn.Module = nn.Identity()
        if head_layers:
            self.policy_mlp = _mlp_head(hidden_size, hidden_size, head_layers - 1, hidden_size, 1.0)
        self.value_head = _mlp_head(hidden_size, hidden_size, head_layers, 1, 1.0)

    @property
    def state_keys(self) -> tuple[str, ...]:
        """Rollout keys of the recurrent state (empty without recurrence)."""
        return STATE_KEYS.get(self.recurrence, ())

    @property
    def state_size(self) -> int:
        """Last dim of each state tensor: ``H``, or ``2H`` (actor then critic) if separate."""
        return self.hidden_size * (1 if self.shared_critic else 2)

    def initial_state(self, batch: int, device: torch.device | str = "cpu") -> tuple:
        """Zero state: a tuple of ``[batch, num_layers, state_size]`` float32 tensors."""
        shape = (batch, self.num_layers, self.state_size)
        return tuple(torch.zeros(shape, device=device) for _ in self.state_keys)

    def _trunks(
        self, obs: TensorDictBase, state: tuple[torch.Tensor, ...], *, actor: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        """Obs ``[B, L]`` -> actor and critic features ``[B, L, H]`` and the final states."""
        if self.critic_trunk is None:
            features, final = self.actor_trunk(obs, state)
            return features, features, final
        h = self.hidden_size
        critic, critic_final = self.critic_trunk(obs, tuple(s[..., h:] for s in state))
        if not actor:
            return critic, critic, ()
        features, final = self.actor_trunk(obs, tuple(s[..., :h] for s in state))
        joined = tuple(torch.cat(pair, dim=-1) for pair in zip(final, critic_final, strict=True))
        return features, critic, joined

    def _normalize(self, obs: TensorDictBase) -> TensorDictBase:
        return obs if self.normalizer is None else self.normalizer(obs)

    def _heads(self, actor: torch.Tensor, critic: torch.Tensor):
        return self.action_head(self.policy_mlp(actor)), self.value_head(critic)

    @torch.no_grad()
    def act(
        self,
        obs: TensorDictBase,
        state: tuple[torch.Tensor, ...],
        is_init: torch.Tensor,
        *,
        deterministic: bool = False,
    ) -> ActorCriticOutput:
        """One step for ``W`` envs, resetting the state where ``is_init``.

        Args:
            obs: tensordict of batch ``[W]``.
            state: states entering the step, each ``[W, layers, H]``.
            is_init: ``[W]`` bool, first step of an episode (the state is zeroed there).
            deterministic: take the distribution's mode instead of sampling.

        Returns:
            ``action`` (``[W]`` or ``[W, A]``), ``log_prob`` ``[W]``, ``value`` ``[W, 1]`` and
            the states leaving the step.
        """
        state = self.reset_state(state, is_init)
        actor, critic, new_state = self._trunks(self._normalize(obs).unsqueeze(1), state)
        dist, value = self._heads(actor.squeeze(1), critic.squeeze(1))
        action = dist.mode if deterministic else dist.sample()
        return ActorCriticOutput(action, dist.log_prob(action), value, new_state)

    @torch.no_grad()
    def value(self, obs: TensorDictBase, state: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """``V(obs)`` ``[W, 1]`` from the states entering the step (no reset)."""
        _, critic, _ = self._trunks(self._normalize(obs).unsqueeze(1), state, actor=False)
        return self.value_head(critic.squeeze(1))

    def evaluate(
        self, obs: TensorDictBase, state: tuple[torch.Tensor, ...], action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Runs whole sequences from their first step's stored state, with gradients.

        Args:
            obs: tensordict of batch ``[B, L]``.
            state: states entering position 0, each ``[B, layers, H]``.
            action: ``[B, L]`` or ``[B, L, A]``, the actions taken.

        Returns:
            ``(log_prob [B, L], entropy [B, L], value [B, L, 1])``.
        """
        actor, critic, _ = self._trunks(self._normalize(obs), state)
        dist, value = self._heads(actor, critic)
        return dist.log_prob(action), dist.entropy(), value

    @staticmethod
    def reset_state(
        state: tuple[torch.Tensor, ...], is_init: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """Zeroes each ``[W, layers, H]`` state where ``is_init`` ``[W]`` is True."""
        if not state:
            return state
        keep = (~is_init).view(-1, 1, 1).to(state[0].dtype)
        return tuple(s * keep for s in state)
