"""Episode and sequence indexing by whole-tensor index arithmetic.

A rollout ``[W, T]`` is read in row-major order (worker by worker, time within worker). Every
worker row starts a new episode fragment, so no id ever spans two workers. Nothing here loops
over workers, episodes or sequences.
"""

from __future__ import annotations

import torch

from rppo_td._native import chunk_flat, layout_flat, use_native
from rppo_td._validation import (
    check_dtype,
    check_not_meta,
    check_sequence_length,
    check_tensors,
    check_values,
)

__all__ = [
    "chunk_episodes",
    "episode_ids",
    "episode_starts",
    "sequence_layout",
]


def episode_starts(done: torch.Tensor, is_init: torch.Tensor | None = None) -> torch.Tensor:
    """Marks the first step of every episode fragment in a ``[W, T]`` rollout.

    A step starts a fragment when it is the first step of its worker's row, when the previous
    step was done, or when ``is_init`` says so.

    Args:
        done: ``[W, T]`` bool, ``("next", "done")`` without its trailing 1.
        is_init: optional ``[W, T]`` bool.

    Returns:
        ``[W, T]`` bool; empty for an empty rollout.

    Example:
        >>> done = torch.tensor([[False, True, False, False]])
        >>> episode_starts(done)
        tensor([[ True, False,  True, False]])
    """
    check_tensors({"done": done} if is_init is None else {"done": done, "is_init": is_init})
    if done.ndim != 2:
        raise ValueError(f"done must have shape [W, T], got {list(done.shape)}")
    check_dtype("done", done, torch.bool)
    start = torch.empty_like(done)
    start[:, :1] = True  # a slice: nothing to set when T = 0
    start[:, 1:] = done[:, :-1]
    if is_init is not None:
        if is_init.shape != done.shape:
            raise ValueError(
                f"is_init must have shape {list(done.shape)} like done, got {list(is_init.shape)}"
            )
        check_dtype("is_init", is_init, torch.bool)
        if is_init.device != done.device:
            raise ValueError(f"is_init is on {is_init.device}, but done is on {done.device}")
        start |= is_init
    return start


def check_start(start: torch.Tensor) -> None:
    """Raises a ``ValueError`` unless ``start`` is ``[W, T]`` bool with column 0 all True.

    One device synchronisation (none for an empty rollout).
    """
    check_tensors({"start": start})
    if start.ndim != 2:
        raise ValueError(f"start must have shape [W, T], got {list(start.shape)}")
    check_dtype("start", start, torch.bool)
    check_not_meta({"start": start})
    if start.numel():
        check_values(
            {},
            [
                (
                    start[:, 0].all(),
                    "start[:, 0] must be all True: every worker row starts an episode fragment "
                    "(episode_starts sets it), so no id spans two workers",
                )
            ],
        )


def episode_ids(start: torch.Tensor) -> torch.Tensor:
    """Numbers episode fragments ``0, 1, ...`` in row-major order.

    Args:
        start: ``[W, T]`` bool, True at each fragment's first step (``episode_starts``); column
            0 must be all True (checked, one device synchronisation).

    Returns:
        ``[W, T]`` int64; empty for an empty rollout.

    Example:
        >>> episode_ids(torch.tensor([[True, False, True], [True, True, False]]))
        tensor([[0, 0, 1],
                [2, 3, 3]])
    """
    check_start(start)
    return episode_ids_unchecked(start)


def episode_ids_unchecked(start: torch.Tensor) -> torch.Tensor:
    """``episode_ids`` of a ``start`` known to be valid (``episode_starts``' output)."""
    return (start.flatten().cumsum(0) - 1).view(start.shape)


def chunk_episodes(
    start: torch.Tensor, sequence_length: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cuts every episode fragment into sequences of at most ``sequence_length`` steps.

    A step's position in its fragment is its flat index minus the flat index of the fragment's
    start (a running ``cummax``); a sequence starts where that position is a multiple of
    ``sequence_length``.

    Args:
        start: ``[W, T]`` bool, True at each fragment's first step. Column 0 must be all True
            (checked, one device synchronisation).
        sequence_length: ``L >= 1``, or None for whole fragments.

    Returns:
        ``(sequence_id, sequence_offset)``, each ``[W, T]`` int64: the row-major sequence number
        and the step's position in its sequence; empty for an empty rollout.

    Example:
        >>> start = torch.tensor([[True, False, False, True, False]])
        >>> chunk_episodes(start, 2)
        (tensor([[0, 0, 1, 2, 2]]), tensor([[0, 1, 0, 0, 1]]))
    """
    sequence_length = check_sequence_length(sequence_length)
    check_start(start)
    return chunk_episodes_unchecked(start, sequence_length)


def chunk_episodes_unchecked(
    start: torch.Tensor, sequence_length: int | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``chunk_episodes`` of a ``start`` known to be valid (``SequenceChunker`` builds it)."""
    if sequence_length is not None and sequence_length >= start.numel():
        # no fragment is longer (nor an L past int64, which the arithmetic cannot hold)
        sequence_length = None
    if use_native(start):
        sequence_id, offset = chunk_flat(start.flatten(), sequence_length)
        return sequence_id.view(start.shape), offset.view(start.shape)
    flat = start.flatten()
    arange = torch.arange(flat.numel(), device=flat.device)
    fragment_first = torch.where(flat, arange, 0).cummax(0).values
    position = arange - fragment_first
    if sequence_length is None:
        offset = position
        seq_start = flat
    else:
        offset = position % int(sequence_length)
        seq_start = offset == 0
    sequence_id = seq_start.cumsum(0) - 1
    return sequence_id.view(start.shape), offset.view(start.shape)


def sequence_layout(
    sequence_id: torch.Tensor, sequence_offset: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The index map from padded sequences ``[N, Lp]`` to flat rollout steps ``[W * T]``.

    ``N`` is the number of sequences and ``Lp`` the longest one; both are read with one device
    synchronisation.

    Args:
        sequence_id: ``[W, T]`` int64 from ``chunk_episodes``.
        sequence_offset: ``[W, T]`` int64 from ``chunk_episodes``.

    Returns:
        ``(flat_index, loss_mask)``, each ``[N, Lp]``: int64 positions in the flattened rollout
        (0 on padding) and bool, True on real steps (a True prefix per row). An empty rollout
        gives ``[0, 0]``.

    Example:
        >>> sid, off = chunk_episodes(torch.tensor([[True, False, False, True]]), 2)
        >>> flat_index, mask = sequence_layout(sid, off)
        >>> flat_index
        tensor([[0, 1],
                [2, 0],
                [3, 0]])
        >>> mask
        tensor([[ True,  True],
                [ True, False],
                [ True, False]])
    """
    check_tensors({"sequence_id": sequence_id, "sequence_offset": sequence_offset})
    if sequence_id.shape != sequence_offset.shape or sequence_id.ndim != 2:
        raise ValueError(
            "sequence_id and sequence_offset must both have shape [W, T], got "
            f"{list(sequence_id.shape)} and {list(sequence_offset.shape)}"
        )
    check_dtype("sequence_id", sequence_id, torch.int64)
    check_dtype("sequence_offset", sequence_offset, torch.int64)
    if sequence_id.device != sequence_offset.device:
        raise ValueError(
            f"sequence_offset is on {sequence_offset.device}, but sequence_id is on "
            f"{sequence_id.device}"
        )
    check_not_meta({"sequence_id": sequence_id, "sequence_offset": sequence_offset})
    if sequence_id.numel() == 0:
        empty = torch.zeros((0, 0), dtype=torch.int64, device=sequence_id.device)
        return empty, empty.bool()
    consistent = _ids_consistent(sequence_id, sequence_offset)
    num_sequences, padded_length, ok = torch.stack(
        [sequence_id[-1, -1] + 1, sequence_offset.max() + 1, consistent]
    ).tolist()
    if not ok:
        raise ValueError(
            "sequence_id and sequence_offset are inconsistent: ids must count 0, 1, ... in "
            "row-major order, each row starting a new sequence, and offsets must run 0, 1, ... "
            "within every sequence (was the rollout sliced in time after chunking? run "
            "SequenceChunker again)"
        )
    return _scatter_layout(
        sequence_id.flatten(), sequence_offset.flatten(), num_sequences, padded_length
    )


def layout_from_starts(
    start: torch.Tensor, sequence_offset: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``sequence_layout`` of the sequences that begin where ``start`` is True.

    For ``SequenceLayout``, which numbers the sequences itself (row-major, from where the
    stored ids change), so only the offsets are left to check: 0 at every start and one more
    than the step before elsewhere. That check, ``N`` and ``Lp`` are read in one device
    synchronisation.

    Args:
        start: ``[W, T]`` bool, True at each sequence's first step (column 0 included).
        sequence_offset: ``[W, T]`` int64, the step's position in its sequence.

    Returns:
        ``(flat_index, loss_mask)``, each ``[N, Lp]``, as ``sequence_layout``'s.

    Raises:
        ValueError: offsets that do not run 0, 1, ... from every start (the message names
            the first such step), tensors on two devices, or meta tensors.
    """
    if start.device != sequence_offset.device:
        raise ValueError(
            f"sequence_offset is on {sequence_offset.device}, but sequence_id is on {start.device}"
        )
    check_not_meta({"sequence_id": start, "sequence_offset": sequence_offset})
    flat_start = start.flatten()
    flat_offset = sequence_offset.flatten()
    if use_native(flat_offset, flat_start):
        try:
            return layout_flat(flat_start, flat_offset)
        except LookupError:
            pass  # the torch path below finds the step again and words the error
    sequence_id = flat_start.cumsum(0).sub_(1)
    expected = torch.empty_like(flat_offset)
    torch.add(flat_offset[:-1], 1, out=expected[1:])
    expected.masked_fill_(flat_start, 0)  # includes step 0, a start
    ok = (flat_offset == expected).all()
    num_sequences, padded_length, ok = torch.stack(
        [sequence_id[-1] + 1, flat_offset.max() + 1, ok.to(torch.int64)]
    ).tolist()
    if not ok:
        first = int((flat_offset != expected).nonzero()[0, 0])
        worker, time = divmod(first, start.shape[1])
        raise ValueError(
            "sequence_offset must run 0, 1, ... within every sequence (one starts at each "
            "worker row's first step and wherever sequence_id changes), but at worker "
            f"{worker}, time {time} it is {int(flat_offset[first])} where "
            f"{int(expected[first])} was expected (was the rollout sliced in time after "
            "chunking, or its ids or offsets changed? run SequenceChunker again)"
        )
    return _scatter_layout(sequence_id, flat_offset, num_sequences, padded_length)


def _scatter_layout(
    sequence_id: torch.Tensor, sequence_offset: torch.Tensor, num_sequences: int, padded_length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, Lp]`` index map and mask from flat ``[W * T]`` consistent ids and offsets."""
    dest = sequence_id * padded_length + sequence_offset
    size = num_sequences * padded_length
    device = sequence_id.device
    # dest holds distinct positions: index_copy_ / index_fill_ are plain scatters, cheaper
    # than the general index_put_ behind `x[dest] = ...`
    flat_index = torch.zeros(size, dtype=torch.int64, device=device)
    flat_index.index_copy_(0, dest, torch.arange(dest.numel(), device=device))
    loss_mask = torch.zeros(size, dtype=torch.bool, device=device)
    loss_mask.index_fill_(0, dest, True)
    shape = (num_sequences, padded_length)
    return flat_index.view(shape), loss_mask.view(shape)


def _ids_consistent(sequence_id: torch.Tensor, sequence_offset: torch.Tensor) -> torch.Tensor:
    """0-dim int64, 1 when the ids and offsets are what ``chunk_episodes`` writes, else 0."""
    time_steps = sequence_id.shape[1]
    flat_id = sequence_id.flatten()
    flat_offset = sequence_offset.flatten()
    step = flat_id[1:] - flat_id[:-1]
    # True where step i + 1 starts a worker row (i + 1 a multiple of T), without a division
    row_start = torch.zeros(flat_id.numel() - 1, dtype=torch.bool, device=flat_id.device)
    row_start[time_steps - 1 :: time_steps] = True
    starts = torch.cat([flat_id.new_ones(1, dtype=torch.bool), step == 1])
    expected = torch.cat([flat_offset.new_zeros(1), flat_offset[:-1] + 1])
    ok = (
        (flat_id[0] == 0)
        & ((step == 0) | (step == 1)).all()
        & ~(row_start & (step != 1)).any()
        & (flat_offset == torch.where(starts, 0, expected)).all()
    )
    return ok.to(torch.int64)
