"""Entry checks shared by the functional layer and the transforms.

Every check raises ``ValueError`` or ``MissingKeyError`` (a ``KeyError`` and a
``ValueError``) naming the offending key or argument, the expected and the actual shape or
dtype. None of them broadcasts.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

import torch

from rppo_td._native import all_finite, native_floats

if TYPE_CHECKING:  # annotations only: the functional layer imports torch alone
    from tensordict import NestedKey, TensorDictBase

__all__ = [
    "MissingKeyError",
    "check_balance",
    "check_device",
    "check_dtype",
    "check_finite",
    "check_floating",
    "check_generator",
    "check_key_list",
    "check_not_meta",
    "check_not_padded",
    "check_sequence_length",
    "check_shape",
    "check_tensor_leaf",
    "check_tensordict",
    "check_tensors",
    "check_time_dim",
    "check_unit_interval",
    "check_value_network",
    "check_values",
    "done_consistent",
    "get_key",
    "implies",
    "integer",
    "is_integer",
    "none_true",
    "optional_count",
    "rollout_shape",
    "tensor_leaves",
    "whole_at_least",
]


def _name(key: NestedKey | str) -> str:
    return repr(key)


class MissingKeyError(KeyError, ValueError):
    """A key the input must hold is missing: both a ``KeyError`` and a ``ValueError``.

    ``except KeyError`` (a lookup that failed) and ``except ValueError`` (bad input, what the
    docstrings promise) both catch it, and it prints its message as written (a plain
    ``KeyError`` prints the ``repr`` of its message, quotes escaped).
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def get_key(td: TensorDictBase, key: NestedKey, *, hint: str = "") -> torch.Tensor:
    """Returns ``td[key]`` or raises a ``MissingKeyError`` naming the key and what is there."""
    value = td.get(key, None)
    if value is None:
        leaves = sorted(str(k) for k in td.keys(include_nested=True, leaves_only=True))
        extra = f" {hint}" if hint else ""
        raise MissingKeyError(
            f"key {_name(key)} is missing from the tensordict (has {leaves}).{extra}"
        )
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"key {_name(key)} must hold a tensor, got {type(value).__name__}")
    return value


def check_tensordict(value: object, who: str) -> None:
    """Raises a ``TypeError`` unless ``value`` is a tensordict (or a tensorclass).

    A ``dict`` or ``None`` failed deeper with an ``AttributeError`` naming neither.
    """
    from tensordict import is_tensor_collection  # not at import: functional imports torch only

    if not is_tensor_collection(value):
        raise TypeError(
            f"{who} takes a TensorDict (batch [W, T] for a rollout, [N, Lp] for padded "
            f"sequences), got {type(value).__name__}"
            + (": TensorDict(d, batch_size=[W, T]) makes one" if isinstance(value, dict) else "")
        )


def rollout_shape(td: TensorDictBase, who: str) -> tuple[int, int]:
    """Returns ``(W, T)`` of a ``[W, T]`` rollout or raises a ``ValueError``."""
    if td.batch_dims != 2:
        if td.batch_dims == 1:
            hint = (
                "one worker's [T] steps: td.unsqueeze(0); a rollout flattened to [W * T] "
                "(steps of several workers one after another): td.reshape(W, T), never "
                "unsqueeze(0), which would join the workers' rows into one"
            )
        elif td.batch_dims > 2:
            hint = (
                "rollouts of several collectors or env groups [C, W, T]: "
                "td.reshape(-1, T) makes them [C * W, T], with time last"
            )
        else:
            hint = "a rollout holds steps of one or more workers"
        raise ValueError(
            f"{who} expects a rollout with batch dims [W, T] (worker, time), got batch size "
            f"{list(td.batch_size)}; for {hint}"
        )
    w, t = td.batch_size
    return int(w), int(t)


def check_not_transposed(
    done_key: NestedKey, done: torch.Tensor, is_init_key: NestedKey, is_init: torch.Tensor | None
) -> None:
    """Refuses a ``[T, W]`` rollout given as ``[W, T]``, where ``is_init`` shows it.

    ``done`` and ``is_init``: ``[W, T]`` bool. A collector's rollout starts an episode
    (``is_init``) on the step after each end along time. Where that fails along dim 1 but holds
    along dim 0, from a first row of starts, time runs down the rows: a stack of steps on dim
    0 (``torch.stack(steps)``), which every later stage would read across workers. One sync;
    a second only where an end is not followed by a start (a rollout without a full
    ``is_init``, which is allowed).
    """
    # a small rollout that marks only some starts (allowed) can read consistently down its
    # rows by chance: at least two ends down the rows must show it
    if is_init is None or done.ndim != 2 or done.shape[0] < 2 or done.shape[1] < 2:
        return
    if done.is_meta or is_init.is_meta:  # shapes only: no values to read
        return
    if bool(none_true(done[:, :-1] > is_init[:, 1:])):  # every end followed by a start
        return
    down_rows = none_true(done[:-1] > is_init[1:]) & is_init[0].all() & (done[:-1].sum() >= 2)
    if bool(down_rows):
        raise ValueError(
            f"the rollout of batch size {list(done.shape)} looks transposed: it must be [W, T] "
            f"(worker, time), but each {_name(done_key)} is followed by {_name(is_init_key)} "
            "down dim 0 and not along dim 1, as in a [T, W] stack of steps "
            "(torch.stack(steps) stacks on dim 0): stack on dim 1, or td.transpose(0, 1)"
        )


def check_tensors(named: dict[str, object]) -> None:
    """Raises a ``TypeError`` naming the first argument that is not a ``torch.Tensor``."""
    for name, x in named.items():
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")


def check_shape(name: NestedKey | str, x: torch.Tensor, expected: Sequence[int]) -> None:
    """Raises a ``ValueError`` unless ``x.shape == expected`` exactly (no broadcasting)."""
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{_name(name)} must have shape {list(expected)}, got {list(x.shape)}")


def is_integer(value: object) -> TypeGuard[numbers.Integral]:
    """Whether ``value`` is of an integer type: numpy's too, not a bool.

    A sweep's grid or a value read from an array is a numpy integer; floats (``2.0``),
    strings and tensors are not integers here.
    """
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def integer(name: str, value: object) -> int:
    """``value`` as a Python ``int`` (``is_integer``), or a ``ValueError`` naming ``name``."""
    if not is_integer(value):
        raise ValueError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    return int(value)


def check_batch_dims(batch_dims: object, name: str, x: torch.Tensor) -> int:
    """``batch_dims`` as an ``int``, or a ``ValueError`` unless it is one in ``[1, x.ndim]``."""
    batch_dims = integer("batch_dims", batch_dims)
    if not 1 <= batch_dims <= x.ndim:
        raise ValueError(
            f"batch_dims must be in [1, {name}.ndim = {x.ndim}] for {name} of shape "
            f"{list(x.shape)}, got {batch_dims}"
        )
    return batch_dims


def check_dtype(name: NestedKey | str, x: torch.Tensor, dtype: torch.dtype) -> None:
    """Raises a ``ValueError`` unless ``x.dtype == dtype``."""
    if x.dtype != dtype:
        raise ValueError(f"{_name(name)} must have dtype {dtype}, got {x.dtype}")


def check_floating(name: NestedKey | str, x: torch.Tensor) -> None:
    """Raises a ``ValueError`` unless ``x`` is a floating-point tensor."""
    if not x.is_floating_point():
        raise ValueError(f"{_name(name)} must be a floating-point tensor, got {x.dtype}")


def check_finite(named: dict[NestedKey, torch.Tensor]) -> None:
    """Raises a ``ValueError`` naming every tensor that holds a NaN or an infinity.

    One device synchronisation for all tensors together.
    """
    check_values(named)


def check_values(
    finite: dict[NestedKey, torch.Tensor],
    require: Iterable[tuple[torch.Tensor, str | Callable[[], str]]] = (),
) -> None:
    """The data-dependent entry checks of one call, read with one device synchronisation.

    Raises a ``ValueError`` naming every tensor of ``finite`` that holds a NaN or an infinity,
    else the message of the first ``require`` condition (a 0-dim bool tensor) that is False.
    Only a failing check reads more (to say which tensor, or where).

    Args:
        finite: floating-point tensors that must be finite, by name.
        require: ``(condition, message)`` pairs; a callable message is called only on failure
            (it may read more values to say where).
    """
    require = list(require)
    check_not_meta(finite)
    conditions = [condition for condition, _ in require]
    if any(condition.is_meta for condition in conditions):
        raise ValueError("meta tensors (shape only) hold no values to check")
    ok = None
    if conditions:
        ok = conditions[0] if len(conditions) == 1 else torch.stack(conditions).all()
    if finite:
        if native_floats(*finite.values()):
            # numba's loop reads each tensor once, without the float64 sums' copies
            flags = [all_finite(x) for x in finite.values()]
        else:
            # A NaN or an infinity anywhere makes the float64 sum non-finite, and the sums
            # read each tensor once; a failed condition makes it NaN too, so one read covers
            # all. Only then does the per-tensor check run, to name the culprits (it also
            # clears float64 inputs whose finite values overflowed the sum).
            sums = [x.sum(dtype=torch.float64) for x in finite.values()]
            total = sums[0] if len(sums) == 1 else torch.stack(sums).sum()
            if ok is not None:
                total = torch.where(ok, total, math.nan)
            if math.isfinite(total.item()):
                return
            flags = torch.stack([torch.isfinite(x).all() for x in finite.values()]).tolist()
        bad = [_name(name) for name, good in zip(finite, flags, strict=True) if not good]
        if bad:
            raise ValueError(f"{', '.join(bad)} must be finite, found NaN or inf")
    if ok is None or bool(ok):
        return
    for condition, message in require:
        if not bool(condition):
            raise ValueError(message if isinstance(message, str) else message())


def none_true(flags: torch.Tensor) -> torch.Tensor:
    """0-dim bool, True when no element of bool ``flags`` is True (also when it is empty).

    A max over the bytes: on the CPU several times faster than ``Tensor.any()`` on bools.
    """
    if flags.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=flags.device)
    return flags.view(torch.uint8).max() == 0


def implies(
    name_a: NestedKey, a: torch.Tensor, name_b: NestedKey, b: torch.Tensor
) -> tuple[torch.Tensor, Callable[[], str]]:
    """A ``check_values`` condition: bool ``a`` is True only where bool ``b`` is (same shape)."""

    def message() -> str:
        where = (a & ~b).nonzero()
        count = where.shape[0]
        return (
            f"{_name(name_a)} is True where {_name(name_b)} is False (at {count} "
            f"step{'' if count == 1 else 's'}, the first at index {where[0].tolist()}); "
            f"{_name(name_a)} must imply {_name(name_b)}"
        )

    # bool a > b is a & ~b in one pass
    return none_true(a > b), message


def done_consistent(
    done: tuple[NestedKey, torch.Tensor],
    terminated: tuple[NestedKey, torch.Tensor] | None,
    truncated: tuple[NestedKey, torch.Tensor] | None,
) -> list[tuple[torch.Tensor, Callable[[], str]]]:
    """``check_values`` conditions: ``done`` is ``terminated | truncated``.

    With both flags present ``done`` must equal their union (one pass over the flags); with
    one of them, that flag must imply ``done`` (``done`` may hold the other kind of end).
    """
    present = [flag for flag in (terminated, truncated) if flag is not None]
    if len(present) < 2:
        return [implies(*flag, *done) for flag in present]
    (done_name, done_value), (term_name, term), (trunc_name, trunc) = done, *present
    either = term | trunc

    def message() -> str:
        for name, flag in ((term_name, term), (trunc_name, trunc)):
            if bool((flag > done_value).any()):
                return implies(name, flag, done_name, done_value)[1]()
        where = (done_value > either).nonzero()
        count = where.shape[0]
        return (
            f"{_name(done_name)} is True where neither {_name(term_name)} nor "
            f"{_name(trunc_name)} is (at {count} step{'' if count == 1 else 's'}, the first at "
            f"index {where[0].tolist()}); {_name(done_name)} must be {_name(term_name)} | "
            f"{_name(trunc_name)}"
        )

    return [(none_true(done_value != either), message)]


def check_not_meta(named: dict[NestedKey, torch.Tensor]) -> None:
    """Raises a ``ValueError`` naming the first meta tensor (shapes only, no data to read)."""
    for name, x in named.items():
        if x.is_meta:
            raise ValueError(
                f"{_name(name)} is a meta tensor (shape only, no data), but its values are needed"
            )


def check_device(named: dict[NestedKey, torch.Tensor]) -> None:
    """Raises a ``ValueError`` unless every tensor is on the device of the first."""
    items = iter(named.items())
    first_name, first = next(items)
    for name, x in items:
        if x.device != first.device:
            raise ValueError(
                f"{_name(name)} is on {x.device}, but {_name(first_name)} is on {first.device}; "
                "all must be on one device"
            )


def check_tensor_leaf(key: NestedKey, value: object, device: torch.device, *, ids: str) -> None:
    """Raises a ``ValueError`` unless ``value`` is a tensor on ``device``.

    ``ids`` names what the device must match (the sequence ids, ``loss_mask``), for the
    message; regrouping a leaf needs it beside its index.
    """
    if not isinstance(value, torch.Tensor):
        raise ValueError(
            f"key {_name(key)} holds {type(value).__name__}, not a tensor; only tensor leaves "
            "can be regrouped (exclude it first)"
        )
    if value.device != device:
        raise ValueError(
            f"key {_name(key)} is on {value.device}, not on {device} like {ids}; move the "
            "data to one device first (DeviceMover)"
        )


def check_value_network(value_network: object) -> None:
    """Raises a ``TypeError`` unless ``value_network`` is callable on a tensordict, or None."""
    if value_network is not None and not callable(value_network):
        raise TypeError(
            "value_network must be a TensorDict module (callable on a tensordict) or None, "
            f"got {type(value_network).__name__}"
        )


def check_int_at_least(name: str, value: object, low: int) -> None:
    """Raises a ``ValueError`` unless ``value`` is an ``int`` (not a bool) ``>= low``.

    ``num_envs``, ``processes``, ``rollout_steps``: counts given by a caller.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def whole_at_least(name: str, value: object, low: int) -> int:
    """``value`` as a Python ``int`` ``>= low``, or a ``ValueError`` naming ``name``.

    Any integer type is taken (``is_integer``). ``check_int_at_least`` is the stricter twin for
    counts given as ``int``.
    """
    if not is_integer(value) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


def optional_count(name: str, value: object) -> int | None:
    """``value`` as a Python ``int >= 1`` (any integer type, ``is_integer``), or None as given."""
    if value is None:
        return None
    if not is_integer(value) or value < 1:
        raise ValueError(f"{name} must be an int >= 1 or None, got {value!r}")
    return int(value)


def first_line(err: BaseException, *, limit: int | None = None, sentence: bool = False) -> str:
    """The first line of ``err``'s message, or its type's name when it has none.

    For one-line errors: torch's, ffmpeg's and gloo's messages run on for lines. A first line
    that is a heading (ends with ``:``, as torch's ``load_state_dict`` error) is followed by
    its first item.

    ``sentence`` keeps that line's first sentence only (torch's dispatcher and loaders follow it
    with guesses and lists); ``limit`` cuts it to that many characters.
    """
    text = str(err).strip()
    if not text:
        return type(err).__name__
    lines = text.splitlines()
    line = lines[0]
    if line.endswith(":") and len(lines) > 1:
        # a heading ("Error(s) in loading state_dict for Net:"): its first item says what
        line = f"{line} {lines[1].strip()}"
    if sentence:
        line = line.split(". ")[0]
    return line if limit is None else line[:limit]


def check_unit_interval(name: str, value: object) -> None:
    """Raises a ``ValueError`` unless ``value`` is a real number with ``0 <= value <= 1``.

    ``gamma``, ``lmbda``, a decay. A bool, a str or a tensor is refused, and so is NaN.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(
            f"{name} must be a real number in [0, 1], got {value!r} ({type(value).__name__})"
        )
    if not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


def check_time_dim(time_dim: object, ndim: int, *, last_allowed: bool = True) -> int:
    """Returns ``time_dim`` as an index in ``[0, ndim)`` or raises a ``ValueError``.

    With ``last_allowed=False`` the last dim (GAE's trailing 1) is refused too.
    """
    time_dim = integer("time_dim", time_dim)
    high = ndim if last_allowed else ndim - 1
    dim = time_dim + ndim if time_dim < 0 else time_dim
    if not 0 <= dim < high:
        what = "dims" if last_allowed else "dims (the last, a trailing 1, is a feature dim)"
        raise ValueError(
            f"time_dim={time_dim} is out of range for {ndim} {what}: allowed are "
            f"{-ndim} to {high - 1}" + ("" if last_allowed else f" except {-1} and {ndim - 1}")
        )
    return dim


def check_not_padded(td: TensorDictBase, loss_mask: NestedKey, who: str) -> None:
    """Raises a ``ValueError`` if ``td`` holds ``loss_mask``: it is padded sequences already."""
    if td.get(loss_mask, None) is not None:
        raise ValueError(
            f"{who} got a tensordict that already holds {_name(loss_mask)}: it is padded "
            f"already ([N, Lp] sequences); {who} works on [W, T] rollouts"
        )


def check_generator(generator: object) -> None:
    """Raises a ``TypeError`` unless ``generator`` is a ``torch.Generator`` or None."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator or None, got {type(generator).__name__}"
        )


def check_key_list(name: str, keys: object) -> list[NestedKey]:
    """``list(keys)`` for a sequence of keys; a single str is refused (it would iterate chars)."""
    if isinstance(keys, str) or not isinstance(keys, Iterable):
        raise TypeError(
            f"{name} must be a sequence of keys, e.g. [{keys!r}], got the "
            f"{type(keys).__name__} {keys!r}"
        )
    return list(keys)


def check_sequence_length(value: object) -> int | None:
    """``value`` as an ``int >= 1`` (any integer type) or None, else a ``ValueError``."""
    return optional_count("sequence_length", value)


def check_pad_to(value: object) -> int | None:
    """``value`` as an ``int >= 1`` (any integer type) or None, else a ``ValueError``."""
    return optional_count("pad_to", value)


COLLECTOR_MASK: tuple[str, str] = ("collector", "mask")
"""The key TorchRL's ``split_trajectories`` (``Collector(split_trajs=True)``) writes."""


def check_not_split_trajs(td: TensorDictBase, who: str) -> None:
    """Refuses TorchRL's own padded trajectories (``Collector(split_trajs=True)``).

    Their ``[num_trajs, max_len]`` batch holds padding that would be read as real steps; the
    check is the presence of ``("collector", "mask")``, with no device synchronisation.
    """
    if td.get(COLLECTOR_MASK, None) is not None:
        raise ValueError(
            f"{who} got trajectories padded by TorchRL ({COLLECTOR_MASK!r} is present: "
            "Collector(split_trajs=True) or torchrl's split_trajectories), whose padding would "
            "count as real steps. Collect with split_trajs=False (the default) and give "
            f"{who} the [W, T] rollout: rppo_td splits episodes itself (EpisodeSplitter)"
        )


def check_balance(value: object) -> None:
    """Raises a ``ValueError`` unless ``value`` is ``"steps"`` or ``"sequences"``."""
    if value not in ("steps", "sequences"):
        raise ValueError(f"balance must be 'steps' or 'sequences', got {value!r}")


def tensor_leaves(td: TensorDictBase) -> list[tuple[NestedKey, Any]]:
    """``td``'s leaves, non-tensor data included, as ``(key, value)`` pairs.

    A ``LazyStackedTensorDict`` whose stacked tensordicts hold a leaf in different shapes
    cannot give that leaf as one tensor (tensordict raises a ``RuntimeError`` that names no
    key): refused with a ``ValueError`` naming the key and its shapes.
    """
    from tensordict import is_leaf_nontensor

    try:
        return list(td.items(include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor))
    except RuntimeError as err:
        for key in td.keys(include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor):
            try:
                td.get(key)
            except RuntimeError:
                raise ValueError(
                    f"the rollout's {_name(key)} has different shapes in the tensordicts "
                    f"lazily stacked into it{_stacked_shapes(td, key)}: a leaf must have one "
                    f"shape at every step to be padded into one tensor; give every stacked "
                    f"tensordict's {_name(key)} one shape, or leave it out "
                    f"(td.exclude({_name(key)}))"
                ) from err
        raise


def _stacked_shapes(td: TensorDictBase, key: NestedKey) -> str:
    """`` (shapes [...] along the stack)`` for the lazy stack that holds ``key``, or ``""``."""
    from tensordict import LazyStackedTensorDict

    path = key if isinstance(key, tuple) else (key,)
    for depth in range(len(path)):
        try:
            outer = td.get(path[:depth]) if depth else td
        except (KeyError, RuntimeError):
            return ""
        if isinstance(outer, LazyStackedTensorDict):
            rest = path[depth:]
            try:
                shapes = [list(part.get(rest).shape) for part in outer.tensordicts]
            except (KeyError, RuntimeError):
                continue
            return f" (shapes {shapes} along the stack)"
    return ""
