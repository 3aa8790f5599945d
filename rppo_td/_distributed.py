"""torch.distributed helpers shared by the sampler's shards and the loss's reductions.

Nothing here starts or joins a process group: ``torch.distributed`` (``torchrun``, or
``init_process_group``) does that. The helpers read the default group when one is initialised
and fall back to a single process (rank 0 of 1) otherwise.
"""

from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist

from rppo_td._validation import integer

__all__ = [
    "all_reduce",
    "check_process_group",
    "check_shard_args",
    "differences_across_group",
    "gather_ints",
    "settings_across_group",
    "group_world_size",
    "resolve_group",
    "resolve_shard",
]


def _is_initialized() -> bool:
    return bool(dist.is_available() and dist.is_initialized())


def check_shard_args(
    rank: object, world_size: object, owner: str
) -> tuple[int, int] | tuple[None, None]:
    """``(rank, world_size)`` as ints, or a ``ValueError`` for a pair that names no shard.

    Both None (read from the default process group, or one process; returned as given), or
    both integers (numpy's too) with ``world_size >= 1`` and ``0 <= rank < world_size``.
    """
    if (rank is None) != (world_size is None):
        raise ValueError(
            f"{owner} needs rank and world_size together (or neither, to read them from the "
            f"default process group), got rank={rank!r}, world_size={world_size!r}"
        )
    if rank is None or world_size is None:
        return None, None
    rank, world_size = (
        integer(f"{owner}: {name}", value)
        for name, value in (("rank", rank), ("world_size", world_size))
    )
    if world_size < 1:
        raise ValueError(f"{owner}: world_size must be >= 1, got world_size={world_size}")
    if not 0 <= rank < world_size:
        raise ValueError(
            f"{owner}: rank must be in [0, world_size) = [0, {world_size}), got rank={rank}"
        )
    return rank, world_size


def resolve_shard(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: as given, else the default process group's, else ``(0, 1)``."""
    if rank is not None and world_size is not None:
        return rank, world_size
    if _is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def check_process_group(process_group: object, owner: str) -> None:
    """Refuses anything but None, ``"default"`` or a ``torch.distributed.ProcessGroup``."""
    if process_group is None or process_group == "default":
        return
    if dist.is_available() and isinstance(process_group, dist.ProcessGroup):
        return
    if dist.is_available() and process_group is dist.GroupMember.NON_GROUP_MEMBER:
        rank = dist.get_rank() if _is_initialized() else "?"
        raise ValueError(
            f"{owner}: this process (rank {rank}) is not a member of process_group "
            "(torch.distributed.new_group gave GroupMember.NON_GROUP_MEMBER here): give "
            "process_group=None on the ranks outside the group"
        )
    raise ValueError(
        f"{owner}: process_group must be None, 'default' or a torch.distributed.ProcessGroup, "
        f"got {process_group!r}"
    )


def resolve_group(process_group: Any) -> tuple[Any, int]:
    """``(group, world_size)`` to reduce over; ``(None, 1)``: nothing to reduce.

    ``"default"`` is the default group when one is initialised (else one process); a
    ``ProcessGroup`` is itself. A group of one process reduces nothing.
    """
    if process_group is None:
        return None, 1
    if isinstance(process_group, str):
        if not _is_initialized():
            return None, 1
        group = dist.group.WORLD
    else:
        group = process_group
    world_size = dist.get_world_size(group)
    return (group, world_size) if world_size > 1 else (None, 1)


def group_world_size(process_group: Any) -> int:
    """The number of processes ``resolve_group`` reduces over (1: none)."""
    return resolve_group(process_group)[1]


def all_reduce(
    tensor: torch.Tensor, group: Any, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM
) -> torch.Tensor:
    """The all-reduced value of ``tensor`` (detached; ``tensor`` itself is left as it is)."""
    out = tensor.detach().clone()
    dist.all_reduce(out, op=op, group=group)
    return out


def gather_ints(values: list[int], timeout_s: float | None = None) -> list[list[int]] | None:
    """Every rank's ``values`` (int64s) over the default group, in rank order (one all-gather).

    The tensors live where the group's backend takes them: this process's CUDA device for
    NCCL, the CPU otherwise. With ``timeout_s`` (gloo), None where the other ranks have not
    all joined within it (the group's own timeout is 30 minutes).
    """
    on_cuda = dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_cuda else torch.device("cpu")
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    work = dist.all_gather(gathered, mine, async_op=True)
    if timeout_s is None or on_cuda:
        work.wait()
    else:
        try:
            work.wait(timeout=datetime.timedelta(seconds=timeout_s))
        except RuntimeError as err:
            if "timed out" not in str(err).lower():
                raise
            return None
    return [g.tolist() for g in gathered]


def settings_across_group(settings: dict[str, Any], group: Any, owner: str) -> None:
    """Refuses, on every rank of ``group``, ``settings`` that differ from rank 0's of it.

    Every rank gets the same answer, so all raise together (a rank with other options ran
    other collectives and broke off in gloo's "collective mismatch", naming nothing).
    """
    differ = differences_across_group(settings, group)
    if differ is not None:
        raise ValueError(
            f"{owner}: the ranks of process_group were built with different options: "
            f"{differ} (ranks of the group in its own order); build it with the same options "
            "on every rank"
        )


def differences_across_group(settings: dict[str, Any], group: Any = None) -> str | None:
    """Where the ranks' ``settings`` differ from rank 0's, as one line; None where they agree.

    One ``all_gather_object`` over ``group`` (None: the default group); every rank gets the
    same answer. At most three differences are named, then how many more.
    """
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, settings, group=group)
    first = gathered[0]
    differ = [
        f"{name}={other.get(name)!r} on rank {rank} but {first.get(name)!r} on rank 0"
        for rank, other in enumerate(gathered[1:], 1)
        for name in sorted(set(first) | set(other))
        if other.get(name) != first.get(name)
    ]
    if not differ:
        return None
    more = f" (and {len(differ) - 3} more)" if len(differ) > 3 else ""
    return "; ".join(differ[:3]) + more
