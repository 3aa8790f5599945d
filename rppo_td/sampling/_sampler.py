"""SequenceSampler: one epoch of whole-sequence minibatches."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import Literal

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase, is_leaf_nontensor

from rppo_td._buffers import OutputPool, storage_uses
from rppo_td._distributed import check_shard_args, gather_ints, resolve_shard
from rppo_td._keys import DEFAULT_KEYS, RolloutKeys
from rppo_td._layout import (
    ScalarStack,
    SequenceLayout,
    gather_sequences,
    put_leaf,
    step_bytes,
)
from rppo_td._lazy import Pending, group_dims, nest_groups, raw_leaves
from rppo_td._validation import (
    check_balance,
    check_dtype,
    check_generator,
    check_not_meta,
    check_pad_to,
    check_shape,
    check_tensordict,
    get_key,
    integer,
    none_true,
    tensor_leaves,
)
from rppo_td.functional import movable, plan_minibatches, runs_pay, sequence_runs

__all__ = ["SequenceSampler"]

Balance = Literal["steps", "sequences"]


def check_minibatch_args(
    num_minibatches: int, balance: str, generator: torch.Generator | None = None
) -> int:
    """Constructor checks shared by both samplers; ``num_minibatches`` as an ``int``."""
    num_minibatches = integer("num_minibatches", num_minibatches)
    if num_minibatches < 1:
        raise ValueError(f"num_minibatches must be >= 1, got {num_minibatches}")
    check_balance(balance)
    check_generator(generator)
    return num_minibatches


def mask_conditions(
    key: object, lengths: torch.Tensor, mask: torch.Tensor
) -> list[tuple[torch.Tensor, str]]:
    """``plan_minibatches`` conditions on stored ``[N, Lp]`` bool ``loss_mask``.

    Every row is a sequence: at least one real step, and a True prefix (padding only at the
    end), as ``SequencePadder`` writes it.
    """
    return [
        (
            none_true(lengths <= 0),
            f"{key!r} has a row without a real step (all False); every row must be a sequence "
            "of at least one step",
        ),
        (
            none_true(mask[:, 1:] > mask[:, :-1]),
            f"{key!r} must be a True prefix in every row (padding only at the end), as "
            "SequencePadder writes it",
        ),
    ]


def row_slices(td: TensorDictBase, sizes: list[int]) -> Iterator[TensorDictBase]:
    """``td[a:b]`` for consecutive stretches of ``sizes[0], sizes[1], ...`` rows (views).

    A plain ``TensorDict`` of tensors is sliced leaf by leaf, sparing the per-slice work of
    ``td[a:b]``; other tensordict types and non-tensor leaves take ``td[a:b]``.
    """
    leaves = None
    if type(td) is TensorDict:
        leaves = list(td.items(include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor))
        if any(type(value) is not torch.Tensor for _, value in leaves):
            leaves = None
    if leaves is None:
        start = 0
        for size in sizes:
            yield td[start : start + size]
            start += size
        return
    # one split per leaf (views) for each block of up to _SPLIT_BLOCK minibatches, then one
    # tensordict per minibatch: a split of all of them at once would hold a view per leaf and
    # minibatch (~1 KiB each) before the first is used, gigabytes for 1e5 minibatches
    rest = td.batch_size[1:]
    groups = group_dims(td)
    start = 0
    for first in range(0, len(sizes), _SPLIT_BLOCK):
        block = sizes[first : first + _SPLIT_BLOCK]
        rows = sum(block)
        parts = [
            (key, value.narrow(0, start, rows).split_with_sizes(block)) for key, value in leaves
        ]
        start += rows
        for i, size in enumerate(block):
            source: dict = {}
            for key, pieces in parts:
                put_leaf(source, key, pieces[i])
            batch = torch.Size((size, *rest))
            if groups:
                nest_groups(source, batch, groups, td.device)
            yield TensorDict._new_unsafe(source, batch_size=batch, device=td.device)


# minibatches split from the epoch's rows at a time (row_slices)
_SPLIT_BLOCK = 64


def leaf_stats(td: TensorDictBase) -> tuple[int, bool]:
    """Bytes of ``td``'s tensor leaves, and whether any of them requires grad.

    A padder output's leaves not gathered yet count as the bytes they will hold, and as
    requiring grad where they will (and are not gathered here).
    """
    leaves = raw_leaves(td) if type(td) is TensorDict else None
    if leaves is None:
        leaves = tensor_leaves(td)
    size, grad = 0, False
    for _, value in leaves:
        if type(value) is Pending:
            size += value.nbytes
            grad = grad or value.requires_grad
        elif isinstance(value, torch.Tensor):
            size += value.numel() * value.element_size()
            grad = grad or value.requires_grad
    return size, grad


# bytes per padded position of the keys the rollout gather adds: loss_mask (bool),
# worker_index, time_index and rollout_steps (int64)
_ADDED_BYTES = 1 + 3 * 8


def gathered_bytes(rollout_bytes: int, steps: int, positions: int) -> int:
    """Bytes of ``positions`` padded positions gathered from a rollout of ``steps`` steps.

    ``rollout_bytes``: the rollout's tensor leaves (``leaf_stats``); the keys the gather
    adds are counted too. What ``gather_epoch=None`` compares with ``epoch_gather_bytes``.
    """
    return rollout_bytes * positions // steps + _ADDED_BYTES * positions


def select_rows(td: TensorDictBase, index: torch.Tensor, pool: OutputPool) -> TensorDictBase:
    """``td[index]`` for ``[B]`` int64 ``index``, its leaves written into ``pool``'s memory.

    Leaves of a padder output not gathered yet (``rppo_td._lazy``) are gathered for these
    rows straight from the rollout, and stay pending in ``td``. Other tensordict types than
    ``TensorDict``, and non-tensor leaves, take ``td[index]``.
    """
    leaves = raw_leaves(td) if type(td) is TensorDict else None
    if leaves is None:
        return td[index]
    gathered: dict = {}
    on = {index.device: index}
    positions: dict[int, tuple] = {}
    # narrowest first (step_bytes), then into td's key order
    for key, value in sorted(leaves, key=lambda leaf: step_bytes(leaf[1])):
        if type(value) is Pending:
            gather = value.gather
            if id(gather) not in positions:
                rows = on.setdefault(gather.flat_index.device, index.to(gather.flat_index.device))
                flat = gather.flat_index.index_select(0, rows)
                mask = gather.loss_mask.index_select(0, rows)
                pads = (~mask).flatten().nonzero().squeeze(1)
                runs = None
                if any(
                    type(other) is Pending
                    and other.gather is gather
                    and runs_pay(other.source, flat.numel())
                    for _, other in leaves
                ):
                    steps = value.source.shape[0] * value.source.shape[1]
                    runs = sequence_runs(flat, mask, steps)
                positions[id(gather)] = (flat.flatten(), pads, (flat.shape[0], flat.shape[1]), runs)
            flat_steps, pads, shape, runs = positions[id(gather)]
            rows_shape = (*shape, *value.source.shape[2:])
            dest = None
            if pool.wants(value.source, math.prod(rows_shape)):
                dest = pool.empty(key, rows_shape, value.source)
            gathered[key] = value.rows(flat_steps, pads, shape, out=dest, runs=runs)
            continue
        if value.device not in on:
            on[value.device] = index.to(value.device)
        rows = on[value.device]
        moved = movable(value)  # uint16, float8, ...: gathered as the same bytes
        if pool.wants(value, math.prod(value.shape[1:]) * rows.numel()):
            dest = pool.empty(key, (rows.numel(), *value.shape[1:]), value)
            torch.index_select(moved, 0, rows, out=movable(dest))
            gathered[key] = dest
        elif moved is value:
            gathered[key] = value.index_select(0, rows)  # autograd sees it (view(dtype) not)
        else:
            gathered[key] = moved.index_select(0, rows).view(value.dtype)
    source: dict = {}
    for key, _ in leaves:
        put_leaf(source, key, gathered[key])
    batch = torch.Size((index.numel(), *td.batch_size[1:]))
    groups = group_dims(td)  # nested groups of their own batch dims ([N, Lp, n_agents])
    if groups:
        nest_groups(source, batch, groups, td.device)
    return TensorDict._new_unsafe(source, batch_size=batch, device=td.device)


class SequenceSampler:
    """Yields one epoch of minibatches made of whole sequences.

    ``for mb in sampler(td)`` yields ``num_minibatches`` tensordicts of batch ``[B_i, Lp]``;
    every sequence appears in exactly one of them, in an order drawn from ``generator``.
    With ``balance="steps"`` (default) the minibatches hold equal numbers of *real* steps, give
    or take one sequence at each cut; ``balance="sequences"`` splits by sequence count instead.

    ``td`` is either padded sequences ``[N, Lp]`` (``SequencePadder``'s output, with
    ``loss_mask``), indexed per minibatch, or a chunked ``[W, T]`` rollout (``sequence_id`` and
    ``sequence_offset`` from ``SequenceChunker``, no ``loss_mask``): then each minibatch is
    gathered straight from the rollout and no padded copy of the whole rollout is made.
    Both give the same minibatches for the same generator state. The padder's leaves that
    nobody has read yet are read the same way: gathered per minibatch straight from the
    rollout, and left as they were in ``td`` (``SequencePadder``).

    With ``reuse_memory=True`` (rollout input only, gathered minibatch by minibatch) the
    minibatches of one epoch are written into two buffers sized for the largest, taken in
    turn: no fresh memory per minibatch, whose first touch costs as much as the gather itself
    on large rollouts. A buffer is written again only when nothing made from it is alive: the
    minibatch a loop still holds while it asks for the next one lives in the other buffer,
    and a minibatch the caller keeps (in a list, in a graph not yet backwarded, sent to
    another process) makes its buffer be replaced by fresh memory, never overwritten. The
    buffers' large leaves (8 MiB and more) come from the sampler's kept memory, so the next
    epoch reuses it once nothing holds it. Leaves that require grad are the exception:
    ``out=`` writes are not recorded by autograd, so each minibatch gets them in fresh
    memory, in a graph of its own.

    **Gathered minibatch by minibatch, or the epoch at once** (``gather_epoch``). By default
    (None) an epoch whose minibatches hold at most ``epoch_gather_bytes`` (64 MiB) together,
    the keys the gather adds included, is gathered at once: one gather per leaf in the
    epoch's order, each minibatch then a slice of it (a contiguous view whose rows no other
    minibatch shares). Small epochs cost per operation, not per byte, so this is faster there
    (the sampler took 1.5x less time on a 16 x 256 rollout in ``benchmarks/pipeline.py``);
    the price is memory: the epoch's minibatches live as long as any of them does (and
    ``torch.save`` of one minibatch writes the whole epoch's storage; save a ``clone()``).
    Larger epochs, and inputs with a leaf that requires grad (slices of one gather would share
    one autograd graph, so a backward per minibatch would fail), are gathered one minibatch at
    a time, so that only the minibatch in use is held (and ``reuse_memory`` applies).
    ``True`` or ``False`` chooses one way whatever the input (with ``True`` and leaves that
    require grad, sum the minibatches' losses or pass ``retain_graph=True``). The minibatches
    are the same either way.

    **When the input is read.** The call reads the ids and lengths and plans the epoch (its
    checks raise there); the data is read as the minibatches are asked for: all of it at the
    first one when the epoch is gathered at once, minibatch by minibatch otherwise. So
    changes to the input made before the first minibatch is asked for are seen either way;
    change it during an epoch and which minibatches see the change depends on the mode (an
    epoch gathered at once has read it all at its first minibatch; one gathered minibatch by
    minibatch reads each minibatch's sequences when it is asked for). (A padder output's
    leaves not read yet are the rollout's values at padding time: a rollout leaf written in
    place since is refused by name, see ``SequencePadder``.)

    **Across ranks** (``torch.distributed``; see the sharding page of the docs). Two uses:

    - *One rollout shared by all ranks, sharded* (``rank``/``world_size`` given, or both None
      with the default process group initialised): each epoch draws one global plan of
      ``num_minibatches * world_size`` groups, balanced by real steps as above, and rank ``r``
      takes groups ``r, r + world_size, r + 2 * world_size, ...``: every sequence goes to
      exactly one rank, and every rank yields exactly ``num_minibatches`` minibatches (unequal
      counts would hang DDP's gradient all-reduce). The ranks agree only because they draw the
      same plan: **every rank must hold an identically seeded ``generator``** (for
      ``generator=None``, an identically seeded global generator), consumed identically. With
      ``rank``/``world_size`` read from the default group each epoch checks it (one
      all-gather of five numbers) and every rank refuses ranks built with different
      ``num_minibatches``, holding different rollouts or drawing different plans; given
      explicitly (a subgroup) nothing is checked. With the interleaved assignment, the
      ranks' ``k``-th minibatches together are one contiguous stretch of the shuffled order:
      the ``k``-th minibatch a single process draws from the same generator (exactly so while
      ``S / (M * world_size)`` exceeds the longest sequence, when no cut is adjusted).
    - *Each rank its own rollout* (DDP with its own envs per rank): pass ``rank=0,
      world_size=1``, so each rank shuffles and splits all of its own data. Every rank yields
      ``num_minibatches`` minibatches, so the counts agree whatever each rank's data holds;
      the generators may then differ.

    With ``rank``/``world_size`` None and no initialised process group the sampler is a single
    process (``world_size=1``): exactly the minibatches of a sampler without sharding, for the
    same generator state. The group is read at each call, so the sampler may be built before
    ``init_process_group``. **Both None with a group initialised means the shared-rollout use:**
    ranks that pass their own rollouts that way (which would each train on one
    ``world_size``-th of theirs) are refused at the first epoch.

    Refused with a ``ValueError`` naming the key or argument: more minibatches than sequences
    (``num_minibatches * world_size`` of them when sharded); only one of ``rank`` and
    ``world_size`` given, ``world_size < 1`` or ``rank`` outside ``[0, world_size)``;
    padded input whose ``loss_mask`` has a row with no real step or is not a True prefix (read
    in the sync that plans the epoch); a rollout that is empty or already holds a key the
    gather writes (``worker_index``, ``time_index``, ``rollout_steps``; see
    ``SequencePadder``); a ``generator`` that is not a ``torch.Generator`` (``TypeError``);
    with the shard read from the default group, ranks that hold different rollouts or drew
    different plans, or a group whose other ranks do not plan the epoch within
    ``plan_check_timeout_s`` (every rank that checks refuses).

    Args:
        num_minibatches: ``M >= 1``; at most the number of sequences.
        generator: a ``torch.Generator`` (CPU or the data's device), the source of the order;
            None uses torch's global one.
        balance: ``"steps"`` or ``"sequences"``.
        reuse_memory: write the minibatches of an epoch into two buffers taken in turn (see
            above); for epochs gathered minibatch by minibatch.
        gather_epoch: gather the whole epoch at once (True), minibatch by minibatch
            (False), or by size (None, the default; see above).
        pad_to: optional fixed ``Lp`` for rollout input, as ``SequencePadder(pad_to=...)``:
            minibatches are ``[B, pad_to]``, the same as sampling
            ``SequencePadder(pad_to=pad_to)``'s output. Padded input must then already be
            ``[N, pad_to]`` (else a ``ValueError`` names ``pad_to``).
        keys: key overrides.
        rank: this process's shard, in ``[0, world_size)``; with ``world_size``, or both None.
        world_size: the number of shards ``>= 1``; None with ``rank`` None: the default
            process group's size when it is initialised, else 1.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]).bool()
        >>> padded = TensorDict({"loss_mask": mask}, batch_size=[4, 4])
        >>> sampler = SequenceSampler(num_minibatches=2, generator=torch.Generator().manual_seed(0))
        >>> [(tuple(mb.batch_size), int(mb["loss_mask"].sum())) for mb in sampler(padded)]
        [((2, 4), 5), ((2, 4), 5)]
    """

    #: With ``gather_epoch=None``: the largest epoch, in bytes of its minibatches together,
    #: that is gathered at once. Below it per-operation overhead costs more than holding the
    #: whole epoch (``benchmarks/pipeline.py``).
    epoch_gather_bytes: int = 64 << 20

    #: With ``rank``/``world_size`` read from the default group: how long an epoch waits for
    #: the other ranks to compare their plans (gloo) before it refuses, saying why.
    plan_check_timeout_s: float = 300.0

    def __init__(
        self,
        num_minibatches: int,
        *,
        generator: torch.Generator | None = None,
        balance: Balance = "steps",
        reuse_memory: bool = False,
        gather_epoch: bool | None = None,
        pad_to: int | None = None,
        keys: RolloutKeys | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        num_minibatches = check_minibatch_args(num_minibatches, balance, generator)
        pad_to = check_pad_to(pad_to)
        if not isinstance(reuse_memory, bool):
            raise ValueError(f"reuse_memory must be True or False, got {reuse_memory!r}")
        if gather_epoch is not None and not isinstance(gather_epoch, bool):
            raise ValueError(f"gather_epoch must be True, False or None, got {gather_epoch!r}")
        rank, world_size = check_shard_args(rank, world_size, "SequenceSampler")
        self.rank = rank
        self.world_size = world_size
        self.pad_to = pad_to
        self.num_minibatches = num_minibatches
        self.generator = generator
        self.balance: Balance = balance
        self.reuse_memory = reuse_memory
        self.gather_epoch = gather_epoch
        self.keys = keys if keys is not None else DEFAULT_KEYS
        self._pool = OutputPool()

    def __call__(self, td: TensorDictBase) -> Iterator[TensorDictBase]:
        """Yields the minibatches of one epoch over ``td`` (see the class docstring)."""
        check_tensordict(td, "SequenceSampler")
        if td.get(self.keys.loss_mask, None) is not None:
            return self._from_padded(td)
        return self._from_rollout(td)

    def shard(self) -> tuple[int, int]:
        """``(rank, world_size)`` of the next epoch: as given, else the default group's.

        Returns:
            ``(0, 1)`` when neither was given and no process group is initialised.
        """
        return resolve_shard(self.rank, self.world_size)

    def _groups(
        self,
        lengths: torch.Tensor,
        td: TensorDictBase,
        require: list[tuple[torch.Tensor, str]] | None = None,
    ) -> list[torch.Tensor]:
        rank, world_size = self.shard()
        total = self.num_minibatches * world_size
        if total > lengths.shape[0]:
            if world_size == 1:
                raise ValueError(
                    f"num_minibatches={self.num_minibatches} exceeds the {lengths.shape[0]} "
                    "sequences available"
                )
            raise ValueError(
                f"num_minibatches={self.num_minibatches} x world_size={world_size} = {total} "
                f"minibatches exceed the {lengths.shape[0]} sequences available (rank={rank}; "
                "each rank takes num_minibatches of one shared plan)"
            )
        groups = plan_minibatches(
            lengths,
            total,
            generator=self.generator,
            balance=self.balance,
            require=require or (),
        )
        if world_size > 1 and self.rank is None:  # the shard read from the default group
            _check_shared_plan(lengths, groups, td, rank, self.plan_check_timeout_s)
        return groups[rank::world_size]

    def _from_padded(self, td: TensorDictBase) -> Iterator[TensorDictBase]:
        if td.batch_dims != 2:
            raise ValueError(
                "SequenceSampler expects padded sequences with batch dims [N, Lp], got batch "
                f"size {list(td.batch_size)}"
            )
        if self.pad_to is not None and td.batch_size[1] != self.pad_to:
            raise ValueError(
                f"SequenceSampler(pad_to={self.pad_to}) got padded sequences of length "
                f"{td.batch_size[1]} (batch size {list(td.batch_size)}): pad them with "
                f"SequencePadder(pad_to={self.pad_to}), or give the sampler the chunked rollout"
            )
        mask = get_key(td, self.keys.loss_mask)
        check_shape(self.keys.loss_mask, mask, td.batch_size)
        check_dtype(self.keys.loss_mask, mask, torch.bool)
        check_not_meta({self.keys.loss_mask: mask})
        lengths = mask.sum(-1)
        groups = self._groups(lengths, td, mask_conditions(self.keys.loss_mask, lengths, mask))
        rows = sum(index.numel() for index in groups)
        size, grad = leaf_stats(td)
        if self._at_once(len(groups), size * rows // max(td.batch_size[0], 1), grad):
            return _slices_of(lambda: select_rows(td, _concat(groups), self._pool), groups)
        return _each(lambda index: select_rows(td, index, self._pool), groups)

    def _from_rollout(self, td: TensorDictBase) -> Iterator[TensorDictBase]:
        layout = SequenceLayout.from_rollout(td, self.keys, "SequenceSampler", pad_to=self.pad_to)
        groups = self._groups(layout.lengths(), td)
        rows = sum(index.numel() for index in groups)
        positions = rows * layout.flat_index.shape[1]
        steps = layout.num_workers * layout.time_steps
        size, grad = leaf_stats(td)
        if self._at_once(len(groups), gathered_bytes(size, steps, positions), grad):
            # one gather per leaf: stacking the one-number leaves would not pay for itself
            def whole() -> TensorDictBase:
                return gather_sequences(layout, td, self.keys, _concat(groups), pool=self._pool)

            return _slices_of(whole, groups)
        return self._minibatches(layout, td, groups)

    def _minibatches(
        self, layout: SequenceLayout, td: TensorDictBase, groups: list[torch.Tensor]
    ) -> Iterator[TensorDictBase]:
        """The rollout's minibatches gathered one by one, as each is asked for."""
        # the one-number-per-step leaves of each dtype, gathered together (once per epoch)
        stacks = ScalarStack.of(td, layout.flat_index.device) if len(groups) > 1 else None
        # reuse_memory: two buffers taken in turn, so that the minibatch the caller's loop
        # still holds while it asks for the next one is never written
        buffers: list[_Buffer | None] = [None, None]
        rows = max(index.numel() for index in groups)
        for i, index in enumerate(groups):
            out = None
            if self.reuse_memory:
                buffer = buffers[i % 2]
                if buffer is None or buffer.held():  # kept by the caller: fresh memory
                    buffer = buffers[i % 2] = _Buffer(layout.empty_buffer(td, rows, self._pool))
                out = buffer.leaves
            # the groups are the plan's own: in range, so gather_sequences skips the index
            # check; it writes into out when given, else into the pool's memory
            yield gather_sequences(
                layout, td, self.keys, index, out=out, pool=self._pool, stacks=stacks
            )

    def _at_once(self, num_groups: int, epoch_bytes: int, grad: bool) -> bool:
        """Whether this epoch is gathered whole (see ``gather_epoch``)."""
        if self.gather_epoch is not None:
            return self.gather_epoch
        # slices of one gather share its graph: a backward per minibatch would fail
        return num_groups > 1 and not grad and epoch_bytes <= self.epoch_gather_bytes


class _Buffer:
    """One ``reuse_memory`` buffer: ``SequenceLayout.empty_buffer``'s leaves and their uses.

    A minibatch written into it is a view of its leaves; once the caller drops the
    minibatch, each leaf's storage is back to the uses it had when made (``held`` is False).
    """

    def __init__(self, leaves: dict[NestedKey, torch.Tensor]) -> None:
        self.leaves = leaves
        self.uses = {key: storage_uses(value) for key, value in leaves.items()}

    def held(self) -> bool:
        """Whether a tensor made from the buffer is still alive (or sent to another process)."""
        if not OutputPool.enabled:  # no use counts to read: never write it again
            return True
        return any(
            storage_uses(value) != self.uses[key] or value.is_shared()
            for key, value in self.leaves.items()
        )


def _check_shared_plan(
    lengths: torch.Tensor,
    groups: list[torch.Tensor],
    td: TensorDictBase,
    rank: int,
    timeout_s: float,
) -> None:
    """Refuses, on every rank, ranks that do not hold one rollout and draw one plan of it.

    Sharding with ``rank``/``world_size`` read from the default group assumes one rollout
    shared by all ranks, identically seeded generators: a rank that passed its own rollout
    so trained on a ``world_size``-th of it, and ranks with other seeds skipped some
    sequences and took others twice, all in silence. One all-gather of five numbers per
    epoch (the plan's minibatch count, the sequences, their real steps, a fingerprint of the
    data and one of the plan) compares them; every rank gets the same answer, so all raise together.
    """
    order = torch.cat(groups)
    weights = torch.arange(order.numel(), device=order.device) % 1021 + 1
    sizes = torch.tensor([index.numel() for index in groups], device=order.device)
    counts = torch.arange(1, sizes.numel() + 1, device=order.device)
    plan = ((order + 1) * weights).sum() + (sizes * counts).sum()
    key, fingerprint = _fingerprint(td)
    # the plan's groups (num_minibatches * world_size) first: another count is no other seed
    mine = [len(groups), lengths.numel(), int(lengths.sum()), fingerprint, int(plan)]
    every = gather_ints(mine, timeout_s)
    if every is None:
        raise ValueError(
            f"SequenceSampler on rank {rank} shards one rollout over the default process "
            "group (rank and world_size not given), but the group's other ranks did not plan "
            f"an epoch within {timeout_s:g} s: a group that holds processes that do not learn "
            "(TorchRL's distributed collectors) is not a group of learners; pass rank=0, "
            "world_size=1 to sample this process's rollout (plan_check_timeout_s sets the "
            "wait for slow ranks)"
        )
    if all(values == mine for values in every):
        return
    minibatches = sorted({values[0] // len(every) for values in every})
    sequences = sorted({values[1] for values in every})
    steps = sorted({values[2] for values in every})
    if len(minibatches) > 1:
        what = (
            f"were built with different num_minibatches ({', '.join(map(str, minibatches))} over "
            f"the {len(every)} ranks; every rank must yield as many minibatches, or DDP's "
            "gradient all-reduce hangs)"
        )
    elif len(sequences) > 1 or len(steps) > 1:
        what = (
            f"hold different rollouts (sequences {sequences[0]} to {sequences[-1]}, real "
            f"steps {steps[0]} to {steps[-1]} over the {len(every)} ranks)"
        )
    elif len({values[3] for values in every}) > 1:
        what = (
            f"hold different rollouts (the same sequences, but other values of {key}; a leaf "
            "each rank computes itself may differ in its last bits: where the rollout is "
            "shared, give rank and world_size, which skips this check)"
        )
    else:
        what = "drew different plans of the same rollout (their generators differ)"
    raise ValueError(
        f"SequenceSampler on rank {rank} shards one rollout shared by the {len(every)} ranks "
        f"of the default process group (rank and world_size not given), but the ranks {what}: "
        "to sample each rank's own rollout pass rank=0, world_size=1; to shard one rollout "
        "give every rank the same rollout and an identically seeded generator"
    )


def _fingerprint(td: TensorDictBase) -> tuple[str, int]:
    """``(key, bits)``: ``td``'s smallest floating leaf (then by key) and its bits summed.

    The sum is int64, wrapping: exact and the same in any summation order, so equal data
    gives equal numbers on every rank. ``("", 0)`` where there is no floating leaf.
    """
    # a padder output's leaves not gathered yet stay so: their rollout's values are read
    leaves = raw_leaves(td) if type(td) is TensorDict else None
    if leaves is None:
        leaves = list(td.items(include_nested=True, leaves_only=True))
    values = [
        (str(key), value.source if type(value) is Pending else value) for key, value in leaves
    ]
    floats = [
        (key, value)
        for key, value in values
        if isinstance(value, torch.Tensor) and value.is_floating_point()
    ]
    if not floats:
        return "", 0
    key, value = min(floats, key=lambda item: (item[1].numel(), item[0]))  # the cheapest
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[value.element_size()]
    return key, int(value.detach().contiguous().view(bits).sum(dtype=torch.int64))


def _slices_of(
    gather: Callable[[], TensorDictBase], groups: list[torch.Tensor]
) -> Iterator[TensorDictBase]:
    """The epoch gathered at once when its first minibatch is asked for, then sliced."""
    yield from row_slices(gather(), [index.numel() for index in groups])


def _each(
    gather: Callable[[torch.Tensor], TensorDictBase], groups: list[torch.Tensor]
) -> Iterator[TensorDictBase]:
    """Each group's minibatch, gathered as it is asked for."""
    for index in groups:
        yield gather(index)


def _concat(groups: list[torch.Tensor]) -> torch.Tensor:
    """The epoch's sequence numbers in minibatch order, ``[sum B_i]``."""
    return groups[0] if len(groups) == 1 else torch.cat(groups)
