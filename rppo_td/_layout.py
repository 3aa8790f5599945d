"""SequenceLayout: the ``[N, Lp]`` index map shared by SequencePadder and the samplers.

Not a transform: it sits between ``functional`` and both ``transforms`` (the padder) and
``sampling`` (the sampler's lazy path), which import it from here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase

from rppo_td._buffers import OutputPool
from rppo_td._keys import RolloutKeys
from rppo_td._lazy import (
    PaddedGather,
    Pending,
    group_dims,
    lazy_enabled,
    lazy_tree,
    nest_groups,
    trackable,
)
from rppo_td._validation import (
    check_device,
    check_dtype,
    check_int_at_least,
    check_not_meta,
    check_not_padded,
    check_shape,
    check_tensor_leaf,
    check_tensors,
    check_values,
    get_key,
    rollout_shape,
    tensor_leaves,
)
from rppo_td.functional import layout_from_starts, pad_rows, runs_pay

__all__ = ["ScalarStack", "SequenceLayout", "gather_sequences", "put_leaf", "step_bytes"]

_OWN_FIELDS = ("worker_index", "time_index", "rollout_steps")


@dataclass(frozen=True)
class SequenceLayout:
    """Where each padded position ``[N, Lp]`` reads from in a ``[W, T]`` rollout.

    Attributes:
        flat_index: ``[N, Lp]`` int64, ``w * T + t`` of each position (0 on padding).
        loss_mask: ``[N, Lp]`` bool, True on real steps.
        time_steps: ``T``.
        num_workers: ``W``.

    Example:
        >>> from rppo_td import RolloutKeys
        >>> td = TensorDict({"sequence_id": torch.tensor([[0, 0, 1]]),
        ...                  "sequence_offset": torch.tensor([[0, 1, 0]])}, batch_size=[1, 3])
        >>> layout = SequenceLayout.from_rollout(td, RolloutKeys(), "example")
        >>> layout.flat_index, layout.lengths()
        (tensor([[0, 1],
                [2, 0]]), tensor([2, 1]))
    """

    flat_index: torch.Tensor
    loss_mask: torch.Tensor
    time_steps: int
    num_workers: int

    def __post_init__(self) -> None:
        """Checks a layout built by hand (``from_rollout``'s are valid by construction).

        Refused with a ``ValueError`` naming the attribute and what it holds: ``time_steps``
        or ``num_workers`` not an int >= 1; ``flat_index`` not ``[N, Lp]`` int64 with
        ``N, Lp >= 1``; ``loss_mask`` not bool of that shape and device; and, read with one
        device synchronisation, a sequence that does not start at its first position, has a
        real step after padding, leaves ``[0, W * T)``, does not run ``t, t + 1, ...`` within
        one worker's row, or shares a step with another sequence, or a padding position whose
        ``flat_index`` is not 0. The gathers rely on each of these (a sequence is copied as
        one run of consecutive steps), so a layout that breaks one would gather wrong data.
        """
        check_layout(self.flat_index, self.loss_mask, self.time_steps, self.num_workers)

    @classmethod
    def from_rollout(
        cls, td: TensorDictBase, keys: RolloutKeys, who: str, *, pad_to: int | None = None
    ) -> SequenceLayout:
        """Reads ``sequence_id`` and ``sequence_offset`` of a chunked ``[W, T]`` rollout.

        ``Lp`` is the longest sequence, or ``pad_to`` when given: every sequence is then
        padded to ``pad_to`` positions, and a longer sequence is a ``ValueError`` naming
        ``pad_to`` and the longest sequence.

        A sequence starts at each worker row's first step and wherever ``sequence_id``
        changes; the sequences are numbered from there (rows reordered or subset after
        chunking keep their sequences).

        Refused with a ``ValueError`` naming the key (``who`` says whose error it is): padded
        sequences (``loss_mask`` present), a rollout that already holds a key the gather writes
        (``worker_index``, ``time_index``, ``rollout_steps``: it would be overwritten, and
        dropped by ``SequencePadder.inv``), an empty rollout (no sequence), meta tensors, ids
        and offsets on two devices, and offsets that do not run 0, 1, ... from each sequence's
        start (a rollout sliced in time after chunking: the message names the first such step).
        """
        shape = rollout_shape(td, who)
        _check_unwritten(td, keys, who)
        if 0 in shape:
            raise ValueError(
                f"{who} got an empty rollout (batch size {list(shape)}): it holds no sequence"
            )
        hint = f"Run EpisodeSplitter and SequenceChunker before {who}."
        sequence_id = get_key(td, keys.sequence_id, hint=hint)
        offset = get_key(td, keys.sequence_offset, hint=hint)
        for key, value in ((keys.sequence_id, sequence_id), (keys.sequence_offset, offset)):
            check_shape(key, value, shape)
            check_dtype(key, value, torch.int64)
        # renumber row-major: rows reordered or subset after chunking (e.g. sampled from a
        # ReplayBuffer) keep their sequences but no longer count 0, 1, ... in row-major order
        start = torch.ones(shape, dtype=torch.bool, device=sequence_id.device)
        torch.ne(sequence_id[:, 1:], sequence_id[:, :-1], out=start[:, 1:])
        flat_index, loss_mask = layout_from_starts(start, offset)
        if pad_to is not None:
            flat_index, loss_mask = _pad_columns(flat_index, loss_mask, pad_to, who)
        return cls._unchecked(flat_index, loss_mask, shape[1], shape[0])

    @classmethod
    def _unchecked(
        cls, flat_index: torch.Tensor, loss_mask: torch.Tensor, time_steps: int, num_workers: int
    ) -> SequenceLayout:
        """A layout built from valid ids, without ``__post_init__``'s checks (and their sync)."""
        layout = object.__new__(cls)
        for name, value in zip(
            ("flat_index", "loss_mask", "time_steps", "num_workers"),
            (flat_index, loss_mask, time_steps, num_workers),
            strict=True,
        ):
            object.__setattr__(layout, name, value)
        return layout

    @property
    def num_sequences(self) -> int:
        """``N``."""
        return self.flat_index.shape[0]

    def lengths(self) -> torch.Tensor:
        """``[N]`` int64, real steps per sequence."""
        return self.loss_mask.sum(-1)

    def empty_buffer(
        self, td: TensorDictBase, rows: int, pool: OutputPool | None = None
    ) -> dict[NestedKey, torch.Tensor]:
        """Uninitialised ``[rows, Lp, *F]`` tensors for the tensor leaves of ``td``.

        ``gather(..., out=buffer)`` writes minibatches of up to ``rows`` sequences into them.
        Leaves that require grad get none: ``out=`` operations are not recorded by autograd,
        so ``gather`` writes them into fresh memory, each minibatch in its own graph.
        With ``pool`` the large ones are taken from its memory (``OutputPool``), so that the
        buffer of one epoch is the next epoch's too once nothing holds it.
        """
        length = self.flat_index.shape[1]
        buffer = {}
        for key, value in td.items(include_nested=True, leaves_only=True):
            if value.requires_grad:
                continue
            shape = (rows, length, *value.shape[2:])
            if pool is not None:
                buffer[key] = pool.empty(key, shape, value)
            else:
                buffer[key] = value.new_empty(shape)
        return buffer

    def gather(
        self,
        td: TensorDictBase,
        keys: RolloutKeys,
        index: torch.Tensor | None = None,
        *,
        out: dict[NestedKey, torch.Tensor] | None = None,
        pool: OutputPool | None = None,
        lazy: bool = False,
    ) -> TensorDictBase:
        """Padded sequences ``[B, Lp]`` (all ``N``, or the ones in ``index`` ``[B]``).

        Every tensor leaf of ``td`` (``[W, T, *F]``) becomes ``[B, Lp, *F]`` with zero padding;
        adds ``loss_mask``, ``worker_index``, ``time_index`` and ``rollout_steps`` (``W * T``;
        all zero on padding too). With ``out`` (``empty_buffer``'s, at least ``B`` rows) the
        leaves are written into its first ``B`` rows instead of fresh memory, and the result's
        leaves are views of it. With ``pool`` the leaves go into memory the pool reuses once
        its earlier outputs are gone (``OutputPool``; the result is the same). With ``lazy``
        (all sequences, no ``out``) the rollout's leaves are gathered when first read
        (``rppo_td._lazy``; the values are the same).

        ``index`` is ``[B]`` int64 in ``[0, N)`` (checked, one device synchronisation) or
        ``[N]`` bool; ``td`` must be the ``[W, T]`` rollout the layout was built from.
        """
        if index is not None:
            _check_index(index, self.num_sequences, self.loss_mask.device)
        if tuple(td.batch_size) != (self.num_workers, self.time_steps):
            raise ValueError(
                f"SequenceLayout.gather needs the [{self.num_workers}, {self.time_steps}] "
                f"rollout it was built from, got batch size {list(td.batch_size)}"
            )
        _check_unwritten(td, keys, "SequenceLayout.gather")
        if out is not None:
            if index is None:
                rows = self.num_sequences
            else:
                rows = int(index.sum()) if index.dtype == torch.bool else index.numel()
            _check_out(out, td, rows, self.flat_index.shape[1])
        return gather_sequences(self, td, keys, index, out=out, pool=pool, lazy=lazy)


def _check_unwritten(td: TensorDictBase, keys: RolloutKeys, who: str) -> None:
    """Refuses a rollout holding a key the gather writes: padded, or one of ``_OWN_FIELDS``."""
    check_not_padded(td, keys.loss_mask, who)
    own = [getattr(keys, field) for field in _OWN_FIELDS]
    for field, key in zip(_OWN_FIELDS, own, strict=True):
        if td.get(key, None) is not None:
            padded = all(td.get(name, None) is not None for name in own)
            hint = (
                f"; it holds all of {own}, as padded "
                f"sequences do: if their mask is not {keys.loss_mask!r}, give its name, "
                "keys=RolloutKeys(loss_mask=...)"
                if padded
                else ""
            )
            raise ValueError(
                f"{who} got a rollout that already holds {key!r}, a key it writes "
                f"(RolloutKeys.{field}): exclude it first (td.exclude({key!r})) or give "
                f"{who} another name for it, keys=RolloutKeys({field}=...){hint}"
            )


def _check_out(
    out: dict[NestedKey, torch.Tensor], td: TensorDictBase, rows: int, length: int
) -> None:
    """``out`` holds, for each leaf of ``td`` it names, at least ``rows`` ``[Lp, *F]`` rows."""
    for key, value in td.items(include_nested=True, leaves_only=True):
        buffer = out.get(key)
        if buffer is None:
            continue
        need = (length, *value.shape[2:])
        if (
            buffer.ndim != len(need) + 1
            or tuple(buffer.shape[1:]) != need
            or buffer.shape[0] < rows
            or buffer.dtype != value.dtype
            or buffer.device != value.device
        ):
            raise ValueError(
                f"SequenceLayout.gather: out[{key!r}] must be at least [{rows}, "
                f"{', '.join(map(str, need))}] {value.dtype} on {value.device} (rows for the "
                f"{rows} sequences gathered; empty_buffer makes them), got "
                f"{list(buffer.shape)} {buffer.dtype} on {buffer.device}"
            )


def check_layout(
    flat_index: object, loss_mask: object, time_steps: object, num_workers: object
) -> None:
    """``SequenceLayout.__post_init__``'s checks (see there)."""
    check_int_at_least("SequenceLayout.time_steps", time_steps, 1)
    check_int_at_least("SequenceLayout.num_workers", num_workers, 1)
    check_tensors({"SequenceLayout.flat_index": flat_index, "SequenceLayout.loss_mask": loss_mask})
    assert isinstance(flat_index, torch.Tensor) and isinstance(loss_mask, torch.Tensor)
    assert isinstance(time_steps, int) and isinstance(num_workers, int)
    if flat_index.ndim != 2 or 0 in flat_index.shape:
        raise ValueError(
            "SequenceLayout.flat_index must be [N, Lp] with N, Lp >= 1, got shape "
            f"{list(flat_index.shape)}"
        )
    check_dtype("SequenceLayout.flat_index", flat_index, torch.int64)
    check_dtype("SequenceLayout.loss_mask", loss_mask, torch.bool)
    check_shape("SequenceLayout.loss_mask", loss_mask, flat_index.shape)
    check_device({"SequenceLayout.flat_index": flat_index, "SequenceLayout.loss_mask": loss_mask})
    check_not_meta({"SequenceLayout.flat_index": flat_index, "SequenceLayout.loss_mask": loss_mask})
    steps = time_steps * num_workers
    real = loss_mask
    inside = (flat_index >= 0) & (flat_index < steps)
    follows = real[:, 1:]
    step_on = (flat_index[:, 1:] == flat_index[:, :-1] + 1) & (flat_index[:, 1:] % time_steps != 0)
    uses = torch.zeros(steps, dtype=torch.int64, device=flat_index.device)
    uses.scatter_add_(0, flat_index.clamp(0, steps - 1).view(-1), real.view(-1).long())

    # each message finds its first bad position only when its condition failed
    def where(bad: Callable[[], torch.Tensor], what: str) -> Callable[[], str]:
        def message() -> str:
            row, col = (int(i) for i in bad().nonzero()[0])
            return (
                f"SequenceLayout {what} (sequence {row}, position {col}: flat_index "
                f"{int(flat_index[row, col])}, loss_mask {bool(loss_mask[row, col])})"
            )

        return message

    check_values(
        {},
        [
            (
                real[:, 0].all(),
                where(
                    lambda: ~real[:, :1],
                    "sequences must start at position 0 (loss_mask True there)",
                ),
            ),
            (
                (follows <= real[:, :-1]).all(),
                where(
                    lambda: torch.nn.functional.pad(follows & ~real[:, :-1], (1, 0)),
                    "loss_mask must be True then False along each sequence (right padding); "
                    "found a real step after padding",
                ),
            ),
            (
                (inside | ~real).all(),
                where(
                    lambda: real & ~inside,
                    f"flat_index must be in [0, W * T = {steps}) on real steps",
                ),
            ),
            (
                (flat_index == 0).logical_or(real).all(),
                where(lambda: ~real & (flat_index != 0), "flat_index must be 0 on padding"),
            ),
            (
                (step_on | ~follows).all(),
                where(
                    lambda: torch.nn.functional.pad(follows & ~step_on, (1, 0)),
                    f"sequences must run over consecutive steps t, t + 1, ... of one worker's "
                    f"row (flat_index w * T + t, T = {time_steps})",
                ),
            ),
            (
                (uses <= 1).all(),
                lambda: (
                    f"SequenceLayout.flat_index holds step {int((uses > 1).nonzero()[0])} (w * T + "
                    "t) in more than one sequence: each step belongs to at most one"
                ),
            ),
        ],
    )


def _pad_columns(
    flat_index: torch.Tensor, loss_mask: torch.Tensor, pad_to: int, who: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, Lp]`` index map and mask widened to ``[N, pad_to]`` (padding reads step 0)."""
    longest = flat_index.shape[1]  # host-side: sequence_layout read it already
    if longest > pad_to:
        raise ValueError(
            f"{who} got pad_to={pad_to}, but the longest sequence has {longest} steps: pad_to "
            "must be >= every sequence's length (set it to the sequence_length L, which bounds "
            "them all)"
        )
    extra = pad_to - longest
    if extra == 0:
        return flat_index, loss_mask
    return (
        torch.nn.functional.pad(flat_index, (0, extra)),
        torch.nn.functional.pad(loss_mask, (0, extra)),
    )


def _check_index(index: torch.Tensor, num_sequences: int, device: torch.device) -> None:
    if not isinstance(index, torch.Tensor):
        raise TypeError(f"index must be a tensor, got {type(index).__name__}")
    if index.device != device:
        raise ValueError(f"index is on {index.device}, but the layout is on {device}")
    if index.dtype == torch.bool:
        check_shape("index", index, (num_sequences,))
        return
    if index.ndim != 1 or index.dtype != torch.int64:
        raise ValueError(
            f"index must be [B] int64 or [N] bool, got {list(index.shape)} {index.dtype}"
        )
    if index.numel():
        check_values(
            {},
            [
                (
                    (index.min() >= 0) & (index.max() < num_sequences),
                    f"index must hold sequence numbers in [0, {num_sequences})",
                )
            ],
        )


@dataclass(frozen=True)
class ScalarStack:
    """A rollout's one-number-per-step leaves of one dtype, stacked as rows ``[K, W * T]``.

    Minibatches of a small rollout cost per leaf, not per byte: gathering ``K`` such leaves
    as one ``[K, W * T]`` tensor is one gather and one padding fill instead of ``K`` of each.
    Each output leaf is then a row of the gathered ``[K, B * Lp]`` tensor (contiguous).

    Attributes:
        keys: the ``K`` leaf keys, in the rollout's order.
        features: each leaf's trailing shape (``()``, ``(1,)``, ...).
        rows: ``[K, W * T]``.
    """

    keys: tuple[NestedKey, ...]
    features: tuple[tuple[int, ...], ...]
    rows: torch.Tensor

    @staticmethod
    def of(td: TensorDictBase, device: torch.device) -> list[ScalarStack]:
        """The stacks of ``td``'s ``[W, T]`` single-number leaves, two or more per dtype.

        Only plain tensors on ``device`` (the sequence ids') that do not require grad
        qualify; every other leaf is gathered alone, with its checks.
        """
        groups: dict[torch.dtype, list[tuple[NestedKey, torch.Tensor]]] = {}
        steps = td.batch_size.numel()
        for key, value in td.items(include_nested=True, leaves_only=True):
            if (
                type(value) is torch.Tensor
                and not value.requires_grad  # a stack would pass its graph to every leaf
                and value.device == device
                and value.numel() == steps
                and steps
            ):
                groups.setdefault(value.dtype, []).append((key, value))
        return [
            ScalarStack(
                tuple(k for k, _ in leaves),
                tuple(tuple(v.shape[2:]) for _, v in leaves),
                torch.stack([v.reshape(steps) for _, v in leaves]),
            )
            for leaves in groups.values()
            if len(leaves) > 1
        ]


def gather_sequences(
    layout: SequenceLayout,
    td: TensorDictBase,
    keys: RolloutKeys,
    index: torch.Tensor | None = None,
    *,
    out: dict[NestedKey, torch.Tensor] | None = None,
    pool: OutputPool | None = None,
    stacks: list[ScalarStack] | None = None,
    lazy: bool = False,
) -> TensorDictBase:
    """``SequenceLayout.gather`` without the checks of ``index`` (the samplers' own groups).

    With ``pool`` (and no ``out``) the leaves are written into memory the pool reuses once
    the earlier outputs are gone (``OutputPool``). With ``stacks`` (``ScalarStack.of``,
    made once for all minibatches of an epoch) their leaves are gathered together, in fresh
    memory even with ``out``. With ``lazy`` (and neither ``out`` nor ``stacks``) every leaf
    that ``rppo_td._lazy.trackable`` accepts is left ``Pending``, gathered when first read,
    where ``lazy_enabled()`` (else the leaves are gathered now, the same values).
    """
    if index is None:
        flat, mask = layout.flat_index, layout.loss_mask
    elif index.ndim == 1 and index.dtype == torch.int64:
        # index_select is a plain row gather, cheaper than advanced indexing
        flat = layout.flat_index.index_select(0, index)
        mask = layout.loss_mask.index_select(0, index)
    else:
        flat, mask = layout.flat_index[index], layout.loss_mask[index]
    steps = layout.num_workers * layout.time_steps
    # the padding positions and runs are computed when a leaf is gathered, not for an output
    # whose leaves are all left pending
    at = PaddedGather(flat, mask, pool or OutputPool(), steps)
    deferred = at if lazy and out is None and not stacks and lazy_enabled() else None
    # Leaves go into a nested dict and the tensordict is built once at the end: setting
    # them one by one into a tensordict with a device costs more than the gathers at small
    # shapes.
    source: dict = {}
    stacked: dict[NestedKey, torch.Tensor] = {}
    for stack in stacks or ():
        rows = stack.rows.index_select(1, at.flat_steps)
        if at.pads.numel():
            rows.index_fill_(1, at.pads, 0)
        for i, (key, feature) in enumerate(zip(stack.keys, stack.features, strict=True)):
            stacked[key] = rows[i].view(*flat.shape, *feature)
    # is_leaf_nontensor: without it items() skips non-tensor leaves silently
    leaves = tensor_leaves(td)
    for key, value in leaves:
        if key not in stacked:
            check_tensor_leaf(key, value, flat.device, ids="the sequence ids")
    gathered: dict[NestedKey, torch.Tensor | Pending] = {}
    # the keys left pending (trackable asks once per leaf: it reads the storage's flags)
    later = (
        set()
        if deferred is None
        else {key for key, value in leaves if key not in stacked and trackable(value)}
    )
    now = [value for key, value in leaves if key not in stacked and key not in later]
    # each sequence's steps are consecutive in the rollout: where a large leaf of narrow rows
    # is gathered, such leaves are copied a whole sequence at a time (pad_rows)
    runs = at.runs if any(runs_pay(value, flat.numel()) for value in now) else None
    # narrowest first (step_bytes), then into the rollout's key order
    for key, value in sorted(leaves, key=lambda leaf: step_bytes(leaf[1])):
        if key in stacked:
            gathered[key] = stacked[key]
        elif deferred is not None and key in later:
            gathered[key] = Pending(key, value, deferred)
        else:
            if out is not None and key in out:
                dest = out[key][: flat.shape[0]]
            elif pool is not None and pool.wants(value, flat.numel() * math.prod(value.shape[2:])):
                dest = pool.empty(key, (*flat.shape, *value.shape[2:]), value)
            else:
                dest = None
            gathered[key] = pad_rows(value, at.flat_steps, at.pads, flat.shape, out=dest, runs=runs)
    for key, _ in leaves:  # the rollout's key order
        put_leaf(source, key, gathered[key])
    # A sequence lies in one worker row and position 0 is always real, so the row is read
    # once per sequence ([B, 1] division, not [B, Lp]) and broadcast; the products with the
    # mask are 0 on padding, as every other key. flat >= 0: truncation is floor division.
    # The mask is cast once: a bool operand costs a cast per operation, which took most of
    # these keys' time (256 x 128 rollout, sequences of 16).
    worker = torch.div(flat[:, :1], layout.time_steps, rounding_mode="trunc")
    real = mask.to(torch.int64)
    put_leaf(source, keys.loss_mask, mask)
    put_leaf(source, keys.worker_index, torch.mul(real, worker))
    put_leaf(source, keys.time_index, torch.sub(flat, worker, alpha=layout.time_steps).mul_(real))
    # the rollout's identity, so that inv can refuse a subset of its sequences
    put_leaf(source, keys.rollout_steps, torch.mul(real, steps))
    groups = group_dims(td)  # nested groups of their own batch dims ([W, T, n_agents])
    if groups:
        nest_groups(source, flat.shape, groups, td.device, lazy=deferred is not None)
    if deferred is not None:
        return lazy_tree(source, flat.shape, td.device)
    # every leaf was built above as [B, Lp, *F] on td's device: the checks of
    # TensorDict.__init__ (half the cost of a small minibatch) have nothing to find
    return TensorDict._new_unsafe(source, batch_size=flat.shape, device=td.device)


def step_bytes(value: object) -> int:
    """Bytes per position of a leaf ``[W, T, *F]`` or ``[N, Lp, *F]`` (0 if not a tensor).

    A ``Pending`` leaf counts its rollout leaf's. The gathers take leaves in this order,
    narrowest first: the small leaves' sources are then likely still in the cache (the
    transforms before wrote some of them) when they are read, and the wide leaves, whose
    gathers move megabytes through the cache, come last (measured on the project's AMD VM:
    6% to 8% off the 32 x 512 and 256 x 128 vector rollouts' epoch).
    """
    if type(value) is Pending:
        value = value.source
    if not isinstance(value, torch.Tensor):
        return 0
    return math.prod(value.shape[2:]) * value.element_size()


def put_leaf(source: dict, key: NestedKey, value: torch.Tensor | Pending) -> None:
    """``source[key] = value`` for a nested key, creating the sub-dicts on the way."""
    path = key if isinstance(key, tuple) else (key,)
    for part in path[:-1]:
        source = source.setdefault(part, {})
    source[path[-1]] = value
