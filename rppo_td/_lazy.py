"""Padded leaves gathered when first read: SequencePadder's output without its copy.

Not a transform: ``SequencePadder`` builds these outputs and ``SequenceSampler`` reads them
(``_layout`` sits below both).

A padded output is a plain ``TensorDict`` whose leaf dicts (``_tensordict``, one per level)
are ``LazyLeaves``: every key is there from the start, but a rollout leaf's padded
``[N, Lp, *F]`` tensor is gathered from the ``[W, T, *F]`` rollout only when something reads
it (``td[key]``, ``items()``, ``clone()``, indexing, printing, ``==``, a replay buffer's
``extend``...), once, and then kept like any other leaf. The sampler reads the pending leaves
without gathering them: each minibatch is gathered straight from the rollout, so the
README's ``padder -> sampler`` composition costs one gather per epoch, not two.

A pending leaf stands for the rollout leaf's values *at padding time*. The rollout is not
copied, so the leaf's version counter (``torch.Tensor._version``, bumped by every in-place
write to it or to a view of it) is recorded; a pending leaf whose rollout leaf was written
in place since is refused with a ``ValueError`` naming the key, never gathered from the
new values (writes through ``.data`` or a NumPy view bypass the counter and are not seen).
Leaves that cannot be tracked so (inference tensors, tensor subclasses, non-tensor data) and
outputs made in inference mode or under ``torch.compile`` are padded at once, as before.

A leaf that requires grad is left pending too, with the grad mode of padding time: read
whole, it is gathered in that mode (the graph an eager padder would have recorded); read per
minibatch by the sampler, each minibatch is gathered from the rollout leaf in its own graph
(recorded where both padding time and the read have grad enabled), so a ``backward`` per
minibatch works, as it does on the chunked rollout.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from tensordict import (
    NestedKey,
    TensorDict,
    TensorDictBase,
    is_non_tensor,
    is_tensor_collection,
    is_tensorclass,
)

from rppo_td._buffers import OutputPool
from rppo_td.functional import pad_rows, runs_pay, sequence_runs

__all__ = [
    "LazyLeaves",
    "PaddedGather",
    "Group",
    "Pending",
    "group_dims",
    "lazy_enabled",
    "nest_groups",
    "raw_leaves",
    "trackable",
]


@dataclass(frozen=True)
class PaddedGather:
    """The index map shared by every leaf of one gather (and every pending leaf of its output).

    The positions derived from it are computed when first needed, then kept: a padder output
    whose leaves are only read through the sampler (which indexes the map per minibatch)
    never needs them.

    Attributes:
        flat_index: ``[N, Lp]`` int64, ``w * T + t`` of each position (0 on padding).
        loss_mask: ``[N, Lp]`` bool.
        pool: the padder's ``OutputPool`` (materialised leaves reuse its memory).
        steps: ``W * T``, the steps of the rollout the leaves are gathered from.
    """

    flat_index: torch.Tensor
    loss_mask: torch.Tensor
    pool: OutputPool
    steps: int

    @cached_property
    def flat_steps(self) -> torch.Tensor:
        """``flat_index`` flattened, ``[N * Lp]``."""
        return self.flat_index.flatten()

    @cached_property
    def pads(self) -> torch.Tensor:
        """``[P]`` int64, the flat padding positions in ``N * Lp``."""
        return (~self.loss_mask).flatten().nonzero().squeeze(1)

    @cached_property
    def runs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``sequence_runs`` of ``flat_index`` (None where no run fits)."""
        return sequence_runs(self.flat_index, self.loss_mask, self.steps)

    def rows(self, source: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``source`` ``[W, T, *F]`` padded to ``[N, Lp, *F]`` (into ``out`` when given)."""
        runs = self.runs if runs_pay(source, self.flat_index.numel()) else None
        return pad_rows(
            source, self.flat_steps, self.pads, self.flat_index.shape, out=out, runs=runs
        )


class Pending:
    """A padded leaf not gathered yet: its rollout leaf ``[W, T, *F]`` and that leaf's version."""

    __slots__ = ("gather", "grad", "key", "source", "version")

    def __init__(self, key: NestedKey, source: torch.Tensor, gather: PaddedGather) -> None:
        self.key = key
        self.source = source
        self.version = source._version
        self.gather = gather
        # whether an eager padder would have recorded the gather's graph
        self.grad = source.requires_grad and torch.is_grad_enabled()

    @property
    def requires_grad(self) -> bool:
        """Whether the padded leaf, once gathered, requires grad (as an eager padder's would)."""
        return self.grad

    @property
    def shape(self) -> tuple[int, ...]:
        """The padded leaf's shape, ``[N, Lp, *F]``."""
        return (*self.gather.flat_index.shape, *self.source.shape[2:])

    @property
    def nbytes(self) -> int:
        """Bytes of the padded leaf once gathered."""
        return math.prod(self.shape) * self.source.element_size()

    def checked_source(self) -> torch.Tensor:
        """The rollout leaf, refused where it was written in place since it was padded."""
        now = self.source._version
        if now != self.version:
            raise ValueError(
                f"SequencePadder's output gathers {self.key!r} from the rollout when it is "
                f"first read, and the rollout's {self.key!r} was modified in place since it "
                f"was padded (version {self.version}, now {now}): its padded values would no "
                f"longer be the ones padded. Read the padded {self.key!r} (or the whole "
                "output, e.g. .clone()) before writing to the rollout, or pad after the change"
            )
        return self.source

    def rows(
        self,
        flat_steps: torch.Tensor,
        pads: torch.Tensor,
        shape: tuple[int, int],
        out=None,
        runs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The padded leaf's rows for the positions ``flat_steps`` (``[B * Lp]``).

        ``runs``: ``sequence_runs`` of the same positions (see ``pad_rows``). A graph is
        recorded where grad was enabled at padding time and is now (eager: an index of the
        padded leaf).
        """
        source = self.checked_source()
        with torch.set_grad_enabled(self.grad and torch.is_grad_enabled()):
            return pad_rows(source, flat_steps, pads, torch.Size(shape), out=out, runs=runs)

    def materialize(self) -> torch.Tensor:
        """The whole padded leaf ``[N, Lp, *F]``, in the padder's pooled memory."""
        gather, source = self.gather, self.checked_source()
        # a read inside inference mode still makes the ordinary tensor an eager padder made,
        # and a read under no_grad the graph it recorded
        with torch.inference_mode(False), torch.set_grad_enabled(self.grad):
            dest = None
            if gather.pool.wants(source, math.prod(self.shape)):
                dest = gather.pool.empty(self.key, self.shape, source)
            return gather.rows(source, out=dest)


class LazyLeaves(dict):
    """A ``TensorDict``'s leaf dict whose ``Pending`` values are gathered when first read.

    Every read of a value through the dict's methods (``[]``, ``get``, ``items``,
    ``values``, ``pop``, ``==``, ``copy.copy``, pickling, ``dict(...)``) gathers it first;
    ``dict.items(d)`` and ``raw_leaves`` see the ``Pending`` objects. Writing a key (or
    deleting it) replaces its pending value like any other.
    """

    __slots__ = ()

    def _fill(self, key: str, value: object) -> object:
        if type(value) is Pending:
            value = value.materialize()
            dict.__setitem__(self, key, value)
        return value

    def _fill_all(self) -> None:
        for key, value in list(dict.items(self)):
            if type(value) is Pending:
                self._fill(key, value)

    def __getitem__(self, key: str) -> object:
        return self._fill(key, dict.__getitem__(self, key))

    def get(self, key: str, default: object = None) -> object:
        if dict.__contains__(self, key):
            return self[key]
        return default

    def __iter__(self) -> Iterator[str]:
        # overridden, so that dict(d), {**d} and d2.update(d) read values through
        # __getitem__ (CPython copies a dict subclass's raw values otherwise)
        return dict.__iter__(self)

    def items(self):  # type: ignore[override]
        self._fill_all()
        return dict.items(self)

    def values(self):  # type: ignore[override]
        self._fill_all()
        return dict.values(self)

    def pop(self, key: str, *default: object) -> object:
        if dict.__contains__(self, key):
            value = self[key]
            dict.__delitem__(self, key)
            return value
        return dict.pop(self, key, *default)

    def popitem(self) -> tuple[str, object]:
        key, value = dict.popitem(self)
        return key, value.materialize() if type(value) is Pending else value

    def setdefault(self, key: str, default: object = None) -> object:
        if dict.__contains__(self, key):
            return self[key]
        dict.__setitem__(self, key, default)
        return default

    def copy(self) -> LazyLeaves:
        """A shallow copy that shares the pending leaves (nothing is gathered)."""
        return LazyLeaves(dict.items(self))

    def __eq__(self, other: object) -> bool:
        self._fill_all()
        if isinstance(other, LazyLeaves):
            other._fill_all()
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def __or__(self, other: object) -> dict:
        return dict(self) | other  # type: ignore[operator]

    def __ror__(self, other: object) -> dict:
        return other | dict(self)  # type: ignore[operator]

    def __repr__(self) -> str:
        self._fill_all()
        return dict.__repr__(self)

    def __reduce__(self) -> tuple:
        # pickled, copied and deep-copied as the plain dict of gathered values
        return (dict, (dict(self),))


def lazy_enabled() -> bool:
    """Whether a padder output made now may hold pending leaves (see the module)."""
    return not torch.is_inference_mode_enabled() and not torch.compiler.is_compiling()


def trackable(value: object) -> bool:
    """Whether a rollout leaf can be left pending: a plain tensor whose writes are counted.

    A CPU tensor in shared memory is not: another process (a collector's worker refilling
    its buffers) writes it without this process's version counter seeing it.
    """
    return (
        type(value) is torch.Tensor
        and not value.is_inference()
        and value.layout == torch.strided
        # the untyped storage's flag: Tensor.is_shared() builds a TypedStorage (20x slower)
        and not (value.device.type == "cpu" and value.untyped_storage().is_shared())
    )


def raw_leaves(td: TensorDictBase, prefix: tuple[str, ...] = ()):
    """``(key, value)`` of every leaf of a tree of plain ``TensorDict`` s, nothing gathered.

    ``value`` is a tensor, or a ``Pending`` leaf. Returns None where the tree holds another
    kind of tensordict or a non-tensor leaf (the caller then takes ``td``'s own methods).
    """
    out = []
    for key, value in dict.items(td._tensordict):
        path = (*prefix, key)
        kind = type(value)
        if kind is torch.Tensor or kind is Pending:
            out.append((path if len(path) > 1 else key, value))
        elif kind is TensorDict:
            inner = raw_leaves(value, path)
            if inner is None:
                return None
            out.extend(inner)
        else:
            return None
    return out


def lazy_tree(source: dict, batch_size: torch.Size, device) -> TensorDict:
    """A ``TensorDict`` of ``source`` (nested dicts of tensors and ``Pending``) with lazy dicts."""
    # a nested tensordict (a group of its own batch dims, nest_groups) is kept as it is
    level = {
        key: lazy_tree(value, batch_size, device) if type(value) is dict else value
        for key, value in source.items()
    }
    return _with_lazy_leaves(level, batch_size, device)


def _with_lazy_leaves(level: dict, batch_size: torch.Size, device) -> TensorDict:
    """A ``TensorDict`` whose leaf dict is ``LazyLeaves(level)`` (``level``: one level)."""
    td = TensorDict._new_unsafe(batch_size=batch_size, device=device)
    td._tensordict = LazyLeaves(level)
    return td


def group_dims(td: TensorDictBase, lead: int = 2) -> dict[tuple[str, ...], Group]:
    """The nested tensordicts of ``td`` whose shape or type a rebuilt tree must restore.

    An output built leaf by leaf (gathered, sliced, unpadded) has only plain ``TensorDict``
    levels of the new batch, and no level without a leaf. Listed, by path: each level with
    batch dims past ``td``'s first ``lead`` (TorchRL's multi-agent groups: ``("agents",)`` of
    batch ``[W, T, n_agents]`` in a ``[W, T]`` rollout gives ``Group([n_agents], None)``),
    each tensorclass (``Group(dims, its class)``) and each empty level. Empty for most
    rollouts. A padded output's pending leaves are not gathered to find them.
    """
    found: dict[tuple[str, ...], Group] = {}

    def walk(node: Any, prefix: tuple[str, ...]) -> bool:
        """Lists ``node``'s levels; whether it holds a leaf."""
        values = dict.items(node._tensordict) if type(node) is TensorDict else node.items()
        any_leaf = False
        for key, value in values:
            # a plain tensor first: most leaves are, and this runs per minibatch
            if (
                type(value) is torch.Tensor
                or not is_tensor_collection(value)
                or is_non_tensor(value)
            ):
                any_leaf = True
                continue
            path = (*prefix, key)
            has_leaf = walk(value, path)
            any_leaf = any_leaf or has_leaf
            wrap = type(value) if is_tensorclass(value) else None
            if value.batch_dims > lead or wrap is not None or not has_leaf:
                found[path] = Group(value.batch_size[lead:], wrap)
        return any_leaf

    walk(td, ())
    return found


@dataclass(frozen=True)
class Group:
    """A nested level to restore (``group_dims``).

    Attributes:
        dims: its batch dims past the lead ones.
        wrap: for a tensorclass, its class (else None).
    """

    dims: torch.Size
    wrap: Any = None  # a @tensorclass class


def nest_groups(
    source: dict,
    batch_size: torch.Size,
    groups: dict[tuple[str, ...], Group],
    device,
    *,
    lazy: bool = False,
) -> dict:
    """``source`` (nested dicts) with each level of ``groups`` restored.

    The level at ``path`` becomes a tensordict of batch ``[*batch_size, *groups[path].dims]``
    (``group_dims``), a level with no leaf an empty one, and a tensorclass is wrapped in its
    class again; the rest stays nested dicts, which become tensordicts of ``batch_size`` when
    the whole is built. With ``lazy`` a level keeps its ``Pending`` leaves pending. ``source``
    is changed in place and returned.
    """
    for path in sorted(groups, key=len, reverse=True):  # the deepest first
        parent: object = source
        for part in path[:-1]:
            parent = parent.setdefault(part, {}) if type(parent) is dict else None
        if type(parent) is not dict:
            continue  # not in this output
        level = parent.setdefault(path[-1], {})
        if type(level) is not dict:
            continue  # built already
        group = groups[path]
        size = torch.Size((*batch_size, *group.dims))
        if lazy:
            node = lazy_tree(level, size, device)
        else:
            node = TensorDict._new_unsafe(level, batch_size=size, device=device)
        parent[path[-1]] = node if group.wrap is None else group.wrap._from_tensordict(node)
    return source


def has_pending(td: TensorDictBase) -> bool:
    """Whether a tree of plain ``TensorDict`` s still holds a ``Pending`` leaf."""
    leaves = raw_leaves(td) if type(td) is TensorDict else None
    return leaves is not None and any(type(value) is Pending for _, value in leaves)


def shallow_copy(td: TensorDictBase) -> TensorDictBase:
    """``td.copy()`` that leaves pending leaves pending (``td.copy()`` would gather them)."""
    if not has_pending(td):
        return td.copy()
    return _copy_tree(td)


def _copy_tree(td: TensorDict) -> TensorDict:
    level = {
        key: _copy_tree(value) if type(value) is TensorDict else value
        for key, value in dict.items(td._tensordict)
    }
    return _with_lazy_leaves(level, td.batch_size, td.device)


def clear_device(td: TensorDictBase) -> TensorDictBase:
    """``td.clear_device_()`` that leaves pending leaves pending (it would gather them)."""
    if not has_pending(td):
        return td.clear_device_()
    _set_tree_device(td, None)
    return td


def lazy_on_device(td: TensorDictBase, device: torch.device) -> TensorDictBase | None:
    """``td.to(device)`` with its pending leaves left pending, where no leaf has to move.

    None where ``td`` holds no pending leaf or a leaf on another device (then ``td.to``).
    """
    leaves = raw_leaves(td) if type(td) is TensorDict else None
    if not leaves or not any(type(value) is Pending for _, value in leaves):
        return None
    for _, value in leaves:
        tensor = value.source if type(value) is Pending else value
        if tensor.device != device:
            return None
    out = _copy_tree(td)
    _set_tree_device(out, device)
    return out


def _set_tree_device(td: TensorDict, device: torch.device | None) -> None:
    td._device = device
    for value in dict.values(td._tensordict):
        if type(value) is TensorDict:
            _set_tree_device(value, device)
