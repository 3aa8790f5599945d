"""Right-padding and unpadding of per-step tensors by gather and scatter."""

from __future__ import annotations

import math

import torch

from rppo_td._validation import (
    check_batch_dims,
    check_dtype,
    check_not_meta,
    check_tensors,
    check_values,
    integer,
)

__all__ = ["pad_sequences", "padding_positions", "unpad_sequences"]


def padding_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Flat positions of the padding in ``[N, Lp]``.

    Args:
        loss_mask: ``[N, Lp]`` bool.

    Returns:
        ``[P]`` int64, indices into ``N * Lp``.

    Example:
        >>> padding_positions(torch.tensor([[True, True], [True, False]]))
        tensor([3])
    """
    check_tensors({"loss_mask": loss_mask})
    if loss_mask.ndim != 2:
        raise ValueError(f"loss_mask must have shape [N, Lp], got {list(loss_mask.shape)}")
    check_dtype("loss_mask", loss_mask, torch.bool)
    check_not_meta({"loss_mask": loss_mask})
    return (~loss_mask).flatten().nonzero().squeeze(1)


def pad_sequences(
    x: torch.Tensor,
    flat_index: torch.Tensor,
    pad_positions: torch.Tensor,
    *,
    batch_dims: int = 2,
) -> torch.Tensor:
    """Regroups per-step values into right-padded sequences, padding with zeros.

    One ``index_select`` (a gather, which needs no zero-filled output) and a zero fill of the
    padding rows only.

    Args:
        x: ``[W, T, *F]`` any dtype (``batch_dims`` leading dims are flattened to steps).
        flat_index: ``[B, Lp]`` int64, positions in the flattened steps (``sequence_layout``).
        pad_positions: ``[P]`` int64, flat padding positions in ``B * Lp``
            (``padding_positions``).
        batch_dims: how many leading dims of ``x`` index steps.

    Returns:
        ``[B, Lp, *F]``, the dtype of ``x``; zero where padded.

    Raises:
        ValueError: ``batch_dims`` not in ``[1, x.ndim]``, an index that is not int64 of the
            stated shape, an index out of range (checked with one device synchronisation),
            meta tensors, or tensors on two devices.

    Example:
        >>> from rppo_td.functional import chunk_episodes, sequence_layout
        >>> sid, off = chunk_episodes(torch.tensor([[True, False, True]]), None)
        >>> idx, mask = sequence_layout(sid, off)
        >>> pad_sequences(torch.tensor([[1, 2, 3]]), idx, padding_positions(mask))
        tensor([[1, 2],
                [3, 0]])
    """
    check_tensors({"x": x, "flat_index": flat_index, "pad_positions": pad_positions})
    batch_dims = check_batch_dims(batch_dims, "x", x)
    if flat_index.ndim != 2:
        raise ValueError(f"flat_index must have shape [B, Lp], got {list(flat_index.shape)}")
    if pad_positions.ndim != 1:
        raise ValueError(f"pad_positions must have shape [P], got {list(pad_positions.shape)}")
    named = {"x": x, "flat_index": flat_index, "pad_positions": pad_positions}
    check_dtype("flat_index", flat_index, torch.int64)
    check_dtype("pad_positions", pad_positions, torch.int64)
    _same_device(named)
    check_not_meta(named)
    steps = math.prod(x.shape[:batch_dims])
    check_values(
        {},
        [
            _in_range("flat_index", flat_index, steps, "steps of x"),
            _in_range("pad_positions", pad_positions, flat_index.numel(), "positions of [B, Lp]"),
        ],
    )
    return pad_rows(x, flat_index.flatten(), pad_positions, flat_index.shape, batch_dims)


def _same_device(named: dict[str, torch.Tensor]) -> None:
    devices = {name: x.device for name, x in named.items()}
    if len(set(devices.values())) > 1:
        raise ValueError(f"inputs must be on one device, got {devices}")


def _in_range(name: str, index: torch.Tensor, size: int, what: str) -> tuple[torch.Tensor, str]:
    """A ``check_values`` condition: every entry of ``index`` in ``[0, size)``."""
    if index.numel() == 0:
        return torch.ones((), dtype=torch.bool, device=index.device), ""
    ok = (index.min() >= 0) & (index.max() < size)
    return ok, f"{name} must hold indices in [0, {size}) (the {size} {what})"


# dtypes whose values torch's CPU gathers and fills do not move (no index_select or
# index_fill_ kernel): moved as the same bytes under a signed integer type of their width
_MOVED_AS = {
    getattr(torch, name): moved
    for name, moved in (
        ("uint16", torch.int16),
        ("uint32", torch.int32),
        ("uint64", torch.int64),
        ("float8_e4m3fn", torch.uint8),
        ("float8_e4m3fnuz", torch.uint8),
        ("float8_e5m2", torch.uint8),
        ("float8_e5m2fnuz", torch.uint8),
        ("float8_e8m0fnu", torch.uint8),
    )
    if hasattr(torch, name)
}


def movable(x: torch.Tensor) -> torch.Tensor:
    """``x``, or a view of its bytes under a dtype that torch's gathers take (uint16 as int16)."""
    moved = _MOVED_AS.get(x.dtype)
    return x if moved is None else x.view(moved)


def pad_rows(
    x: torch.Tensor,
    flat_index: torch.Tensor,
    pad_positions: torch.Tensor,
    shape: torch.Size,
    batch_dims: int = 2,
    out: torch.Tensor | None = None,
    runs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """``pad_sequences`` with the index already flat (``[B * Lp]``) and its shape given.

    The per-leaf inner step of ``SequenceLayout.gather``, which flattens the index once for
    all leaves. ``out``, when given, is a contiguous ``[B, Lp, *F]`` tensor of ``x``'s dtype
    written in place (no allocation). ``runs`` (``sequence_runs`` of the same index, made
    once for all leaves) lets a contiguous leaf of narrow rows (at most ``RUN_ROW_BYTES`` a
    step) that does not require grad be copied a sequence at a time instead of a step at a
    time; the values are the same.
    """
    if x.dtype in _MOVED_AS:
        dest = None if out is None else movable(out)
        rows = pad_rows(movable(x), flat_index, pad_positions, shape, batch_dims, dest, runs)
        return rows.view(x.dtype)
    feature = x.shape[batch_dims:]
    count = math.prod(x.shape[:batch_dims])
    width = math.prod(feature)
    if runs is not None and _takes_runs(x, count, width):
        rows = _pad_runs(x.view(count, width), runs, shape, out)
        if pad_positions.numel():
            _zero_rows(rows.view(-1) if width == 1 else rows, pad_positions)
        return rows.view(*shape, *feature)
    # one row per step with the features flattened (1-D for a single feature): index_select
    # takes its cheapest path on 1-D and 2-D contiguous tensors. Sizes are spelled out: -1 is
    # ambiguous for zero-width features ([W, T, 0]).
    if width == 1:
        steps = x.reshape(count)
    elif width > 1:
        steps = x.reshape(count, width)
    else:
        steps = x.reshape(count, *feature)
    if out is None:
        rows = steps.index_select(0, flat_index)
    else:
        rows = torch.index_select(
            steps, 0, flat_index, out=out.view(flat_index.numel(), *steps.shape[1:])
        )
    if pad_positions.numel():
        _zero_rows(rows, pad_positions)
    return rows.view(*shape, *feature)


# Rows of up to this many bytes are gathered a sequence at a time by ``pad_rows(runs=...)``:
# measured on the project's AMD VM (one thread, 16384 steps, sequences of 8), one copy per
# sequence beat one per step by 1.2x (4-byte rows) to 5.3x (16-byte rows) and 1.3x (1 KiB
# rows), and lost 6% on 21168-byte image rows, whose per-step copies are already long.
RUN_ROW_BYTES = 4096
# ... and only worth ``sequence_runs``' few extra operations where some leaf's gather moves at
# least this many bytes (below it the per-operation overhead dominates either way)
RUN_MIN_BYTES = 2 << 20


def runs_pay(x: torch.Tensor, positions: int, batch_dims: int = 2) -> bool:
    """Whether gathering ``positions`` padded positions of ``x`` is worth ``sequence_runs``.

    ``x``: ``[W, T, *F]``. True for a tensor of rows of at most ``RUN_ROW_BYTES`` whose gather
    moves at least ``RUN_MIN_BYTES``.
    """
    if type(x) is not torch.Tensor:
        return False
    row = math.prod(x.shape[batch_dims:]) * x.element_size()
    return 0 < row <= RUN_ROW_BYTES and row * positions >= RUN_MIN_BYTES


def sequence_runs(
    flat_index: torch.Tensor, loss_mask: torch.Tensor, steps: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Each padded row read as one run of ``Lp`` consecutive steps, for ``pad_rows(runs=)``.

    The real steps of a sequence are consecutive (``flat_index[b, j] = flat_index[b, 0] + j``
    where ``loss_mask[b, j]``, as ``sequence_layout`` builds them), so row ``b`` is the ``Lp``
    steps from its first one, its padding read from the steps after it and zeroed after.
    A run that would pass the last step starts at ``steps - Lp`` instead; the real positions
    that moves are listed, to be read one step at a time.

    Args:
        flat_index: ``[B, Lp]`` int64, as ``sequence_layout`` returns it (or rows of it).
        loss_mask: ``[B, Lp]`` bool, the matching mask.
        steps: ``W * T``, the steps of the tensors to gather.

    Returns:
        ``(starts, moved_positions, moved_steps)``: ``[B]`` int64 first step of each run, and
        ``[Q]`` int64 flat positions in ``B * Lp`` of the real steps whose run was moved, with
        the steps they read; or None where no run fits (``steps < Lp``) or ``Lp < 2``.
    """
    length = flat_index.shape[1]
    if length < 2 or steps < length:
        return None
    first = flat_index[:, 0]
    last = steps - length
    starts = first.clamp(max=last)
    moved = (first > last).unsqueeze(1) & loss_mask
    positions = moved.flatten().nonzero().squeeze(1)
    return starts, positions, flat_index.flatten().index_select(0, positions)


def _takes_runs(x: torch.Tensor, count: int, width: int) -> bool:
    """Whether ``pad_rows`` gathers ``x`` (``count`` steps of ``width`` elements) by runs."""
    return (
        0 < width * x.element_size() <= RUN_ROW_BYTES
        and x.is_contiguous()
        and not x.requires_grad
        and x.layout == torch.strided
        and count > 0
    )


def _pad_runs(
    steps: torch.Tensor,
    runs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    shape: torch.Size,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """``[B * Lp, width]`` rows of contiguous ``steps`` ``[count, width]``, one copy per run."""
    starts, moved_positions, moved_steps = runs
    count, width = steps.shape
    length = shape[1]
    # overlapping windows: window s is the Lp * width elements from step s
    windows = steps.as_strided(
        (count - length + 1, length * width), (width, 1), steps.storage_offset()
    )
    dest = None if out is None else out.view(shape[0], length * width)
    rows = torch.index_select(windows, 0, starts, out=dest).view(shape[0] * length, width)
    if moved_positions.numel():
        rows.index_copy_(0, moved_positions, steps.index_select(0, moved_steps))
    return rows


def _zero_rows(rows: torch.Tensor, positions: torch.Tensor) -> None:
    """``rows[positions] = 0`` in place for contiguous ``rows`` ``[R]`` or ``[R, F]``.

    ``index_fill_`` fills one element at a time, which for rows of one- or two-byte elements
    is slow: for uint8 images (21168 bytes a row at 3x84x84) 8 to 11x slower than filling the
    same bytes seen as int32 (measured on the project's VM, cold cache, 848 rows: 34.4 ms
    native, 4.2 ms as int64, 3.2 ms as int32). Zero bytes are zero in any dtype, so such
    rows are filled through an int32 view when their byte width and offset allow it, unless
    they require grad. Four-byte and wider elements are filled as they are: a wider view
    was no faster for them (float32 rows of 1 KiB: 276 us native, 305 us as int64).
    """
    # autograd does not see a fill through a view of another dtype: a tensor that requires
    # grad is filled as it is, so that no gradient flows back from the padding
    if (
        rows.ndim == 2
        and rows.shape[1]
        and rows.element_size() < 4
        and rows.is_contiguous()
        and not rows.requires_grad
    ):
        row_bytes = rows.shape[1] * rows.element_size()
        offset_bytes = rows.storage_offset() * rows.element_size()
        if row_bytes % 4 == 0 and offset_bytes % 4 == 0:
            rows.view(torch.int32).index_fill_(0, positions, 0)
            return
    rows.index_fill_(0, positions, 0)


def unpad_sequences(
    padded: torch.Tensor,
    flat_destination: torch.Tensor,
    real_positions: torch.Tensor,
    num_steps: int,
) -> torch.Tensor:
    """Scatters the real steps of padded sequences back to flat rollout order.

    Args:
        padded: ``[N, Lp, *F]`` any dtype.
        flat_destination: ``[R]`` int64, the flat rollout position (``w * T + t``) of each real
            step, in the order of ``real_positions``.
        real_positions: ``[R]`` int64, flat positions of the real steps in ``N * Lp``.
        num_steps: ``W * T``; must equal ``R``, and ``flat_destination`` must hold every
            position in ``[0, W * T)`` once, so that every output row is written.

    Returns:
        ``[W * T, *F]``, the dtype of ``padded``.

    Raises:
        ValueError: ``num_steps`` other than ``R``, a destination missing, repeated or out of
            range, a real position out of range (the values checked with one device
            synchronisation), a wrong shape or dtype, meta tensors, tensors on two devices.

    Example:
        >>> from rppo_td.functional import chunk_episodes, sequence_layout
        >>> sid, off = chunk_episodes(torch.tensor([[True, False, True]]), None)
        >>> idx, mask = sequence_layout(sid, off)
        >>> padded = pad_sequences(torch.tensor([[1, 2, 3]]), idx, padding_positions(mask))
        >>> real = mask.flatten().nonzero().squeeze(1)
        >>> unpad_sequences(padded, idx.flatten()[real], real, 3)
        tensor([1, 2, 3])
    """
    check_tensors(
        {
            "padded": padded,
            "flat_destination": flat_destination,
            "real_positions": real_positions,
        }
    )
    if padded.ndim < 2:
        raise ValueError(f"padded must have shape [N, Lp, *F], got {list(padded.shape)}")
    for name, index in (("flat_destination", flat_destination), ("real_positions", real_positions)):
        if index.ndim != 1:
            raise ValueError(f"{name} must have shape [R], got {list(index.shape)}")
        check_dtype(name, index, torch.int64)
    num_steps = integer("num_steps", num_steps)
    if not num_steps == flat_destination.numel() == real_positions.numel():
        raise ValueError(
            f"num_steps ({num_steps}), flat_destination ({flat_destination.numel()}) and "
            f"real_positions ({real_positions.numel()}) must count the same real steps: every "
            "rollout step comes from exactly one padded position"
        )
    named = {
        "padded": padded,
        "flat_destination": flat_destination,
        "real_positions": real_positions,
    }
    _same_device(named)
    check_not_meta(named)
    if num_steps:
        hits = torch.zeros(num_steps, dtype=torch.int64, device=flat_destination.device)
        in_range = (flat_destination.min() >= 0) & (flat_destination.max() < num_steps)
        # clamped so that an out-of-range index is reported, not raised by index_add_
        hits.index_add_(0, flat_destination.clamp(0, num_steps - 1), torch.ones_like(hits))
        check_values(
            {},
            [
                (
                    in_range & (hits == 1).all(),
                    f"flat_destination must hold every position in [0, {num_steps}) exactly once",
                ),
                _in_range(
                    "real_positions",
                    real_positions,
                    padded.shape[0] * padded.shape[1],
                    "positions of [N, Lp]",
                ),
            ],
        )
    return unpad_rows(padded, flat_destination, real_positions, num_steps)


def unpad_rows(
    padded: torch.Tensor,
    flat_destination: torch.Tensor,
    real_positions: torch.Tensor,
    num_steps: int,
) -> torch.Tensor:
    """``unpad_sequences`` without the entry checks (``SequencePadder.inv`` checks once)."""
    feature = padded.shape[2:]
    rows = padded.shape[0] * padded.shape[1]
    moved = movable(padded)
    real = moved.reshape(rows, *feature).index_select(0, real_positions)
    out = real.new_empty((num_steps, *feature)).index_copy_(0, flat_destination, real)
    # view(dtype) is no view to autograd: only the dtypes moved as their bytes take it
    return out if moved is padded else out.view(padded.dtype)
