"""SequenceReplaySampler: SequenceSampler's epochs as a TorchRL replay-buffer Sampler."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import torch
from tensordict import LazyStackedTensorDict, TensorDictBase
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage, TensorStorage

from rppo_td._keys import DEFAULT_KEYS, RolloutKeys
from rppo_td.functional import plan_minibatches
from rppo_td.sampling._sampler import Balance, check_minibatch_args, mask_conditions

__all__ = ["SequenceReplaySampler"]


class SequenceReplaySampler(Sampler):
    """A ``torchrl.data.ReplayBuffer`` sampler over stored padded sequences.

    The buffer's storage holds sequences ``[Lp]`` (extend it with a padded ``[N, Lp]``
    tensordict and a 1-dim storage). Each epoch is cut into ``num_minibatches`` groups, balanced
    by real steps (``loss_mask``) or by count, as ``SequenceSampler`` does; each ``sample()``
    returns the next group, so the ``batch_size`` that ``ReplayBuffer.sample`` requires is
    ignored. After the last
    group ``ran_out`` is True and the next ``sample()`` starts a new epoch; iterating the buffer
    (``for mb in rb``, with a ``batch_size``) yields one epoch.

    The stored ``loss_mask`` must hold a True prefix of at least one real step in every row
    (checked in the sync that plans each epoch); else a ``ValueError`` names the key.

    Each ``for mb in rb`` loop is one full epoch (TorchRL sets ``ran_out = False`` to start
    it). A loop left early (``break``, e.g. on a KL early stop) leaves the rest of its epoch
    to the next loop, as TorchRL's buffer tells its sampler nothing of a new loop; set
    ``rb.sampler.ran_out = False`` to start a new epoch instead. Writing to the buffer
    (``extend``, ``add``) ends the current epoch: the next ``sample()`` plans one over the
    stored sequences as they are then. To reuse one buffer across updates (``rb.empty()``,
    then ``rb.extend`` the next rollout's sequences), pad with ``SequencePadder(pad_to=L)``:
    a ``LazyTensorStorage`` fixes ``[Lp]`` at its first ``extend``, ``Lp`` otherwise varies
    with the data, and the storage raises its own ``RuntimeError`` (before this sampler runs)
    when it changes. Emptying the buffer also drops the rest of the current epoch.
    ``ReplayBuffer(prefetch=k)`` is supported: the sampler tells the buffer how many groups
    of the epoch are left, so the groups sampled ahead never run into the next epoch. With
    prefetch, end each epoch as TorchRL's iterator does (``for mb in rb``, which also drains
    the queue of groups drawn ahead), not on ``ran_out`` in a ``sample()`` loop: ``ran_out``
    turns True when the last group is *drawn*, which with prefetch is before it is served.
    Nor do a write to the buffer or ``ran_out = False`` drop the groups already drawn ahead
    (the sampler cannot reach the buffer's queue): with prefetch, finish the epoch's loop
    before either, or the next epoch starts with the old plan's groups.

    Args:
        num_minibatches: ``M >= 1`` groups per epoch.
        generator: source of the order; None uses the buffer's generator, else torch's global.
        balance: ``"steps"`` or ``"sequences"``.
        keys: key overrides (``loss_mask``).

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl.data import LazyTensorStorage, ReplayBuffer
        >>> mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]]).bool()
        >>> rb = ReplayBuffer(storage=LazyTensorStorage(4),
        ...                   sampler=SequenceReplaySampler(2, generator=torch.Generator()))
        >>> _ = rb.extend(TensorDict({"loss_mask": mask}, batch_size=[4, 3]))
        >>> # sample()'s batch_size is required by ReplayBuffer but the epoch plan sets the size
        >>> [int(rb.sample(1)["loss_mask"].sum()) for _ in range(2)]
        [5, 4]
    """

    def __init__(
        self,
        num_minibatches: int,
        *,
        generator: torch.Generator | None = None,
        balance: Balance = "steps",
        keys: RolloutKeys | None = None,
    ) -> None:
        num_minibatches = check_minibatch_args(num_minibatches, balance, generator)
        self.num_minibatches = num_minibatches
        self.generator = generator
        self.balance: Balance = balance
        self.keys = keys if keys is not None else DEFAULT_KEYS
        self._plan: list[torch.Tensor] = []
        self._next = 0
        # a buffer with prefetch calls sample() from its worker threads
        self._lock = threading.Lock()

    @property
    def _remaining_batches(self) -> int:
        """Groups of the current epoch not sampled yet (TorchRL's prefetch reads it).

        ``ReplayBuffer(prefetch=k)`` queues a ``sample()`` ahead only while its queue is
        shorter than this: the queued calls never draw the next epoch's groups into this one.
        """
        return len(self._plan) - self._next

    def sample(self, storage: Storage, batch_size: int | None = None) -> tuple[Any, dict]:
        """Returns the next group of sequence indices into ``storage`` and an empty info."""
        with self._lock:
            if self._next >= len(self._plan):
                self._plan = self._draw_epoch(storage)
                self._next = 0
            index = self._plan[self._next]
            count = len(storage)
            if index.numel() and int(index.max()) >= count:
                # a plan loaded with load_state_dict / loads for a larger storage
                raise ValueError(
                    f"SequenceReplaySampler's epoch plan reads stored sequence "
                    f"{int(index.max())}, but the storage holds {count}: the plan was loaded "
                    "(load_state_dict or loads) for a larger storage; load the buffer's storage "
                    "with it, or start a new epoch (sampler.ran_out = False)"
                )
            self._next += 1
            return index, {}

    def _stored_mask(self, storage: Storage, count: int) -> torch.Tensor | None:
        """The stored sequences' ``loss_mask`` ``[count, Lp]``, or None where none is stored.

        From a ``TensorStorage`` (``LazyTensorStorage``, ``LazyMemmapStorage``) the leaf alone
        is read: ``storage.get`` gathered every leaf of every stored sequence (the whole
        buffer, once per epoch) to read this one, half of an image epoch's time.
        """
        held = getattr(storage, "_storage", None)
        if isinstance(storage, TensorStorage) and isinstance(held, TensorDictBase):
            mask = held.get(self.keys.loss_mask, None)
            # its first ``count`` rows are the stored ones, as ``storage.get`` reads them
            return None if mask is None else mask[:count]
        stored = storage.get(torch.arange(count))
        if not isinstance(stored, TensorDictBase):
            raise TypeError(
                f"SequenceReplaySampler reads loss_mask from a storage of tensordicts (such as "
                f"LazyTensorStorage or LazyMemmapStorage); {type(storage).__name__} returned "
                f"{type(stored).__name__}"
            )
        if isinstance(stored, LazyStackedTensorDict):
            # a LazyStackStorage: sequences of other lengths would fail to stack, keylessly
            lengths = {
                tuple(mask.shape)
                for part in stored.tensordicts
                if (mask := part.get(self.keys.loss_mask, None)) is not None
            }
            if len(lengths) > 1:
                raise ValueError(
                    f"SequenceReplaySampler needs every stored sequence padded to one length; "
                    f"{type(storage).__name__} holds {self.keys.loss_mask!r} of shapes "
                    f"{sorted(lengths)}: pad every write to one length with "
                    "SequencePadder(pad_to=L)"
                )
        return stored.get(self.keys.loss_mask, None)

    def _draw_epoch(self, storage: Storage) -> list[torch.Tensor]:
        ndim = getattr(storage, "ndim", 1)
        if ndim != 1:
            raise ValueError(
                f"SequenceReplaySampler needs a 1-dim storage of sequences [Lp] (extended "
                f"with a padded [N, Lp] tensordict), got {type(storage).__name__} with "
                f"ndim={ndim}"
            )
        count = len(storage)
        if count == 0:
            raise RuntimeError("SequenceReplaySampler cannot sample from an empty storage")
        mask = self._stored_mask(storage, count)
        if mask is None:
            raise KeyError(
                f"SequenceReplaySampler needs {self.keys.loss_mask!r} in the stored sequences "
                "(store SequencePadder's output)"
            )
        if mask.ndim != 2 or mask.dtype != torch.bool:
            raise ValueError(
                f"{self.keys.loss_mask!r} must be [N, Lp] bool in storage, got "
                f"{list(mask.shape)} {mask.dtype}"
            )
        generator = self.generator if self.generator is not None else self._rng
        lengths = mask.sum(-1)
        groups = plan_minibatches(
            lengths,
            self.num_minibatches,
            generator=generator,
            balance=self.balance,
            require=mask_conditions(self.keys.loss_mask, lengths, mask),
        )
        return [g.cpu() for g in groups]

    def extend(self, index: torch.Tensor) -> None:
        """Called by the buffer after it writes sequences: drops the current epoch's plan.

        The old plan over the new data could serve a sequence twice and another never.
        """
        with self._lock:
            self._empty()

    def add(self, index: int) -> None:
        """Called by the buffer after it writes one sequence: as ``extend``."""
        with self._lock:
            self._empty()

    @property
    def ran_out(self) -> bool:
        """True once every group of the current epoch has been returned.

        ``ReplayBuffer.__iter__`` sets it to False to start an epoch: the next ``sample()``
        then draws a new one. Setting it to True ends the current epoch.
        """
        return bool(self._plan) and self._next >= len(self._plan)

    @ran_out.setter
    def ran_out(self, value: bool) -> None:
        if value:
            self._next = len(self._plan)
        else:
            self._empty()

    def _empty(self) -> None:
        self._plan = []
        self._next = 0

    def state_dict(self) -> dict[str, Any]:
        """The position in the current epoch, and the state of the sampler's own generator.

        With the generator's state, a buffer restored mid-run draws the same later epochs as
        the run it was saved from (TorchRL's buffer saves its own generator likewise).
        """
        state: dict[str, Any] = {"plan": [g.clone() for g in self._plan], "next": self._next}
        if self.generator is not None:
            state["generator"] = self.generator.get_state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores ``state_dict()``'s output."""
        # copies: the caller's tensors stay theirs (state_dict() returns copies too)
        plan = [torch.as_tensor(g, dtype=torch.int64).clone() for g in state_dict["plan"]]
        self._set_generator_state(state_dict.get("generator"))
        self._plan, self._next = plan, int(state_dict["next"])

    def dumps(self, path: str | Path) -> None:
        """Writes the epoch position (and generator state) to ``path/sampler_metadata.json``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        meta: dict[str, Any] = {"plan": [g.tolist() for g in self._plan], "next": self._next}
        if self.generator is not None:
            meta["generator"] = self.generator.get_state().tolist()
        (path / "sampler_metadata.json").write_text(json.dumps(meta))

    def loads(self, path: str | Path) -> None:
        """Reads what ``dumps`` wrote."""
        meta = json.loads((Path(path) / "sampler_metadata.json").read_text())
        self._set_generator_state(meta.get("generator"))  # a list of bytes, from JSON
        self._plan = [torch.tensor(g, dtype=torch.int64) for g in meta["plan"]]
        self._next = int(meta["next"])

    def _set_generator_state(self, state: torch.Tensor | list[int] | None) -> None:
        if state is None:  # saved by a sampler drawing from the buffer's or torch's generator
            return
        if self.generator is None:
            raise ValueError(
                "SequenceReplaySampler: the saved state holds the state of the sampler's own "
                "generator, but this sampler has generator=None: its later epochs would be "
                "drawn from another generator; build it with generator=torch.Generator()"
            )
        self.generator.set_state(torch.as_tensor(state, dtype=torch.uint8))

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]  # a lock does not pickle; a copy gets its own
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_minibatches={self.num_minibatches}, "
            f"balance={self.balance!r})"
        )
