"""The actor-critic's parameters: encoder -> LSTM/GRU/none -> policy and value heads."""

from __future__ import annotations

import math
from typing import Any, Literal

import gymnasium as gym
import torch
from tensordict import NestedKey, TensorDictBase
from torch import nn

from rppo_td._validation import is_integer
from rppo_td.modules._encoders import ObservationEncoder
from rppo_td.modules._heads import make_action_head
from rppo_td.modules._normalizer import ObservationNormalizer
from rppo_td.modules._spaces import (
    ImageLayout,
    check_image_layout,
    is_image,
    observation_leaves,
)

__all__ = ["RecurrentActorCritic", "Recurrence"]

Recurrence = Literal["lstm", "gru", "none"]
STATE_KEYS = {"lstm": ("recurrent_state_h", "recurrent_state_c"), "gru": ("recurrent_state_h",)}


def _hidden_layers(in_features: int, hidden: int, layers: int) -> nn.Sequential:
    """``layers`` x (Linear, ReLU), orthogonal ``sqrt(2)``: ``[*B, in]`` -> ``[*B, hidden]``."""
    modules: list[nn.Module] = []
    width = in_features
    for _ in range(layers):
        linear = nn.Linear(width, hidden)
        nn.init.orthogonal_(linear.weight, math.sqrt(2))
        nn.init.zeros_(linear.bias)
        modules += [linear, nn.ReLU()]
        width = hidden
    return nn.Sequential(*modules)


def _mlp_head(in_features: int, hidden: int, layers: int, out: int, gain: float) -> nn.Sequential:
    """``_hidden_layers`` then a Linear to ``out`` (orthogonal ``gain``)."""
    body = _hidden_layers(in_features, hidden, layers)
    last = nn.Linear(hidden if layers else in_features, out)
    nn.init.orthogonal_(last.weight, gain)
    nn.init.zeros_(last.bias)
    return nn.Sequential(*body, last)


class _Trunk(nn.Module):
    """Encoder then LSTM/GRU (or nothing): obs ``[N, L]`` -> features ``[N, L, F]``.

    ``F`` (``out_features``) is ``H``, or ``2 * H`` with ``encoder_skip``: the core's output
    then the encoder's features of the same step.
    """

    def __init__(
        self,
        leaves,
        recurrence: str,
        hidden_size: int,
        num_layers: int,
        forget_bias: float = 0.0,
        image_layout: ImageLayout = "auto",
        encoder_skip: bool = False,
    ) -> None:
        super().__init__()
        self.encoder_skip = encoder_skip and recurrence != "none"
        self.out_features = hidden_size * (2 if self.encoder_skip else 1)
        self.encoder = ObservationEncoder(
            leaves, hidden_size=hidden_size, image_layout=image_layout
        )
        self.core: nn.Module | None = None
        if recurrence == "lstm":
            self.core = nn.LSTM(hidden_size, hidden_size, num_layers, batch_first=True)
            if forget_bias:
                # gates are stacked (input, forget, cell, output) along the bias
                with torch.no_grad():
                    for layer in range(num_layers):
                        bias = getattr(self.core, f"bias_ih_l{layer}")
                        bias[hidden_size : 2 * hidden_size] += forget_bias
        elif recurrence == "gru":
            self.core = nn.GRU(hidden_size, hidden_size, num_layers, batch_first=True)

    def forward(
        self,
        obs: TensorDictBase,
        state: tuple[torch.Tensor, ...],
        restart: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """Runs ``L`` steps from ``state``; returns features and the states after the last.

        Args:
            obs: batch ``[N, L]``.
            state: entering position 0, each ``[N, layers, H]``; or, with ``restart``, the
                state stored at every position, each ``[N, L, layers, H]``.
            restart: ``[N, L]`` bool: at position ``t > 0`` where True the core restarts from
                the stored state ``state[:, t]`` instead of running on (position 0 always
                starts from ``state[:, 0]``).

        Returns:
            ``([N, L, F], final states [N, layers, H])``.
        """
        features = self.encoder(obs)
        if self.core is None:
            return features, ()
        out, final = self._core(features, state, restart)
        if self.encoder_skip:
            out = torch.cat((out, features), dim=-1)
        return out, final

    def _core(
        self,
        features: torch.Tensor,
        state: tuple[torch.Tensor, ...],
        restart: torch.Tensor | None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The core over encoder ``features`` ``[N, L, H]``: ``([N, L, H], final states)``."""
        if restart is None:
            return self._run(features, state)
        # a restart inside a row: step through the positions (rare in training batches,
        # whose sequences never cross an episode start)
        carry = tuple(s[:, 0] for s in state)
        outputs = []
        for t in range(features.shape[1]):
            if t:
                here = restart[:, t].view(-1, 1, 1)
                carry = tuple(
                    torch.where(here, s[:, t], c) for s, c in zip(state, carry, strict=True)
                )
            out, carry = self._run(features[:, t : t + 1], carry)
            outputs.append(out)
        return torch.cat(outputs, dim=1), carry

    def scan(
        self,
        obs: TensorDictBase,
        state: tuple[torch.Tensor, ...],
        is_init: torch.Tensor,
        active: torch.Tensor | None = None,
    ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """Steps the core through ``L`` positions, recording the state entering each.

        The encoder runs once over all positions; the core one position at a time, all rows
        together (a loop over time only).

        Args:
            obs: batch ``[N, L]``.
            state: entering position 0, each ``[N, layers, H]``.
            is_init: ``[N, L]`` bool: the state entering an active position where True is
                zero (an episode's first step).
            active: ``[N, L]`` bool, or None (every position): where False the position is
                skipped and the state carried over unchanged.

        Returns:
            ``(entering, final)``: the states entering each position ``[N, L, layers, H]``
            (after the reset at ``is_init``) and after the last ``[N, layers, H]``.
        """
        assert self.core is not None
        features = self.encoder(obs)
        carry = state
        entering: list[tuple[torch.Tensor, ...]] = []
        for t in range(features.shape[1]):
            on = None if active is None else active[:, t].view(-1, 1, 1)
            reset = is_init[:, t].view(-1, 1, 1)
            if on is not None:
                reset = reset & on
            carry = tuple(torch.where(reset, 0.0, c) for c in carry)
            entering.append(carry)
            _, after = self._run(features[:, t : t + 1], carry)
            carry = (
                after
                if on is None
                else tuple(torch.where(on, a, c) for a, c in zip(after, carry, strict=True))
            )
        stacked = tuple(torch.stack(parts, dim=1) for parts in zip(*entering, strict=True))
        return stacked, carry

    def final_states(
        self, obs: TensorDictBase, state: tuple[torch.Tensor, ...], lengths: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """The states after each row's first ``lengths`` steps (padding skipped).

        Args:
            obs: batch ``[N, L]``.
            state: entering position 0, each ``[N, layers, H]``.
            lengths: ``[N]`` int64 in ``[1, L]``.

        Returns:
            The states after step ``lengths - 1`` of each row, each ``[N, layers, H]``.
        """
        assert self.core is not None
        features = self.encoder(obs)
        packed = nn.utils.rnn.pack_padded_sequence(
            features, lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        hidden = tuple(s.transpose(0, 1).contiguous() for s in state)
        _, final = self.core(packed, hidden if len(hidden) == 2 else hidden[0])
        final = final if isinstance(final, tuple) else (final,)
        return tuple(s.transpose(0, 1) for s in final)

    def _run(
        self, features: torch.Tensor, state: tuple[torch.Tensor, ...]
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        assert self.core is not None
        hidden = tuple(s.transpose(0, 1).contiguous() for s in state)
        out, final = self.core(features, hidden if len(hidden) == 2 else hidden[0])
        final = final if isinstance(final, tuple) else (final,)
        return out, tuple(s.transpose(0, 1) for s in final)


class RecurrentActorCritic(nn.Module):
    """The parameters of an actor-critic built from the env's spaces.

    Its TorchRL faces are [`RecurrentActor`][rppo_td.modules.RecurrentActor] and
    [`RecurrentCritic`][rppo_td.modules.RecurrentCritic].

    Observations are tensordicts of the leaves ``observation_leaves(observation_space)``.
    Each network's recurrent state is stored in rollouts under its own keys, the state
    *entering* a step, ``[*B, num_layers, hidden_size]`` each: ``actor_state_keys``
    (``recurrent_state_h`` and, for an LSTM, ``recurrent_state_c``) and ``critic_state_keys``
    (``critic_recurrent_state_h``/``_c``; the actor's with ``shared_critic``).
    ``recurrence="none"`` keeps the same encoder and heads with no memory (no state keys).

    Args:
        observation_space: any space ``observation_leaves`` accepts.
        action_space: Discrete, 1-D MultiDiscrete or 1-D Box.
        recurrence: ``"lstm"``, ``"gru"`` or ``"none"``.
        hidden_size: width of the encoder, the recurrent core and the head layers.
        num_layers: recurrent layers.
        head_layers: hidden layers in each of the policy and value heads.
        forget_bias: added to the initial bias of every LSTM layer's forget gate (0 keeps
            PyTorch's initialisation). At 0 the gate starts near 0.5, so a cue fades by about
            ``2**-k`` over ``k`` steps before training has taught the core to keep it; 3 to 5
            keep it from the start (a cue-comparison task is learnt several times faster,
            ``benchmarks/memory_readout.py``). LSTM only.
        encoder_skip: the heads read the encoder's features of the current step beside the
            core's output (``2 * hidden_size`` inputs), so what is in view reaches them in
            one linear map and the core is left to carry only what must be remembered
            (a cue-comparison task is fitted in about 4x fewer iterations,
            ``benchmarks/memory_readout.py --encoder-skip 0 1``). No effect with
            ``recurrence="none"``.
        shared_critic: one encoder and core for both heads; False (default) gives the critic
            its own, so value-loss gradients never move the policy's features.
        normalize_observations: scale float and integer vector leaves by running statistics
            (``ObservationNormalizer``, ``self.normalizer``). Off by default: its statistics
            change only in ``net.normalizer.update(rollout)``, which ``rppo-train`` calls
            after each PPO update and a loop of one's own must call the same way; never
            updated, it is the identity followed by a clamp to [-10, 10].
        center_observations: the normaliser subtracts the running mean too. Off by default:
            a centred position moves the point the policy treats as zero wherever the policy
            has been taking it (see ``ObservationNormalizer``). No effect without
            ``normalize_observations``.
        image_layout: how uint8 image leaves are read: ``"auto"`` from the shape (the end
            that is 1, 3 or 4 is the channel axis; a shape where both are, such as
            ``[3, 4, 4]``, is refused by name), or ``"channels_first"`` / ``"channels_last"``.

    Example:
        >>> from tensordict import TensorDict
        >>> net = RecurrentActorCritic(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2),
        ...                            recurrence="lstm", hidden_size=8)
        >>> obs = TensorDict({"observation": torch.zeros(3, 5, 2)}, batch_size=[3, 5])
        >>> state = tuple(torch.zeros(3, *net.state_shape) for _ in net.actor_state_keys)
        >>> dist, final = net.policy(obs, state)
        >>> dist.sample().shape, final[0].shape, net.critic_state_keys
        (torch.Size([3, 5]), torch.Size([3, 1, 8]), ('critic_recurrent_state_h', \
'critic_recurrent_state_c'))
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
        forget_bias: float = 0.0,
        encoder_skip: bool = False,
        shared_critic: bool = False,
        normalize_observations: bool = False,
        center_observations: bool = False,
        image_layout: ImageLayout = "auto",
    ) -> None:
        super().__init__()
        if recurrence not in ("lstm", "gru", "none"):
            raise ValueError(f"recurrence must be 'lstm', 'gru' or 'none', got {recurrence!r}")
        check_image_layout(image_layout)
        if not math.isfinite(forget_bias):
            raise ValueError(f"forget_bias must be a finite number, got {forget_bias!r}")
        if forget_bias and recurrence != "lstm":
            raise ValueError(
                f"forget_bias is for an LSTM's forget gate; recurrence is {recurrence!r}, "
                f"so forget_bias must be 0, got {forget_bias!r}"
            )
        for name, value, low in (
            ("hidden_size", hidden_size, 1),
            ("num_layers", num_layers, 1),
            ("head_layers", head_layers, 0),
        ):
            # numpy's integers are ints here (a config read through numpy, a sweep's grid)
            if not is_integer(value):
                raise ValueError(
                    f"{name} must be an int >= {low}, got {value!r} ({type(value).__name__})"
                )
            if value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        hidden_size, num_layers, head_layers = int(hidden_size), int(num_layers), int(head_layers)
        for name, flag in (
            ("encoder_skip", encoder_skip),
            ("shared_critic", shared_critic),
            ("normalize_observations", normalize_observations),
            ("center_observations", center_observations),
        ):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        self.recurrence = recurrence
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.shared_critic = shared_critic
        self.action_space = action_space
        self.leaves = observation_leaves(observation_space)
        # what normalize() checks: every leaf's shape after the batch dims (a Box one of
        # another shape could broadcast against the statistics; a Discrete one is an index,
        # and a one-hot or [*B, 1] one would reach the core with extra dims), and that the
        # image leaves are uint8
        self._leaf_shapes = [(key, tuple(space.shape or ())) for key, space in self.leaves]
        self._image_keys = [key for key, space in self.leaves if is_image(space)]
        self.normalizer = (
            ObservationNormalizer(self.leaves, center=center_observations)
            if normalize_observations
            else None
        )
        trunk_args = (self.leaves, recurrence, hidden_size, num_layers, forget_bias, image_layout)
        self.actor_trunk = _Trunk(*trunk_args, encoder_skip)
        self.critic_trunk = None if shared_critic else _Trunk(*trunk_args, encoder_skip)
        features = self.actor_trunk.out_features
        self.action_head = make_action_head(action_space, hidden_size if head_layers else features)
        # head_layers ReLU layers, then the action head's linear map: the policy is as deep
        # as the value head (a nonlinear read-out of the core, which tasks that compare a
        # memory with what is in view need)
        self.policy_mlp: nn.Module = _hidden_layers(features, hidden_size, head_layers)
        self.value_head = _mlp_head(features, hidden_size, head_layers, 1, 1.0)
        # float32 whatever torch's default dtype (after torch.set_default_dtype(torch.float64)
        # the layers were built float64, which the float32 computation refuses); the
        # normaliser's statistics keep float64
        self.float()

    @property
    def encoder_skip(self) -> bool:
        """Whether the heads read the encoder's features beside the core's (never without one)."""
        return self.actor_trunk.encoder_skip

    @property
    def observation_keys(self) -> list[NestedKey]:
        """The observation leaves' keys, in order."""
        return [key for key, _ in self.leaves]

    @property
    def image_keys(self) -> list[NestedKey]:
        """The keys of the uint8 image leaves (read by a CNN, see ``image_layout``), in order."""
        return list(self._image_keys)

    @property
    def actor_state_keys(self) -> tuple[str, ...]:
        """Rollout keys of the actor's recurrent state (empty without recurrence)."""
        return STATE_KEYS.get(self.recurrence, ())

    @property
    def critic_state_keys(self) -> tuple[str, ...]:
        """Rollout keys of the critic's recurrent state (the actor's if shared)."""
        if self.shared_critic:
            return self.actor_state_keys
        return tuple(f"critic_{key}" for key in self.actor_state_keys)

    @property
    def state_keys(self) -> tuple[str, ...]:
        """Every recurrent-state key of the rollout: the actor's, then the critic's."""
        return tuple(dict.fromkeys((*self.actor_state_keys, *self.critic_state_keys)))

    def critic_only_parameters(self) -> list[nn.Parameter]:
        """The parameters only the value reads (the actor reads every other one).

        The value head's, and the critic's own trunk's where it has one
        (``shared_critic=False``).
        """
        parts = (
            [self.value_head] if self.critic_trunk is None else [self.value_head, self.critic_trunk]
        )
        return [param for part in parts for param in part.parameters()]

    @property
    def state_shape(self) -> tuple[int, int]:
        """``(num_layers, hidden_size)``: the shape of one step's state under each key."""
        return (self.num_layers, self.hidden_size)

    def _dtype_probe(self) -> torch.Tensor:
        """The first parameter (every parameter has its dtype unless cast one by one)."""
        return next(self.parameters())

    def normalize(self, obs: TensorDictBase) -> TensorDictBase:
        """The observations normalised by the running statistics (unchanged without).

        Every raw observation enters through here, so here a leaf of another shape than
        ``[*B, *space.shape]`` is refused (a ``Box`` one could broadcast against the
        statistics and give features of the right width from the wrong data; a ``Discrete``
        one is ``[*B]``, an index, not one-hot), and an image leaf that is not ``uint8``
        (the encoder scales it to [0, 1] by its Box bounds).

        The network's own dtype is checked here too: it computes in float32 (its encoders
        cast the observations to float32), so parameters cast to another dtype
        (``.double()``, ``.half()``, ``.to(torch.bfloat16)``) are refused by name rather
        than failing inside a layer with a dtype mismatch.

        Raises:
            ValueError: naming the key, the expected and the actual shape or dtype.
        """
        weight = self._dtype_probe()
        if weight.dtype != torch.float32:
            raise ValueError(
                f"RecurrentActorCritic computes in float32, and its parameters are "
                f"{weight.dtype} (cast by .double(), .half() or .to(dtype)?): keep them "
                "float32 (net.float())"
            )
        lead = obs.batch_dims
        for key, shape in self._leaf_shapes:
            value = obs.get(key, None)
            if not isinstance(value, torch.Tensor):
                continue  # a missing leaf is named where it is read
            if tuple(value.shape[lead:]) != shape:
                index = " (an index, not one-hot)" if not shape else ""
                raise ValueError(
                    f"observation {key!r} must have the space's shape {list(shape)}{index} "
                    f"after its batch dims, got {list(value.shape[lead:])}"
                )
        for key in self._image_keys:
            value = obs.get(key, None)
            if isinstance(value, torch.Tensor) and value.dtype != torch.uint8:
                raise ValueError(
                    f"image observation {key!r} must be uint8 (the encoder scales it by its "
                    f"Box bounds), got {value.dtype}"
                )
        return obs if self.normalizer is None else self.normalizer(obs)

    def policy(
        self,
        obs: TensorDictBase,
        state: tuple[torch.Tensor, ...],
        restart: torch.Tensor | None = None,
        *,
        batch_shape: tuple[int, ...] | None = None,
        normalized: bool = False,
    ) -> tuple[Any, tuple[torch.Tensor, ...]]:
        """The action distribution over ``L`` steps and the actor's state after them.

        Args:
            obs: batch ``[N, L]``.
            state: the actor's, entering position 0, each ``[N, layers, H]`` (or stored at
                every position, ``[N, L, layers, H]``, with ``restart``).
            restart: ``[N, L]`` bool; see ``_Trunk.forward``.
            batch_shape: the distribution's batch shape (``N * L`` elements); default
                ``[N, L]``.
            normalized: ``obs`` is already ``normalize(obs)``.

        Returns:
            A distribution of batch ``batch_shape`` (``sample``, ``log_prob``, ``entropy``,
            ``mode``) and the final states ``[N, layers, H]``.
        """
        obs = obs if normalized else self.normalize(obs)
        features, final = self.actor_trunk(obs, state, restart)
        return self._distribution(features, batch_shape), final

    def _distribution(self, features: torch.Tensor, batch_shape: tuple[int, ...] | None) -> Any:
        """The policy head over the actor trunk's ``[N, L, F]`` features, batch ``batch_shape``."""
        if batch_shape is not None:
            features = features.reshape(*batch_shape, features.shape[-1])
        return self.action_head(self.policy_mlp(features))

    def scan(
        self,
        obs: TensorDictBase,
        state: tuple[torch.Tensor, ...],
        is_init: torch.Tensor,
        active: torch.Tensor | None = None,
        *,
        critic: bool = False,
        normalized: bool = False,
    ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
        """The actor's (or, with ``critic``, the critic's) states along ``L`` steps.

        Args:
            obs: batch ``[N, L]``.
            state: that network's, entering position 0, each ``[N, layers, H]``.
            is_init: ``[N, L]`` bool; the state entering an episode's first step is zero.
            active: ``[N, L]`` bool or None; where False the state is carried unchanged.
            critic: the critic's trunk (the actor's with ``shared_critic``).
            normalized: ``obs`` is already ``normalize(obs)``.

        Returns:
            ``(entering [N, L, layers, H] each, final [N, layers, H] each)``; empty tuples
            with ``recurrence="none"``.
        """
        if self.recurrence == "none":
            return (), ()
        trunk = self.critic_trunk if critic and self.critic_trunk is not None else self.actor_trunk
        obs = obs if normalized else self.normalize(obs)
        return trunk.scan(obs, state, is_init, active)

    def final_states(
        self,
        obs: TensorDictBase,
        state: tuple[torch.Tensor, ...],
        lengths: torch.Tensor,
        *,
        critic: bool = False,
        normalized: bool = False,
    ) -> tuple[torch.Tensor, ...]:
        """The actor's (or critic's) states after each row's first ``lengths`` steps.

        Args:
            obs: batch ``[N, L]``.
            state: that network's, entering position 0, each ``[N, layers, H]``.
            lengths: ``[N]`` int64 in ``[1, L]``; later positions are skipped.
            critic: the critic's trunk (the actor's with ``shared_critic``).
            normalized: ``obs`` is already ``normalize(obs)``.

        Returns:
            Each ``[N, layers, H]``; an empty tuple with ``recurrence="none"``.
        """
        if self.recurrence == "none":
            return ()
        trunk = self.critic_trunk if critic and self.critic_trunk is not None else self.actor_trunk
        obs = obs if normalized else self.normalize(obs)
        return trunk.final_states(obs, state, lengths)

    def policy_and_value(
        self,
        obs: TensorDictBase,
        state: tuple[torch.Tensor, ...],
        restart: torch.Tensor | None = None,
        *,
        batch_shape: tuple[int, ...] | None = None,
        normalized: bool = False,
    ) -> tuple[Any, torch.Tensor, tuple[torch.Tensor, ...]]:
        """``policy`` and ``value`` of a ``shared_critic`` net, its trunk run once for both.

        The same distribution, values and final states as calling the two (which would run
        the shared encoder and core twice over the same inputs); gradients reach the trunk
        from both heads through one graph.

        Args and states as in ``policy`` (the one state of the shared trunk).

        Returns:
            ``(distribution of batch batch_shape, V [N, L, 1], final states [N, layers, H])``.

        Raises:
            ValueError: the net has a critic trunk of its own (``shared_critic=False``).
        """
        if self.critic_trunk is not None:
            raise ValueError(
                "policy_and_value needs shared_critic=True: this net's critic has a trunk of "
                "its own; call policy and value"
            )
        obs = obs if normalized else self.normalize(obs)
        features, final = self.actor_trunk(obs, state, restart)
        return self._distribution(features, batch_shape), self.value_head(features), final

    def value(
        self,
        obs: TensorDictBase,
        state: tuple[torch.Tensor, ...],
        restart: torch.Tensor | None = None,
        *,
        normalized: bool = False,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """``V`` ``[N, L, 1]`` over ``L`` steps and the critic's state after them.

        Args and states as in ``policy``, with the critic's state.
        """
        trunk = self.actor_trunk if self.critic_trunk is None else self.critic_trunk
        obs = obs if normalized else self.normalize(obs)
        features, final = trunk(obs, state, restart)
        return self.value_head(features), final
