"""SequenceStartStates: the recurrent state each sequence starts from (refreshed, zero, burn-in)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import set_recurrent_mode

from rppo_td._keys import RolloutKeys, as_path
from rppo_td._lazy import shallow_copy
from rppo_td._validation import MissingKeyError, check_dtype, check_shape, get_key, whole_at_least
from rppo_td.functional import burn_in_lengths, burn_in_window, episode_first_steps, unpad_rows
from rppo_td.transforms._base import RolloutTransform

__all__ = ["START_STATES", "SequenceStartStates", "scan_step_by_step", "state_keys_of"]

StartState = Literal["stored", "refreshed", "zero"]
START_STATES: tuple[str, ...] = ("stored", "refreshed", "zero")


class SequenceStartStates(RolloutTransform):
    """Sets the recurrent state each sequence starts from, with the current networks.

    The loss runs each sequence from the state stored at its position 0 (recurrent mode).
    That state was computed during collection, by the network of that time; after the first
    epoch of an update it is stale. This transform replaces it, before each epoch:

    - ``start_state="stored"`` (the default, as in ``TrainConfig`` and ``rppo-train``): the
      state stored during collection (zero at an episode's first step). Without burn-in
      these are the states written, but zero wherever an episode starts (a collector that
      stored another state there, or missed a reset that ``episode_id`` shows, is put right);
      a ``[W, T]`` rollout still needs ``sequence_offset`` to find the sequences' first steps.
    - ``start_state="refreshed"``: recomputed by the current networks, running each
      worker's row from its first stored state and starting from zero at each episode start:
      each ``is_init``, and where the input has ``episode_id``, wherever it changes (so a
      rollout whose ``is_init`` misses a reset still starts each episode from zero; the
      stored states are zeroed there too).
      All rows run together (never a Python loop over workers, episodes or sequences).
    - ``start_state="zero"``: zero.
    - ``burn_in=K`` (with ``"stored"`` or ``"zero"``): the up to ``K`` steps of the same
      episode before each sequence's first step are run through the networks first, from the
      chosen state at the first of them (R2D2's burn-in). Burn-in never crosses an episode
      start nor the rollout's first step; it runs without gradient and adds no loss
      position: ``loss_mask`` and every other key are unchanged. With ``"refreshed"`` it
      changes nothing and is skipped: the refreshed state at a sequence's start already is
      the current network run through every earlier step of the episode in the rollout, the
      burn-in steps included.

    Everything runs without gradient; the states written never require grad.

    **Input.** Either the padded sequences of one rollout (``SequencePadder``'s output
    ``[N, Lp]``, all of its sequences, in any order; ``loss_mask``, ``worker_index`` and
    ``time_index`` locate each step) or the chunked rollout ``[W, T]`` (``sequence_offset``
    marks the sequences' first steps). Both hold the modules' observation inputs, ``is_init``
    (``[*B, 1]`` bool), the state keys (``[*B, *S]``) and, with burn-in, ``episode_id``
    (``EpisodeSplitter``'s). **Output:** a shallow copy with new state tensors. Padded
    sequences get new states at position 0 (what the loss reads; later positions keep the
    stored ones). A ``[W, T]`` rollout gets them at the sequences' first steps, and with
    ``"refreshed"`` at every step. The input is not modified, so the stored states stay
    available to the next epoch.

    **Modules.** Any TorchRL recurrent module in step mode: its state keys are those it
    writes under ``"next"`` (``("next", "recurrent_state_h")``) and also reads, e.g.
    ``LSTMModule``/``GRUModule`` or a ``ProbabilisticActor`` around one. Each is run step by
    step in step mode under ``set_exploration_type(DETERMINISTIC)`` and in eval mode (no
    sampling and no dropout, so no random numbers drawn; each module's mode is restored
    after). rppo_td's ``RecurrentActor``/``RecurrentCritic``/``RecurrentPolicy`` take faster
    paths (``final_states``: padded sequences refreshed in at most
    ``ceil(T / L)`` rounds, the ``k``-th sequence of every episode fragment in one call,
    padding skipped; ``scan_states``: the encoder once over all
    steps, only the core stepped) that give the
    same states. A state key shared by two modules (``shared_critic``) is computed once, by
    the first.

    Args:
        modules: one module or a sequence of them (e.g. ``[actor, critic]``).
        start_state: ``"stored"`` (the default), ``"refreshed"`` or ``"zero"``.
        burn_in: ``K >= 0`` steps of burn-in (an integer: ``int`` or e.g. ``numpy.int64``).
        keys: key overrides (``RolloutKeys``; also ``set_keys(...)``).

    Raises:
        TypeError: a module that is not a TensorDict module (a bare ``torch.nn.LSTM``).
        ValueError: an unknown ``start_state``, a negative ``burn_in``, a module without a
            recurrent state; at call time a missing or malformed key (named; a state key
            must have the module's float dtype and, for rppo_td's modules and TorchRL's
            ``LSTMModule``/``GRUModule``, its ``(layers, hidden)`` shape), or padded sequences
            that are not all the sequences of one rollout.

    Example:
        >>> import gymnasium as gym
        >>> from rppo_td import EpisodeSplitter, SequenceChunker, SequencePadder
        >>> from rppo_td.modules import RecurrentActorCritic, RecurrentActor
        >>> net = RecurrentActorCritic(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2),
        ...                            hidden_size=4)
        >>> W, T = 2, 6
        >>> done = torch.zeros(W, T, 1, dtype=torch.bool)
        >>> rollout = TensorDict({
        ...     "observation": torch.randn(W, T, 2),
        ...     "is_init": torch.zeros(W, T, 1, dtype=torch.bool),
        ...     "recurrent_state_h": torch.zeros(W, T, 1, 4),
        ...     "recurrent_state_c": torch.zeros(W, T, 1, 4),
        ...     "next": {"done": done}}, batch_size=[W, T])
        >>> rollout = SequenceChunker(sequence_length=3)(EpisodeSplitter()(rollout))
        >>> sequences = SequencePadder()(rollout)
        >>> fresh = SequenceStartStates(RecurrentActor(net), burn_in=2)(sequences)
        >>> fresh["recurrent_state_h"].shape, bool(fresh["recurrent_state_h"][1, 0].any())
        (torch.Size([4, 3, 1, 4]), True)
    """

    _in_fields = (
        "is_init",
        "episode_id",
        "sequence_offset",
        "loss_mask",
        "worker_index",
        "time_index",
        "rollout_steps",
    )

    def __init__(
        self,
        modules: TensorDictModuleBase | Sequence[TensorDictModuleBase],
        *,
        start_state: StartState = "stored",
        burn_in: int = 0,
        keys: RolloutKeys | None = None,
    ) -> None:
        super().__init__(keys=keys)
        if start_state not in START_STATES:
            raise ValueError(
                f"start_state must be one of {list(START_STATES)}, got {start_state!r}"
            )
        burn_in = whole_at_least("burn_in", burn_in, 0)
        # one module (a bare torch module too, refused below by name), or an iterable of them
        one = isinstance(modules, torch.nn.Module) and not isinstance(modules, torch.nn.ModuleList)
        if isinstance(modules, (str, bytes, Mapping)):
            # iterating one would check its characters or keys, naming their type, not its own
            raise TypeError(
                "modules must be a TensorDict module or a sequence of them, got "
                f"{type(modules).__name__}"
            )
        module_list = [modules] if one or not isinstance(modules, Iterable) else list(modules)
        for module in module_list:
            if not isinstance(module, TensorDictModuleBase):
                raise TypeError(
                    "modules must be TensorDict modules (an LSTMModule, a ProbabilisticActor "
                    "around one, rppo_td's RecurrentActor, ...) or a sequence of them, got "
                    f"{type(module).__name__}"
                )
        if not module_list:
            raise ValueError("SequenceStartStates needs at least one recurrent module")
        plan: list[tuple[Any, tuple[NestedKey, ...]]] = []
        seen: list[NestedKey] = []
        for module in module_list:
            own = state_keys_of(module)
            new = tuple(key for key in own if key not in seen)
            seen.extend(new)
            if new:
                plan.append((module, own))
        # a plain tuple: the networks stay out of this transform's parameters and state_dict
        self._plan: tuple[tuple[Any, tuple[NestedKey, ...]], ...] = tuple(plan)
        self.state_keys: tuple[NestedKey, ...] = tuple(seen)
        self.start_state: StartState = start_state
        self.burn_in: int = burn_in
        # rppo_td's modules run whole sequences in one call (final_states)
        self._by_sequences: bool = all(hasattr(module, "final_states") for module, _ in plan)
        # each key's (layers, hidden) and dtype, from the core that owns it where it is known
        self._state_shapes: dict[NestedKey, tuple[int, ...]] = {}
        self._state_dtypes: dict[NestedKey, torch.dtype] = {}
        self._read_state_specs()
        self._list_module_keys()

    def _read_state_specs(self) -> None:
        """Each state key's ``(layers, hidden)`` and dtype, from the modules as they are now.

        Read again at every call: a module converted after this transform was built
        (``lstm.double()``) must not have its new dtype refused.
        """
        self._state_shapes.clear()
        self._state_dtypes.clear()
        for module, own in self._plan:
            specs = _state_specs(module, own)
            first = next(iter(module.parameters()), None)
            for key in own:
                if key in specs:
                    self._state_shapes.setdefault(key, specs[key][0])
                    self._state_dtypes.setdefault(key, specs[key][1])
                elif first is not None:  # a core of its own kind: the module's float dtype
                    self._state_dtypes.setdefault(key, first.dtype)

    def _list_module_keys(self) -> None:
        """Lists the modules' inputs and state keys in ``in_keys``, the states in ``out_keys``."""
        read = [key for key in self._input_keys() if key not in self.in_keys]
        self._list_keys([*self.in_keys, *read, *self.state_keys], list(self.state_keys))

    def set_keys(self, **kwargs: NestedKey) -> SequenceStartStates:
        """``RolloutTransform.set_keys``; the modules' own keys stay listed."""
        super().set_keys(**kwargs)
        self._list_module_keys()
        return self

    def _repr_args(self) -> str:
        return f"start_state={self.start_state!r}, burn_in={self.burn_in}"

    def _input_keys(self) -> list[NestedKey]:
        keys: list[NestedKey] = [self.keys.is_init]
        for module, own in self._plan:
            keys += [key for key in module.in_keys if key not in own and key not in keys]
        return keys

    # ---- the two inputs ------------------------------------------------------------------
    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if tensordict.batch_dims != 2:
            raise ValueError(
                "SequenceStartStates expects padded sequences [N, Lp] or a rollout [W, T], "
                f"got batch size {list(tensordict.batch_size)}"
            )
        # [*B, 1] bool, as InitTracker writes it: [*B] or [*B, 1, 1] are refused, not reshaped
        is_init_key = self.keys.is_init
        is_init = get_key(
            tensordict, is_init_key, hint=f"(SequenceStartStates reads {is_init_key!r})"
        )
        check_shape(is_init_key, is_init, (*tensordict.batch_size, 1))
        check_dtype(is_init_key, is_init, torch.bool)
        self._needed(tensordict)  # every key the modules read, refused by name when missing
        self._read_state_specs()
        if tensordict.get(self.keys.loss_mask, None) is not None:
            return self._padded(tensordict)
        # padded sequences under another mask key (or with it dropped) were taken for a
        # rollout, each row a worker: wrong start states, silently
        marks = [self.keys.rollout_steps, self.keys.worker_index, self.keys.time_index]
        found = [key for key in marks if tensordict.get(key, None) is not None]
        if found:
            raise MissingKeyError(
                f"SequenceStartStates: the tensordict holds padded sequences ({found[0]!r}, "
                f"which SequencePadder writes) but no {self.keys.loss_mask!r}; give the padder's "
                "mask key (set_keys(loss_mask=...)), or pass the [W, T] rollout itself"
            )
        return self._rollout(tensordict)

    def _rollout(self, tensordict: TensorDictBase) -> TensorDictBase:
        keys = self.keys
        num_workers, num_time = tensordict.batch_size
        starts = None
        if self.start_state != "refreshed":
            hint = "(SequenceChunker writes it; it marks each sequence's first step)"
            offset = get_key(tensordict, keys.sequence_offset, hint=hint)
            check_shape(keys.sequence_offset, offset, (num_workers, num_time))
            check_dtype(keys.sequence_offset, offset, torch.int64)
            starts = (offset == 0).flatten().nonzero().squeeze(1)
        states = self._states(tensordict.select(*self._needed(tensordict)), starts)
        out = tensordict.copy()
        for key, value in states.items():
            out.set(key, value.view(num_workers, num_time, *value.shape[1:]))
        return out

    def _padded(self, tensordict: TensorDictBase) -> TensorDictBase:
        keys = self.keys
        shape = tuple(tensordict.batch_size)
        hint = "(SequencePadder writes it)"
        mask = get_key(tensordict, keys.loss_mask)
        worker = get_key(tensordict, keys.worker_index, hint=hint)
        time = get_key(tensordict, keys.time_index, hint=hint)
        for key, value, dtype in (
            (keys.loss_mask, mask, torch.bool),
            (keys.worker_index, worker, torch.int64),
            (keys.time_index, time, torch.int64),
        ):
            check_shape(key, value, shape)
            check_dtype(key, value, dtype)
        real = mask.flatten().nonzero().squeeze(1)
        # one sync for both: every row starts real, and its padding is only at its end
        first_real, prefix = torch.stack(
            [mask[:, 0].all(), (mask[:, 1:] <= mask[:, :-1]).all()]
        ).tolist()
        if real.numel() == 0 or not first_real:
            raise ValueError(
                f"SequenceStartStates needs sequences whose first position is real "
                f"({keys.loss_mask!r} True at position 0 of every row), as SequencePadder "
                "writes them"
            )
        if not prefix:
            # the refresh runs each row over its first mask.sum(1) positions
            raise ValueError(
                f"SequenceStartStates needs {keys.loss_mask!r} to be a True prefix in every "
                "row (padding only at the end), as SequencePadder writes it"
            )
        w_real = worker.flatten().index_select(0, real)
        t_real = time.flatten().index_select(0, real)
        num_workers, num_time = (int(x) + 1 for x in torch.stack([w_real.max(), t_real.max()]))
        num_steps = num_workers * num_time
        dest = w_real * num_time + t_real
        recorded = tensordict.get(keys.rollout_steps, None)  # SequencePadder's W * T
        whole = recorded is None or bool(
            (recorded.flatten().index_select(0, real) == num_steps).all()
        )
        if (
            not whole
            or real.numel() != num_steps
            or not bool((torch.bincount(dest, minlength=num_steps) == 1).all())
        ):
            if recorded is not None:
                total = int(recorded.flatten()[int(real[0])])
                held = f"these hold {real.numel()} of the {total} real steps of their rollout"
            else:
                held = (
                    f"these hold {real.numel()} real steps, not every step of a "
                    f"[{num_workers}, {num_time}] rollout once"
                )
            raise ValueError(
                "SequenceStartStates needs all the padded sequences of one rollout, every step "
                f"once: {held}. Apply it to SequencePadder's whole output, before the sampler "
                "splits it into minibatches"
            )
        first = worker[:, 0] * num_time + time[:, 0]
        # checked here, as given ([N, Lp, ...]): unpadded, a bad shape would be reported in
        # the [W, T] terms of a view the user never made
        for key in self.state_keys:
            self._check_state(key, get_key(tensordict, key), shape)
        episode_id = tensordict.get(keys.episode_id, None)
        if episode_id is not None:
            check_shape(keys.episode_id, episode_id, shape)
            check_dtype(keys.episode_id, episode_id, torch.int64)
        if self.start_state == "refreshed" and self._by_sequences:
            is_init = get_key(tensordict, keys.is_init)  # [N, Lp, 1] bool, checked in forward
            if episode_id is not None:
                episode_id = unpad_rows(episode_id, dest, real, num_steps)
            flat_init = unpad_rows(is_init.reshape(*shape, 1), dest, real, num_steps)
            starts = self._episode_starts(
                flat_init.view(num_workers, num_time),
                None if episode_id is None else episode_id.view(num_workers, num_time),
            )
            starts_episode = starts.flatten().index_select(0, first)
            at_first = self._refresh_by_rounds(tensordict, mask, first, num_time, starts_episode)
        else:
            flat_view = TensorDict(
                {
                    key: unpad_rows(get_key(tensordict, key), dest, real, num_steps)
                    for key in self._needed(tensordict)
                },
                batch_size=[num_steps],
                device=tensordict.device,
            )
            states = self._states(flat_view.view(num_workers, num_time), first)
            at_first = {key: value.index_select(0, first) for key, value in states.items()}
        out = shallow_copy(tensordict)  # leaves the padder's pending leaves pending
        for key, value in at_first.items():
            # detached: the states written never require grad, whatever the input's did
            new = get_key(tensordict, key).detach().clone()
            new[:, 0] = value
            out.set(key, new)
        return out

    def _refresh_by_rounds(
        self,
        tensordict: TensorDictBase,
        mask: torch.Tensor,
        first: torch.Tensor,
        num_time: int,
        starts_episode: torch.Tensor,
    ) -> dict[NestedKey, torch.Tensor]:
        """Refreshed start states ``[N, *S]`` of padded sequences, one round at a time.

        Round ``k`` holds the ``k``-th sequence of every episode fragment (in time order):
        all of them run together, each over its real steps only, from its start state: the
        stored one for a row's first sequence, zero where a sequence starts an episode
        (``starts_episode``, ``[N]`` bool), else the state after the previous sequence of
        its row (from the round before). Rounds: the most sequences a fragment holds, at most
        ``ceil(T / L)``; the last round's sequences are not run (nothing reads their final
        states), so where every fragment is one sequence (``T <= L``) nothing runs at all.
        """
        n = mask.shape[0]
        lengths = mask.sum(1)
        order = torch.argsort(first)
        worker_sorted = (first // num_time).index_select(0, order)
        position = torch.arange(n, device=first.device)
        # a sequence's round is its place in its episode fragment: a fragment's first sequence
        # starts from a known state (stored, or zero at an episode start), so all of them run
        # in round 0, and rounds number at most ceil(T / L)
        new_fragment = starts_episode.index_select(0, order)
        new_fragment[1:] |= worker_sorted[1:] != worker_sorted[:-1]
        new_fragment[0] = True
        rank = position - torch.where(new_fragment, position, 0).cummax(0).values
        previous = torch.empty_like(order)
        previous[order] = torch.where(rank > 0, order[(position - 1).clamp(min=0)], -1)
        rounds = order.index_select(0, torch.argsort(rank, stable=True))
        groups = rounds.split(torch.bincount(rank).tolist())
        inputs = tensordict.select(*self._input_keys())
        start: dict[NestedKey, torch.Tensor] = {}
        final: dict[NestedKey, torch.Tensor] = {}
        with torch.no_grad():
            for key in self.state_keys:
                stored = get_key(tensordict, key)[:, 0]  # checked by _padded
                start[key] = torch.where(_expand(starts_episode, stored), 0.0, stored).detach()
                final[key] = torch.zeros_like(start[key])
            for k, index in enumerate(groups):
                if k:
                    fresh = _expand(
                        starts_episode.index_select(0, index), start[self.state_keys[0]]
                    )
                    before = previous.index_select(0, index)
                    for key in self.state_keys:
                        after = final[key].index_select(0, before)
                        start[key].index_copy_(0, index, torch.where(fresh, 0.0, after))
                if k == len(groups) - 1:
                    break  # no round reads the last round's final states: not run
                batch = inputs[index]
                own_lengths = lengths.index_select(0, index)
                for module, own in self._plan:
                    own_start = {key: start[key].index_select(0, index) for key in own}
                    out = module.final_states(batch, own_start, own_lengths)
                    for key in own:
                        final[key].index_copy_(0, index, out[key])
        return start

    def _needed(self, tensordict: TensorDictBase) -> list[NestedKey]:
        keys = [*self._input_keys(), *self.state_keys]
        for key in keys:
            get_key(tensordict, key, hint=f"(SequenceStartStates reads {key!r})")
        if self.burn_in and self.start_state != "refreshed":
            key = self.keys.episode_id
            get_key(
                tensordict,
                key,
                hint=f"(burn_in={self.burn_in} reads {key!r} to stay within each episode; "
                "EpisodeSplitter writes it)",
            )
            keys.append(key)
        if (
            self.keys.episode_id not in keys
            and tensordict.get(self.keys.episode_id, None) is not None
        ):
            keys.append(self.keys.episode_id)  # where episodes start, with is_init
        return keys

    @staticmethod
    def _episode_starts(is_init: torch.Tensor, episode_id: torch.Tensor | None) -> torch.Tensor:
        """``[W, T]`` bool: where an episode starts, by ``is_init`` and by a new ``episode_id``.

        A rollout whose ``is_init`` misses a reset still starts each episode from zero.
        """
        if episode_id is None:
            return is_init
        starts = is_init.clone()
        starts[:, 1:] |= episode_id[:, 1:] != episode_id[:, :-1]
        return starts

    def _check_state(self, key: NestedKey, value: torch.Tensor, batch: tuple[int, ...]) -> None:
        """A state key's ``[*B, *S]``: the module's float dtype, and ``S`` where it is known."""
        expected = self._state_shapes.get(key)
        dtype = self._state_dtypes.get(key)
        shape = tuple(value.shape)
        if (
            not value.is_floating_point()
            or (dtype is not None and value.dtype != dtype)
            or shape[: len(batch)] != batch
            or len(shape) < len(batch) + 1
            or (expected is not None and shape[len(batch) :] != expected)
        ):
            want = list(batch) + (list(expected) if expected is not None else ["*S"])
            kind = "float" if dtype is None else str(dtype)  # the module's parameters' dtype
            raise ValueError(
                f"{key!r} must be a {kind} state of shape {want}, got {value.dtype} {list(shape)}"
            )

    # ---- the states ---------------------------------------------------------------------------
    def _states(
        self, rollout: TensorDictBase, starts: torch.Tensor | None
    ) -> dict[NestedKey, torch.Tensor]:
        """New states ``[W * T, *S]`` per state key, from the ``[W, T]`` rollout.

        ``starts``: ``[S]`` flat indices ``w * T + t`` of the sequences' first steps, where
        the states change; ignored with ``"refreshed"``, whose states are new at every step.
        """
        keys = self.keys
        num_workers, num_time = rollout.batch_size
        # [W, T, 1] bool: forward checked it (here the rollout itself, or the padded input's)
        is_init = get_key(rollout, keys.is_init).reshape(num_workers, num_time)
        episode_id = rollout.get(keys.episode_id, None)
        if episode_id is not None:
            check_shape(keys.episode_id, episode_id, (num_workers, num_time))
            check_dtype(keys.episode_id, episode_id, torch.int64)
            is_init = self._episode_starts(is_init, episode_id)
            rollout = rollout.copy()
            rollout.set(keys.is_init, is_init.unsqueeze(-1))
        stored: dict[NestedKey, torch.Tensor] = {}
        for key in self.state_keys:
            value = get_key(rollout, key)
            self._check_state(key, value, (num_workers, num_time))
            zero = is_init.view(num_workers, num_time, *([1] * (value.ndim - 2)))
            stored[key] = torch.where(zero, 0.0, value).detach()
        if num_workers * num_time == 0:  # no step, no state to compute (W = 0 or T = 0)
            return {key: v.reshape(-1, *v.shape[2:]) for key, v in stored.items()}
        with torch.no_grad(), _inference_mode(module for module, _ in self._plan):
            if self.start_state == "refreshed":
                first = {key: value[:, 0] for key, value in stored.items()}
                base, _ = self._scan(rollout, first, None)
            elif self.start_state == "zero":
                base = {key: torch.zeros_like(value) for key, value in stored.items()}
            else:
                base = stored
            flat_base = {key: v.reshape(-1, *v.shape[2:]) for key, v in base.items()}
            if starts is None or self.start_state == "refreshed":
                return flat_base  # burn-in after a refresh changes nothing
            if self.burn_in:
                at_starts = self._burn_in(rollout, flat_base, starts)
            else:
                at_starts = {key: v.index_select(0, starts) for key, v in flat_base.items()}
        out = {key: v.reshape(-1, *v.shape[2:]).clone() for key, v in stored.items()}
        for key, value in at_starts.items():
            out[key].index_copy_(0, starts, value)
        return out

    def _burn_in(
        self,
        rollout: TensorDictBase,
        flat_base: dict[NestedKey, torch.Tensor],
        starts: torch.Tensor,
    ) -> dict[NestedKey, torch.Tensor]:
        """The states at ``starts`` after each sequence's burn-in, ``[S, *S]`` per key."""
        num_time = rollout.batch_size[1]
        episode_id = get_key(rollout, self.keys.episode_id)  # _needed refused it missing
        check_dtype(self.keys.episode_id, episode_id, torch.int64)  # named as the caller keys it
        first = episode_first_steps(episode_id).flatten().index_select(0, starts)
        worker, start_time = starts // num_time, starts % num_time
        lengths = burn_in_lengths(start_time, first, self.burn_in)
        # no wider than the longest burn-in (at most T - 1 steps), whatever K is
        width = min(self.burn_in, int(lengths.max())) if lengths.numel() else 0
        if width == 0:  # every sequence starts its episode fragment: nothing to burn in
            return {key: v.index_select(0, starts) for key, v in flat_base.items()}
        columns, active = burn_in_window(start_time, lengths, width)
        rows = worker.unsqueeze(1) * num_time
        window = rollout.select(*self._input_keys()).reshape(-1)[rows + columns]
        begin = starts - lengths
        start = {key: v.index_select(0, begin) for key, v in flat_base.items()}
        _, final = self._scan(window, start, active)
        return final

    def _scan(
        self,
        tensordict: TensorDictBase,
        start: dict[NestedKey, torch.Tensor],
        active: torch.Tensor | None,
    ) -> tuple[dict[NestedKey, torch.Tensor], dict[NestedKey, torch.Tensor]]:
        entering: dict[NestedKey, torch.Tensor] = {}
        final: dict[NestedKey, torch.Tensor] = {}
        for module, own in self._plan:
            own_start = {key: start[key] for key in own}
            fast = getattr(module, "scan_states", None)
            try:
                if fast is not None:
                    states, last = fast(tensordict, own_start, active)
                else:
                    states, last = scan_step_by_step(
                        module, tensordict, own_start, active, is_init_key=self.keys.is_init
                    )
            except torch.OutOfMemoryError:  # not the inputs' fault: as it came
                raise
            except RuntimeError as err:  # torch's own error names no key: name the inputs
                raise ValueError(
                    f"SequenceStartStates: {type(module).__name__} failed on its inputs "
                    f"{_shapes_of(tensordict, module.in_keys)}: {err}"
                ) from err
            for key in own:
                if key not in entering:
                    entering[key] = states[key]
                    final[key] = last[key]
        return entering, final


def _shapes_of(tensordict: TensorDictBase, keys: Iterable[NestedKey]) -> str:
    """``key [shape] dtype`` of each of ``keys`` that ``tensordict`` holds, for messages."""
    parts = []
    for key in keys:
        value = tensordict.get(key, None)
        if isinstance(value, torch.Tensor):
            parts.append(f"{key!r} {list(value.shape)} {value.dtype}")
    return ", ".join(parts)


def state_keys_of(module: Any) -> tuple[NestedKey, ...]:
    """The recurrent state keys of a TorchRL module: those it writes under ``"next"`` and reads.

    Args:
        module: a TensorDict module with ``in_keys`` and ``out_keys``.

    Raises:
        ValueError: the module has none (it is not recurrent).
    """
    own = getattr(module, "state_keys", None)
    if own is not None:
        keys = tuple(own)
    else:
        in_keys = [as_path(key) for key in getattr(module, "in_keys", [])]
        keys = tuple(
            key[1] if len(key) == 2 else key[1:]
            for key in (as_path(k) for k in getattr(module, "out_keys", []))
            if len(key) > 1 and key[0] == "next" and key[1:] in in_keys
        )
    if not keys:
        raise ValueError(
            f"{type(module).__name__} has no recurrent state: it writes no ('next', key) that "
            "it also reads (an LSTMModule's recurrent_state_h, for instance)"
        )
    return keys


def _state_specs(
    module: Any, own: tuple[NestedKey, ...]
) -> dict[NestedKey, tuple[tuple[int, ...], torch.dtype]]:
    """``(layers, hidden)`` and dtype of each of ``own``'s state keys, where they can be read.

    rppo_td's modules (one core for all their keys), and TorchRL's ``LSTMModule`` and
    ``GRUModule``, alone or inside a ``ProbabilisticActor`` or ``TensorDictSequential``: each
    key takes the core that reads and writes it, so one module holding two cores of other
    sizes checks each key against its own. Keys of no known core are left out.
    """
    net = getattr(module, "net", None)
    if net is not None and hasattr(net, "state_shape"):
        param = next(iter(module.parameters()), None)
        if param is None:
            return {}
        return {key: (tuple(net.state_shape), param.dtype) for key in own}
    specs: dict[NestedKey, tuple[tuple[int, ...], torch.dtype]] = {}
    for part in module.modules():  # the module itself first
        core = getattr(part, "lstm", None) or getattr(part, "gru", None)
        if core is None or not (hasattr(core, "hidden_size") and hasattr(core, "num_layers")):
            continue
        param = next(iter(core.parameters()), None)
        try:
            keys = state_keys_of(part)
        except ValueError:  # a core whose wrapper writes no state: nothing to check
            continue
        for key in keys:
            if key in own and key not in specs and param is not None:
                specs[key] = ((int(core.num_layers), int(core.hidden_size)), param.dtype)
    return specs


def scan_step_by_step(
    module: Any,
    tensordict: TensorDictBase,
    start: dict[NestedKey, torch.Tensor],
    active: torch.Tensor | None = None,
    *,
    is_init_key: NestedKey = "is_init",
) -> tuple[dict[NestedKey, torch.Tensor], dict[NestedKey, torch.Tensor]]:
    """A module's recurrent states along rows ``[N, L]``, one step-mode call per position.

    The reference for every faster path (and the path for modules without one): at each
    position the module runs in step mode on ``[N]``, with the carried states under its
    state keys, and its ``("next", key)`` outputs are carried on. Runs without gradient,
    outside recurrent mode, under ``set_exploration_type(DETERMINISTIC)``.

    Args:
        module: a TorchRL recurrent module (see ``state_keys_of``).
        tensordict: ``[N, L]`` with the module's inputs and ``is_init`` ``[N, L, 1]`` bool.
        start: the state entering position 0 per state key, ``[N, *S]``.
        active: ``[N, L]`` bool or None (all); where False the position is skipped.
        is_init_key: the key of ``is_init``.

    Returns:
        ``(entering, final)``: per key the state entering each position ``[N, L, *S]`` (zero
        at an active ``is_init``) and after the last ``[N, *S]``.
    """
    keys = tuple(start)
    n, length = tensordict.batch_size
    is_init = tensordict.get(is_init_key).reshape(n, length)
    carry = dict(start)
    entering: dict[NestedKey, list[torch.Tensor]] = {key: [] for key in keys}
    inputs = [key for key in module.in_keys if key not in keys]
    with (
        torch.no_grad(),
        set_recurrent_mode(False),
        set_exploration_type(ExplorationType.DETERMINISTIC),
    ):
        for t in range(length):
            on = (
                torch.ones(n, dtype=torch.bool, device=is_init.device)
                if active is None
                else active[:, t]
            )
            reset = is_init[:, t] & on
            for key in keys:
                value = carry[key]
                carry[key] = torch.where(_expand(reset, value), 0.0, value)
                entering[key].append(carry[key])
            step = tensordict[:, t].select(*inputs, strict=False).copy()
            step.set(is_init_key, reset.view(n, 1))
            for key in keys:
                step.set(key, carry[key])
            out = module(step)
            for key in keys:
                after = out.get(("next", *as_path(key)))
                carry[key] = torch.where(_expand(on, after), after, carry[key])
    stacked = {key: torch.stack(values, dim=1) for key, values in entering.items()}
    return stacked, carry


@contextlib.contextmanager
def _inference_mode(modules: Iterable[torch.nn.Module]) -> Iterator[None]:
    """The modules in eval mode (dropout off, batch norm's running statistics), then as before.

    Start states are inference: a module in training mode with dropout would draw random
    numbers and give other states at each call.
    """
    saved = [(part, part.training) for module in modules for part in module.modules()]
    try:
        for part, _ in saved:
            part.training = False
        yield
    finally:
        for part, training in saved:
            part.training = training


def _expand(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.view(*mask.shape, *([1] * (like.ndim - mask.ndim)))
