"""Episodic novelty: which steps reach an observation not seen before in their episode.

An exploration bonus for memory tasks (a first-visit episodic count, as in the episodic-count
bonuses of Badia et al., "Never Give Up", ICLR 2020, and Henaff et al., "Exploration via
Elliptical Episodic Bonuses", NeurIPS 2022): a step is novel when the observation it leads to
was not seen earlier in the same episode, the episode's first observation included. Episodes
run across rollouts; what each worker's open episode has seen is carried from one rollout to
the next as its distinct observations.

Observations are compared as rows of ``D`` int64 words (``observation_words``): equal rows
are equal bytes. Nothing here loops over workers, episodes or steps.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import torch

from rppo_td._validation import (
    check_batch_dims,
    check_device,
    check_dtype,
    check_not_meta,
    check_tensors,
)

if TYPE_CHECKING:  # annotations only: functional imports torch alone
    from tensordict import NestedKey

__all__ = ["NoveltyCarry", "episodic_novelty", "observation_words"]


class NoveltyCarry(NamedTuple):
    """The distinct observations each worker's open episode has seen so far.

    Attributes:
        rows: ``[M, D]`` int64, observation words (``observation_words``), distinct per worker.
        worker: ``[M]`` int64, the worker each row belongs to.

    Example:
        >>> obs = torch.tensor([[[4], [5]], [[7], [7]]])  # [W, T, D] = [2, 2, 1]
        >>> _, carry = episodic_novelty(obs, obs, torch.ones(2, 2, dtype=torch.bool))
        >>> carry.rows.squeeze(1).tolist(), carry.worker.tolist()  # each worker's last episode
        ([5, 7], [0, 1])
    """

    rows: torch.Tensor
    worker: torch.Tensor


def observation_words(observation: torch.Tensor, batch_dims: int = 2) -> torch.Tensor:
    """Each observation's bytes as a row of int64 words, so that equal rows mean equal bytes.

    Floats compare by their bits: ``-0.0`` and ``0.0`` differ, a NaN equals the same NaN.

    Args:
        observation: ``[*B, *F]`` of any dtype, ``B`` the first ``batch_dims`` dims.
        batch_dims: how many leading dims are batch dims.

    Returns:
        ``[*B, D]`` int64, ``D = max(1, ceil(bytes(F) / 8))`` (zero bytes pad the last word;
        features of no bytes are one zero word, the same for every observation). An empty
        batch gives ``[*B, D]`` with no rows.

    Raises:
        TypeError: ``observation`` not a tensor.
        ValueError: ``batch_dims`` not an int in ``[1, observation.ndim]``.

    Example:
        >>> observation_words(torch.tensor([[[1, 2], [1, 2]]], dtype=torch.int32)).shape
        torch.Size([1, 2, 1])
    """
    check_tensors({"observation": observation})
    batch_dims = check_batch_dims(batch_dims, "observation", observation)
    batch = observation.shape[:batch_dims]
    # the feature size spelled out: -1 cannot be inferred for an empty batch
    features = math.prod(observation.shape[batch_dims:])
    if observation.numel() == 0:  # no rows, or no bytes: an empty view's strides may be any
        words = max(1, -(-features * observation.element_size() // 8))
        return observation.new_zeros((*batch, words), dtype=torch.int64)
    flat = observation.contiguous().reshape(*batch, features)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    raw = flat.view(torch.uint8) if flat.shape[-1] else flat.to(torch.uint8)
    extra = (-raw.shape[-1]) % 8
    if extra or raw.shape[-1] == 0:
        raw = torch.nn.functional.pad(raw, (0, extra if raw.shape[-1] else 8))
    elif raw.storage_offset() % 8:
        # a view into a byte buffer at an odd offset (a memmap's header): int64 words need
        # 8-byte aligned storage, so the bytes are copied once
        raw = raw.clone()
    return raw.view(torch.int64)


def _check(
    observation: torch.Tensor,
    next_observation: torch.Tensor,
    start: torch.Tensor,
    carry: NoveltyCarry | None,
) -> None:
    named: dict[NestedKey, torch.Tensor] = {
        "observation": observation,
        "next_observation": next_observation,
        "start": start,
    }
    if carry is not None:
        named |= {"carry.rows": carry.rows, "carry.worker": carry.worker}
    check_tensors({str(name): value for name, value in named.items()})
    check_not_meta(named)
    check_device(named)
    # observation's [W, T, D] is the reference: each other argument is named against it
    if observation.ndim != 3:
        raise ValueError(
            f"observation must have shape [W, T, D] (observation_words), got "
            f"{list(observation.shape)}"
        )
    check_dtype("observation", observation, torch.int64)
    if next_observation.shape != observation.shape:
        raise ValueError(
            f"next_observation must have observation's shape {list(observation.shape)}, got "
            f"{list(next_observation.shape)}"
        )
    check_dtype("next_observation", next_observation, torch.int64)
    if start.shape != observation.shape[:2]:
        raise ValueError(
            f"start must have shape [W, T] = {list(observation.shape[:2])} (observation's), "
            f"got {list(start.shape)}"
        )
    check_dtype("start", start, torch.bool)
    if carry is not None:
        check_dtype("carry.rows", carry.rows, torch.int64)
        check_dtype("carry.worker", carry.worker, torch.int64)
        words = observation.shape[2]
        if carry.rows.ndim != 2 or carry.rows.shape[1] != words:
            raise ValueError(
                f"carry.rows must have shape [M, {words}] (the observations' words), got "
                f"{list(carry.rows.shape)}: was the carry made from other observations?"
            )
        if carry.worker.shape != carry.rows.shape[:1]:
            raise ValueError(
                f"carry.worker must have shape [{carry.rows.shape[0]}] like carry.rows' first "
                f"dim, got {list(carry.worker.shape)}"
            )
        workers = start.shape[0]
        if carry.worker.numel() and not bool(
            ((carry.worker >= 0) & (carry.worker < workers)).all()
        ):
            raise ValueError(f"carry.worker must hold workers in [0, {workers}) (W = {workers})")


def episodic_novelty(
    observation: torch.Tensor,
    next_observation: torch.Tensor,
    start: torch.Tensor,
    carry: NoveltyCarry | None = None,
) -> tuple[torch.Tensor, NoveltyCarry]:
    """Marks the steps whose next observation is new to their episode.

    Step ``[w, t]`` is novel when ``next_observation[w, t]`` differs from every observation of
    its episode before it: the episode's first ``observation``, the ``next_observation`` of its
    earlier steps, and, for an episode that began in an earlier rollout, the observations it
    saw there (``carry``).

    The rows of all the rollout's observations are numbered with one ``unique``; the first
    sighting of each (episode, observation) pair is found with stable sorts.

    Args:
        observation: ``[W, T, D]`` int64 words (``observation_words``) of each step's
            observation; only those at episode starts are read.
        next_observation: ``[W, T, D]`` int64 words of the observation after each step.
        start: ``[W, T]`` bool, True where a new episode starts. Column 0: True starts a new
            episode, False continues the worker's open episode of ``carry``.
        carry: the open episodes' observations from the previous rollout (this function's
            output there, or a plain ``(rows, worker)`` pair), or None (nothing carried: a
            False in column 0 then continues an episode of which nothing is known).

    Returns:
        ``(novel, carry)``: ``[W, T]`` bool, and the carry for the next rollout: the distinct
        observations of each worker's last episode here. It holds every worker's rows: where
        the next rollout starts a new episode at column 0 (its worker's last step here was
        done), that worker's rows are ignored there.

    Raises:
        TypeError: a carry that is neither a ``NoveltyCarry``, a ``(rows, worker)`` pair nor
            None, or an input that is not a tensor.
        ValueError: shapes, dtypes or devices that do not match, a carry of another width or
            with workers out of range, meta tensors.

    Example:
        >>> obs = torch.tensor([[[0], [1], [0]]])
        >>> nxt = torch.tensor([[[1], [0], [2]]])
        >>> start = torch.tensor([[True, False, False]])
        >>> novel, carry = episodic_novelty(obs, nxt, start)
        >>> novel
        tensor([[ True, False,  True]])
        >>> carry.rows.squeeze(1).tolist(), carry.worker.tolist()
        ([0, 1, 2], [0, 0, 0])
    """
    if carry is not None and not isinstance(carry, NoveltyCarry):
        if not (isinstance(carry, tuple) and len(carry) == 2):
            raise TypeError(
                "carry must be a NoveltyCarry (rows, worker), the carry this function "
                f"returned, or None; got {type(carry).__name__}"
            )
        carry = NoveltyCarry(*carry)  # a plain (rows, worker) pair
    _check(observation, next_observation, start, carry)
    workers, steps, words = observation.shape
    device = observation.device
    novel = torch.zeros((workers, steps), dtype=torch.bool, device=device)
    empty_carry = NoveltyCarry(
        torch.zeros((0, words), dtype=torch.int64, device=device),
        torch.zeros(0, dtype=torch.int64, device=device),
    )
    if workers == 0 or steps == 0:
        return novel, carry if carry is not None and steps == 0 else empty_carry
    # episodes numbered row-major; each worker row starts one (an open one at column 0)
    begins = start.clone()
    begins[:, 0] = True
    episode = (begins.flatten().cumsum(0) - 1).view(workers, steps)
    # events, each (episode, order, row, is a step's outcome): carried rows first (order -1),
    # then each episode's first observation (order 2t) and each step's outcome (2t + 1)
    time = torch.arange(steps, device=device).expand(workers, steps)
    first = start.nonzero(as_tuple=True)
    parts_episode = [episode[first], episode.flatten()]
    parts_order = [2 * time[first], (2 * time + 1).flatten()]
    parts_rows = [observation[first], next_observation.reshape(-1, words)]
    if carry is not None and carry.rows.shape[0]:
        keep = ~start[carry.worker, 0]  # rows of workers whose open episode continues
        parts_episode.insert(0, episode[carry.worker[keep], 0])
        parts_order.insert(0, torch.full_like(carry.worker[keep], -1))
        parts_rows.insert(0, carry.rows[keep])
    event_episode = torch.cat(parts_episode)
    event_order = torch.cat(parts_order)
    # the few carried and first rows, then every outcome (a view: no copy of the rollout)
    head = torch.cat(parts_rows[:-1])
    tail = parts_rows[-1]
    outcomes = workers * steps  # the last events, in row-major step order
    row_id = _row_ids(head, tail)
    # sort by (episode, row id, order): stable sorts from the least significant key
    perm = torch.argsort(event_order, stable=True)
    perm = perm[torch.argsort(row_id[perm], stable=True)]
    perm = perm[torch.argsort(event_episode[perm], stable=True)]
    sorted_episode, sorted_row = event_episode[perm], row_id[perm]
    first_sighting = torch.ones_like(perm, dtype=torch.bool)
    first_sighting[1:] = (sorted_episode[1:] != sorted_episode[:-1]) | (
        sorted_row[1:] != sorted_row[:-1]
    )
    is_first = torch.empty_like(first_sighting)
    is_first[perm] = first_sighting
    novel = is_first[-outcomes:].view(workers, steps)
    # the next carry: the distinct rows of each worker's last episode
    event_worker = _worker_of_episode(episode, event_episode)
    chosen = (is_first & (event_episode == episode[:, -1][event_worker])).nonzero().squeeze(1)
    return novel, NoveltyCarry(_take(head, tail, chosen), event_worker[chosen])


# rows wider than this are numbered through a hash (then checked), narrower ones directly
_HASH_MIN_WORDS = 8
_CHUNK_WORDS = 1 << 22  # rows hashed or compared per pass: about 32 MiB of int64 at a time


def _take(head: torch.Tensor, tail: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows ``index`` ``[K]`` of ``cat([head, tail])`` ``[H + R, D]``, without the cat."""
    size = head.shape[0]
    in_head = index < size
    if not bool(in_head.any()):
        return tail.index_select(0, index - size)
    out = head.new_empty((index.numel(), head.shape[1]))
    at_head, at_tail = in_head.nonzero().squeeze(1), (~in_head).nonzero().squeeze(1)
    out.index_copy_(0, at_head, head.index_select(0, index.index_select(0, at_head)))
    out.index_copy_(0, at_tail, tail.index_select(0, index.index_select(0, at_tail) - size))
    return out


def _multipliers(words: int, device: torch.device) -> torch.Tensor:
    """``[D]`` int64 odd hash multipliers (fixed): every word moves a row's hash."""
    generator = torch.Generator().manual_seed(0x5EED)
    # products and sums wrap modulo 2**64
    return (torch.randint(-(2**62), 2**62, (words,), generator=generator) * 2 + 1).to(device)


def _row_ids(head: torch.Tensor, tail: torch.Tensor) -> torch.Tensor:
    """``[H + R]`` int64 ids of the rows of ``cat([head, tail])``, equal where rows are equal.

    Narrow rows go through ``torch.unique(dim=0)``. Wide ones (images: a lexicographic sort
    of thousands of words per row is slow) are hashed to one int64 each, numbered by a
    ``unique`` of the hashes, and every row is then compared with the first row of its hash;
    a collision (never seen in practice) falls back to the direct numbering.
    """
    words = head.shape[1]
    if words < _HASH_MIN_WORDS:
        return torch.unique(torch.cat([head, tail]), dim=0, return_inverse=True)[1]
    mult = _multipliers(words, head.device)
    chunk = max(1, _CHUNK_WORDS // words)
    hashes = torch.cat(
        [
            (part[i : i + chunk] * mult).sum(1)
            for part in (head, tail)
            for i in range(0, len(part), chunk)
        ]
    )
    _, inverse = torch.unique(hashes, return_inverse=True)
    total = hashes.numel()
    first = torch.full((int(inverse.max()) + 1,), total, dtype=torch.int64, device=head.device)
    first.scatter_reduce_(0, inverse, torch.arange(total, device=head.device), "amin")
    representative = first[inverse]
    # each row that shares its hash with an earlier one must equal that row
    shared = (representative != torch.arange(total, device=head.device)).nonzero().squeeze(1)
    for i in range(0, shared.numel(), chunk):
        index = shared[i : i + chunk]
        if not torch.equal(_take(head, tail, index), _take(head, tail, representative[index])):
            return torch.unique(torch.cat([head, tail]), dim=0, return_inverse=True)[1]
    return inverse


def _worker_of_episode(episode: torch.Tensor, event_episode: torch.Tensor) -> torch.Tensor:
    """``[E]`` int64, the worker of each event's episode (episodes are numbered row-major)."""
    first_of_row = episode[:, 0].contiguous()  # ascending
    return torch.searchsorted(first_of_row, event_episode, right=True) - 1
