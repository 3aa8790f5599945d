"""The actor-critic as TorchRL TensorDict modules: ``RecurrentActor`` and ``RecurrentCritic``.

Both run in TorchRL's two modes, as ``LSTMModule`` does:

- **step mode** (the default; collectors): batch ``[*B]``, one step; the state is read from
  the state keys (zero where missing), zeroed where ``is_init`` is True, and the state after
  the step is written to ``("next", <state key>)``.
- **recurrent mode** (inside ``torchrl.modules.set_recurrent_mode(True)``; losses): batch
  ``[*B, L]``, time last; each row runs from the state stored at its position 0 and, where
  ``is_init`` is True at a later position, restarts from the state stored there (TorchRL's
  split semantics). No state is written.
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from tensordict.nn import InteractionType, TensorDictModuleBase
from tensordict.nn.probabilistic import interaction_type
from torchrl.data import Composite, MultiOneHot, OneHot, Unbounded
from torchrl.envs.transforms import TensorDictPrimer
from torchrl.modules import recurrent_mode

from rppo_td._validation import MissingKeyError
from rppo_td.modules._actor_critic import RecurrentActorCritic

__all__ = ["RecurrentActor", "RecurrentCritic", "RecurrentPolicy", "recurrent_state_primer"]

_IS_INIT = "is_init"
_DETERMINISTIC = (
    InteractionType.DETERMINISTIC,
    InteractionType.MODE,
    InteractionType.MEAN,
    InteractionType.MEDIAN,
)


class _Inputs:
    """A tensordict's inputs flattened to ``[N, L]`` for one of the networks."""

    def __init__(
        self,
        module: _NetModule,
        tensordict: TensorDictBase,
    ) -> None:
        net = module.net
        self.recurrent = bool(recurrent_mode())
        batch = tuple(tensordict.batch_size)
        if self.recurrent:
            if not batch or batch[-1] == 0:
                raise ValueError(
                    f"{type(module).__name__} in recurrent mode needs a time dimension of at "
                    f"least one step (the last batch dimension); got batch size {list(batch)}"
                )
            n, length = math.prod(batch[:-1]), batch[-1]
        else:
            n, length = math.prod(batch), 1
        self.batch = batch
        self.n = n
        if self.recurrent:
            flat = tensordict if len(batch) == 2 else tensordict.reshape(n, length)
        else:
            flat = tensordict if len(batch) == 1 else tensordict.reshape(n)
        try:
            obs = flat.select(*net.observation_keys)
        except KeyError:
            raise _missing_observations(type(module).__name__, net.observation_keys, flat) from None
        self.obs = obs if self.recurrent else obs.unsqueeze(1)
        is_init = flat.get(module.is_init_key, None)
        if is_init is None:
            raise MissingKeyError(
                f"{type(module).__name__} needs {module.is_init_key!r} ([*B, 1] bool, True at "
                "an episode's first step; TorchRL's InitTracker writes it) to reset its state"
            )
        expected = (n, length, 1) if self.recurrent else (n, 1)
        if is_init.dtype != torch.bool or is_init.numel() != math.prod(expected):
            raise ValueError(
                f"{module.is_init_key!r} must be bool of shape {[*batch, 1]}, got "
                f"{is_init.dtype} {list(tensordict.get(module.is_init_key).shape)}"
            )
        is_init = is_init.reshape(n, length)
        shape = net.state_shape
        stored: list[torch.Tensor] = []
        for key in module.state_keys:
            value = flat.get(key, None)
            full = (n, length, *shape) if self.recurrent else (n, *shape)
            if value is None:
                value = torch.zeros(full, dtype=torch.float32, device=is_init.device)
            elif tuple(value.shape) != full:
                raise ValueError(
                    f"{key!r} must have shape {[*batch, *shape]} (batch, layers, hidden), got "
                    f"{list(tensordict.get(key).shape)}"
                )
            elif value.dtype != torch.float32:
                # oneDNN's error for it names nothing ("get_mkldnn_dtype: unsupported ...")
                raise ValueError(f"{key!r} must be float32, the network's dtype, got {value.dtype}")
            stored.append(value)
        self.restart: torch.Tensor | None = None
        if self.recurrent:
            if length > 1 and bool(is_init[:, 1:].any()):
                self.restart = is_init
                self.state = tuple(stored)
            else:
                self.state = tuple(s[:, 0] for s in stored)
        elif stored:
            # where, not a product: a NaN or inf stored state is zeroed at a reset too
            reset = is_init.view(n, 1, 1)
            self.state = tuple(torch.where(reset, 0.0, s) for s in stored)
        else:
            self.state = ()

    def write_state(
        self, tensordict: TensorDictBase, keys: tuple[str, ...], final: tuple[torch.Tensor, ...]
    ) -> None:
        """Step mode: the states after the step into ``("next", key)``, ``[*B, layers, H]``."""
        if self.recurrent or not keys:
            return
        batch = self.batch
        values = {
            k: v if len(batch) == 1 else v.reshape(*batch, *v.shape[1:])
            for k, v in zip(keys, final, strict=True)
        }
        following = tensordict.get("next", None)
        if following is None:
            tensordict.set("next", TensorDict(values, batch_size=batch, device=tensordict.device))
        else:
            following.update(values)


def _checked(net: RecurrentActorCritic) -> RecurrentActorCritic:
    if not isinstance(net, RecurrentActorCritic):
        raise TypeError(f"net must be a RecurrentActorCritic, got {type(net).__name__}")
    return net


class _NetModule(TensorDictModuleBase):
    #: Runs in recurrent mode whenever TorchRL's ``recurrent_mode()`` is set (there is no
    #: per-module switch): what ``rppo_td._values`` reads to split ``"next"`` at ``is_init``.
    follows_recurrent_mode = True

    def __init__(
        self, net: RecurrentActorCritic, state_keys: tuple[str, ...], is_init_key: str
    ) -> None:
        super().__init__()
        self.net = net
        self.state_keys = state_keys
        self.is_init_key = is_init_key
        self.in_keys = [*net.observation_keys, is_init_key, *state_keys]

    def _state_out_keys(self) -> list[NestedKey]:
        return [("next", key) for key in self.state_keys]

    def _trunks(self) -> tuple[tuple[tuple[str, ...], bool], ...]:
        """``(state keys, is the critic's)`` of each network this module runs."""
        raise NotImplementedError

    def final_states(
        self,
        tensordict: TensorDictBase,
        start: dict[str, torch.Tensor],
        lengths: torch.Tensor,
    ) -> dict[str, torch.Tensor]:
        """The states after each row's first ``lengths`` steps, each network in one call.

        Rows are sequences of one episode (no ``is_init`` after position 0 is honoured: the
        padded sequences of ``SequencePadder`` never hold one); the steps past a row's length
        (padding) are skipped, not run (``pack_padded_sequence``).

        Args:
            tensordict: ``[N, L]`` with the observation leaves.
            start: each state key's state entering position 0, ``[N, layers, H]``.
            lengths: ``[N]`` int64 in ``[1, L]``.

        Returns:
            Per state key, the state after step ``lengths - 1``, ``[N, layers, H]``.
        """
        obs = self.net.normalize(tensordict.select(*self.net.observation_keys))
        final: dict[str, torch.Tensor] = {}
        for keys, critic in self._trunks():
            if not keys or all(key in final for key in keys):
                continue
            last = self.net.final_states(
                obs, tuple(start[key] for key in keys), lengths, critic=critic, normalized=True
            )
            final.update(zip(keys, last, strict=True))
        return final

    def scan_states(
        self,
        tensordict: TensorDictBase,
        start: dict[str, torch.Tensor],
        active: torch.Tensor | None = None,
    ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """This module's recurrent states along rows of ``L`` steps, in one pass per network.

        What running the module step by step in step mode gives (the reference
        ``SequenceStartStates`` checks against), with the encoder run once over all
        positions and only the core stepped.

        Args:
            tensordict: ``[N, L]`` with the observation leaves and ``is_init``.
            start: each state key's state entering position 0, ``[N, layers, H]``.
            active: ``[N, L]`` bool or None (all); where False the state is carried on.

        Returns:
            ``(entering, final)``: per state key, the state entering each position
            ``[N, L, layers, H]`` (zero at an active ``is_init``) and after the last
            ``[N, layers, H]``.
        """
        if tensordict.batch_dims != 2:
            raise ValueError(
                "scan_states needs a [N, L] tensordict, got batch size "
                f"{list(tensordict.batch_size)}"
            )
        n, length = tensordict.batch_size
        is_init = tensordict.get(self.is_init_key).reshape(n, length)
        obs = self.net.normalize(tensordict.select(*self.net.observation_keys))
        entering: dict[str, torch.Tensor] = {}
        final: dict[str, torch.Tensor] = {}
        for keys, critic in self._trunks():
            if not keys or all(key in entering for key in keys):
                continue
            states, last = self.net.scan(
                obs,
                tuple(start[key] for key in keys),
                is_init,
                active,
                critic=critic,
                normalized=True,
            )
            entering.update(zip(keys, states, strict=True))
            final.update(zip(keys, last, strict=True))
        return entering, final


class _ActingModule(_NetModule):
    """A module that samples actions: the interaction type and writing the action.

    Subclasses name the state keys they carry (``_state_keys_of``) and what they write
    besides the action and its log-prob (``_outputs``).
    """

    _outputs: tuple[str, ...] = ()

    def __init__(
        self,
        net: RecurrentActorCritic,
        *,
        default_interaction_type: InteractionType = InteractionType.DETERMINISTIC,
        is_init_key: str = _IS_INIT,
    ) -> None:
        super().__init__(net, self._state_keys_of(_checked(net)), is_init_key)
        self.default_interaction_type = InteractionType(default_interaction_type)
        self.out_keys = ["action", "action_log_prob", *self._outputs, *self._state_out_keys()]

    @staticmethod
    def _state_keys_of(net: RecurrentActorCritic) -> tuple[str, ...]:
        raise NotImplementedError

    def _act(self, tensordict: TensorDictBase, dist: Any) -> None:
        """Writes ``action`` (the mode or a sample) and its ``action_log_prob``."""
        kind = interaction_type() or self.default_interaction_type
        action = dist.mode if kind in _DETERMINISTIC else dist.sample()
        tensordict.set("action", action)
        tensordict.set("action_log_prob", dist.log_prob(action))


class RecurrentActor(_ActingModule):
    """The policy half of a ``RecurrentActorCritic`` as a TorchRL probabilistic actor.

    Reads the observation leaves, ``is_init`` (``[*B, 1]`` bool) and the actor's state keys
    (``[*B, layers, H]``); writes ``action``, ``action_log_prob`` (``[*B]``) and, in step
    mode, ``("next", <state key>)``. ``get_dist(tensordict)`` gives the distribution (what
    ``ClipPPOLoss`` and ``rppo_td.RecurrentPPOLoss`` call). The action is sampled under
    ``set_exploration_type(RANDOM)`` (what collectors set) and is the mode under
    ``DETERMINISTIC``/``MODE``/``MEAN``; with neither set, ``default_interaction_type``.
    See the module docstring for step and recurrent mode. To act (a rollout, an evaluation),
    call it under ``torch.no_grad()``: the parameters require grad, and a state carried from
    step to step would otherwise carry the graph of every step before it.

    Args:
        net: the parameters.
        default_interaction_type: used outside any ``set_exploration_type``;
            ``DETERMINISTIC`` (TorchRL's default for probabilistic actors).
        is_init_key: the key of ``is_init``.

    Example:
        >>> import gymnasium as gym
        >>> from tensordict import TensorDict
        >>> from torchrl.envs.utils import ExplorationType, set_exploration_type
        >>> net = RecurrentActorCritic(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2),
        ...                            hidden_size=8)
        >>> td = TensorDict({"observation": torch.zeros(3, 2),
        ...                  "is_init": torch.ones(3, 1, dtype=torch.bool)}, batch_size=[3])
        >>> with set_exploration_type(ExplorationType.RANDOM), torch.no_grad():
        ...     td = RecurrentActor(net)(td)
        >>> td["action"].shape, td["action_log_prob"].shape, td["next", "recurrent_state_c"].shape
        (torch.Size([3]), torch.Size([3]), torch.Size([3, 1, 8]))
    """

    @staticmethod
    def _state_keys_of(net: RecurrentActorCritic) -> tuple[str, ...]:
        return net.actor_state_keys

    def _trunks(self) -> tuple[tuple[tuple[str, ...], bool], ...]:
        return ((self.net.actor_state_keys, False),)

    def _dist(self, tensordict: TensorDictBase) -> tuple[Any, _Inputs, tuple[torch.Tensor, ...]]:
        inputs = _Inputs(self, tensordict)
        dist, final = self.net.policy(
            inputs.obs, inputs.state, inputs.restart, batch_shape=inputs.batch
        )
        return dist, inputs, final

    def get_dist(self, tensordict: TensorDictBase) -> Any:
        """The action distribution, batch ``[*B]`` (step mode) or ``[*B, L]`` (recurrent).

        It has ``sample()``, ``log_prob(action)``, ``entropy()`` and ``mode``.
        """
        return self._dist(tensordict)[0]

    def shares_trunk_with(self, critic: object) -> bool:
        """Whether ``critic`` is a ``RecurrentCritic`` of this actor's ``shared_critic`` net.

        Then both read the same inputs through the same encoder and core, and
        ``get_dist_and_value`` gives both outputs for one pass (what ``RecurrentPPOLoss``
        uses instead of running the trunk once for each). False for a subclass that changes
        how the actor's distribution or the critic's value is made (its own ``get_dist``,
        ``_dist`` or ``forward``): the one pass would skip its change.
        """
        return (
            isinstance(critic, RecurrentCritic)
            and type(critic).forward is RecurrentCritic.forward
            and type(self).get_dist is RecurrentActor.get_dist
            and type(self)._dist is RecurrentActor._dist
            and critic.net is self.net
            and self.net.shared_critic
            and critic.is_init_key == self.is_init_key
        )

    def get_dist_and_value(self, tensordict: TensorDictBase) -> tuple[Any, torch.Tensor]:
        """``get_dist(td)`` and the shared critic's ``state_value``, the trunk run once.

        The same distribution and values as ``get_dist`` and ``RecurrentCritic(net)`` give
        (``shared_critic`` nets only, see ``shares_trunk_with``).

        Returns:
            ``(distribution, state_value)``: batch ``[*B]`` and ``[*B, 1]`` (step mode) or
            ``[*B, L]`` and ``[*B, L, 1]`` (recurrent mode).
        """
        inputs = _Inputs(self, tensordict)
        dist, value, _ = self.net.policy_and_value(
            inputs.obs, inputs.state, inputs.restart, batch_shape=inputs.batch
        )
        return dist, value.reshape(*inputs.batch, 1)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Writes the out keys into ``tensordict`` and returns it."""
        dist, inputs, final = self._dist(tensordict)
        self._act(tensordict, dist)
        inputs.write_state(tensordict, self.state_keys, final)
        return tensordict


class RecurrentCritic(_NetModule):
    """The value half of a ``RecurrentActorCritic`` as a TorchRL value operator.

    Reads the observation leaves, ``is_init`` and the critic's state keys; writes
    ``state_value`` (``[*B, 1]``, or ``[*B, L, 1]`` in recurrent mode) and, in step mode,
    ``("next", <state key>)``. See the module docstring for the two modes.

    Args:
        net: the parameters.
        is_init_key: the key of ``is_init``.

    Example:
        >>> import gymnasium as gym
        >>> net = RecurrentActorCritic(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2),
        ...                            hidden_size=8)
        >>> td = TensorDict({"observation": torch.zeros(3, 2),
        ...                  "is_init": torch.ones(3, 1, dtype=torch.bool)}, batch_size=[3])
        >>> td = RecurrentCritic(net)(td)
        >>> td["state_value"].shape, td["next", "critic_recurrent_state_h"].shape
        (torch.Size([3, 1]), torch.Size([3, 1, 8]))
    """

    def __init__(self, net: RecurrentActorCritic, *, is_init_key: str = _IS_INIT) -> None:
        super().__init__(net, _checked(net).critic_state_keys, is_init_key)
        self.out_keys = ["state_value", *self._state_out_keys()]

    def _trunks(self) -> tuple[tuple[tuple[str, ...], bool], ...]:
        return ((self.net.critic_state_keys, True),)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Writes the out keys into ``tensordict`` and returns it."""
        inputs = _Inputs(self, tensordict)
        value, final = self.net.value(inputs.obs, inputs.state, inputs.restart)
        tensordict.set("state_value", value.reshape(*inputs.batch, 1))
        inputs.write_state(tensordict, self.state_keys, final)
        return tensordict


class RecurrentPolicy(_ActingModule):
    """Actor and critic of one ``RecurrentActorCritic`` in one module, for collectors.

    The same inputs and outputs as ``TensorDictSequential(RecurrentActor(net),
    RecurrentCritic(net))`` (``action``, ``action_log_prob``, ``state_value`` and, in step
    mode, ``("next", <state key>)`` for both networks), with one pass over the inputs and one
    observation normalisation for both networks: ``benchmarks/agent_modules.py`` times it.

    Args:
        net: the parameters.
        default_interaction_type: as in ``RecurrentActor``.
        is_init_key: the key of ``is_init``.

    Example:
        >>> import gymnasium as gym
        >>> net = RecurrentActorCritic(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2),
        ...                            hidden_size=8)
        >>> td = TensorDict({"observation": torch.zeros(3, 2),
        ...                  "is_init": torch.ones(3, 1, dtype=torch.bool)}, batch_size=[3])
        >>> td = RecurrentPolicy(net)(td)
        >>> [tuple(td[key].shape) for key in ("action", "action_log_prob", "state_value")]
        [(3,), (3,), (3, 1)]
        >>> len(td["next"].keys())  # both networks' states after the step: h and c of each
        4
    """

    _outputs = ("state_value",)

    @staticmethod
    def _state_keys_of(net: RecurrentActorCritic) -> tuple[str, ...]:
        return net.state_keys

    def _trunks(self) -> tuple[tuple[tuple[str, ...], bool], ...]:
        return ((self.net.actor_state_keys, False), (self.net.critic_state_keys, True))

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Writes the out keys into ``tensordict`` and returns it."""
        net = self.net
        inputs = _Inputs(self, tensordict)
        state = dict(zip(self.state_keys, inputs.state, strict=True))
        obs = net.normalize(inputs.obs)
        actor_state = tuple(state[key] for key in net.actor_state_keys)
        if net.shared_critic:  # one trunk: run it once for both heads
            dist, value, actor_final = net.policy_and_value(
                obs, actor_state, inputs.restart, batch_shape=inputs.batch, normalized=True
            )
            critic_final = actor_final
        else:
            dist, actor_final = net.policy(
                obs, actor_state, inputs.restart, batch_shape=inputs.batch, normalized=True
            )
            value, critic_final = net.value(
                obs,
                tuple(state[key] for key in net.critic_state_keys),
                inputs.restart,
                normalized=True,
            )
        self._act(tensordict, dist)
        tensordict.set("state_value", value.reshape(*inputs.batch, 1))
        final = dict(zip(net.actor_state_keys, actor_final, strict=True))
        final.update(zip(net.critic_state_keys, critic_final, strict=True))
        inputs.write_state(tensordict, self.state_keys, tuple(final[k] for k in self.state_keys))
        return tensordict


def recurrent_state_primer(net: RecurrentActorCritic) -> TensorDictPrimer:
    """TorchRL primer that adds the zero recurrent states ``[layers, H]`` to env resets.

    Args:
        net: the actor-critic (``net.state_keys`` must not be empty).
    """
    if not net.state_keys:
        raise ValueError("recurrence='none' has no recurrent state to prime")
    spec = Composite(
        {key: Unbounded(shape=net.state_shape, dtype=torch.float32) for key in net.state_keys}
    )
    return _StatePrimer(spec, indices=isinstance(net.action_space, _INDEX_SPACES))


_INDEX_SPACES = (gym.spaces.Discrete, gym.spaces.MultiDiscrete)


class _StatePrimer(TensorDictPrimer):
    """``TensorDictPrimer`` that also refuses an env whose actions are one-hot.

    The modules write a ``Discrete`` (``MultiDiscrete``) action as its index (indices);
    TorchRL's ``GymEnv`` expects one-hot actions unless made with
    ``categorical_action_encoding=True``, and reads an index as a one-hot vector: the env then
    gets another action than the policy took, with no error.
    """

    def __init__(self, spec: Composite, *, indices: bool) -> None:
        super().__init__(spec, expand_specs=True)
        self.indices = indices

    def _check_actions(self, action_spec: Composite) -> None:
        action = action_spec.get("action", None)
        if self.indices and isinstance(action, (OneHot, MultiOneHot)):
            raise ValueError(
                f"the env's 'action' spec is {type(action).__name__} (one-hot), but the "
                "network writes a Discrete / MultiDiscrete action as its index: make the env "
                "with GymEnv(..., categorical_action_encoding=True), else it reads each index "
                "as a one-hot vector and takes another action than the policy chose"
            )

    def set_container(self, container: Any) -> None:
        super().set_container(container)
        parent = self.parent  # the env up to this transform: checked as it is appended
        if parent is not None:
            self._check_actions(parent.full_action_spec)

    def transform_input_spec(self, input_spec: Composite) -> Composite:
        self._check_actions(input_spec["full_action_spec"])
        return super().transform_input_spec(input_spec)


def _missing_observations(
    name: str, keys: list[NestedKey], tensordict: TensorDictBase
) -> MissingKeyError:
    """The error for observation keys the input lacks, naming them and what it holds."""
    missing = [key for key in keys if tensordict.get(key, None) is None]
    held = sorted(str(key) for key in tensordict.keys(include_nested=True, leaves_only=True))
    hint = ""
    if "pixels" in held:  # TorchRL's GymEnv names a uint8 image Box observation "pixels"
        hint = (
            "; 'pixels' is TorchRL GymEnv's name for an image observation: rename it, e.g. "
            "env.append_transform(RenameTransform(['pixels'], ['observation']))"
        )
    return MissingKeyError(
        f"{name} reads the observation keys {keys}; the input lacks {missing} (it holds "
        f"{held}){hint}"
    )
