"""Data-parallel runs under ``torchrun``: the ranks, the process group, gradient averaging.

``torchrun --standalone --nproc-per-node N -m rppo_td.train ...`` starts ``N`` copies of the
trainer with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous address in their
environment. Each rank collects from its own envs and averages its gradients with the others
after every backward pass (what ``DistributedDataParallel`` does, as one flat all-reduce per
step), so the parameters stay identical; rank 0 alone writes the run's files.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from tensordict import TensorDict, TensorDictBase
from torch import nn

from rppo_td._distributed import differences_across_group

__all__ = [
    "Ranks",
    "any_rank",
    "average_gradients",
    "broadcast_module",
    "gather_episodes",
    "gather_ranks",
    "leave_group",
    "parameters_in_sync",
    "settings_differences",
    "start_group",
]


@dataclass(frozen=True)
class Ranks:
    """This process in the run: ``rank`` of ``world_size``, ``local_rank`` on its node."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0: the one that writes logs, checkpoints and ``summary.json``."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        """More than one rank."""
        return self.world_size > 1

    @property
    def where(self) -> str:
        """``rank R on HOST``, for messages (torchrun's ranks share one stderr)."""
        return f"rank {self.rank} on {socket.gethostname()}"

    @classmethod
    def from_environment(cls) -> Ranks:
        """The ranks torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``); one without.

        Raises:
            ValueError: values that are not integers, or a rank outside ``[0, WORLD_SIZE)``.
        """
        values = {}
        for name, default in (("RANK", 0), ("WORLD_SIZE", 1), ("LOCAL_RANK", 0)):
            text = os.environ.get(name, str(default))
            try:
                values[name] = int(text)
            except ValueError:
                raise ValueError(
                    f"environment variable {name}={text!r} is not an integer"
                ) from None
        rank, world_size = values["RANK"], values["WORLD_SIZE"]
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"RANK={rank} must be in [0, WORLD_SIZE={world_size})")
        return cls(rank, world_size, values["LOCAL_RANK"])


def start_group(ranks: Ranks, device: torch.device) -> torch.device:
    """Joins the process group (``gloo`` on CPU, ``nccl`` on CUDA); returns this rank's device.

    On CUDA each rank takes the GPU of its ``local_rank``. A no-op for a single rank or when
    the group is already initialised.
    """
    if device.type == "cuda":
        device = torch.device("cuda", ranks.local_rank)
        torch.cuda.set_device(device)
    if ranks.distributed and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def leave_group() -> None:
    """Destroys the default process group if there is one (the end of a run)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def broadcast_module(module: nn.Module) -> None:
    """Copies rank 0's parameters and buffers to every rank (the start of a run)."""
    for tensor in module.state_dict().values():
        dist.broadcast(tensor, src=0)


def average_gradients(parameters: Iterable[nn.Parameter], world_size: int) -> None:
    """Replaces every gradient by its mean over the ranks: one flat all-reduce.

    A parameter without a gradient on this rank counts as a zero gradient, as in DDP with
    ``find_unused_parameters``.
    """
    params = list(parameters)
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world_size
    offset = 0
    for p, g in zip(params, grads, strict=True):
        n = g.numel()
        p.grad = flat[offset : offset + n].view_as(g).clone()
        offset += n


def mean_over_ranks(values: dict[str, torch.Tensor], world_size: int) -> dict[str, torch.Tensor]:
    """Each 0-dim tensor of ``values`` averaged over the ranks: one all-reduce for all.

    ``RecurrentPPOLoss`` with a process group gives each rank its own sum over the all-ranks
    step count times ``world_size``, so the loss over every rank's steps is the ranks' mean.
    """
    names = list(values)
    flat = torch.stack([values[name].detach().to(torch.float64) for name in names])
    dist.all_reduce(flat)
    flat /= world_size
    return {name: flat[i] for i, name in enumerate(names)}


def parameters_in_sync(module: nn.Module) -> bool:
    """Whether every rank holds exactly rank 0's parameters (one broadcast and one reduce)."""
    flat = torch.cat([p.detach().reshape(-1) for p in module.parameters()])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    differs = torch.tensor([0 if torch.equal(reference, flat) else 1], device=flat.device)
    dist.all_reduce(differs)
    return int(differs.item()) == 0


def gather_ranks(td: TensorDictBase) -> TensorDictBase:
    """Every rank's ``td`` (the same batch size and keys on each), concatenated along dim 0.

    Rank order, so every rank gets the same result.
    """
    parts = []
    for key in td.keys(True, True):
        value = td.get(key).contiguous()
        out = [torch.empty_like(value) for _ in range(dist.get_world_size())]
        dist.all_gather(out, value)
        parts.append((key, torch.cat(out)))
    batch = [td.batch_size[0] * dist.get_world_size(), *td.batch_size[1:]]
    gathered = TensorDict({}, batch_size=batch, device=td.device)
    for key, value in parts:
        gathered.set(key, value)
    return gathered


def gather_episodes(
    returns: list[float], lengths: list[int], ends: list[int]
) -> tuple[list[float], list[int]]:
    """The episodes every rank finished, in the order they ended (the same on every rank).

    ``ends``: the step each of this rank's episodes ended at, in the order they are listed.
    Episodes are sorted by that step, then by rank: the order of one process stepping all
    the ranks' envs (env ``i`` of rank ``r`` as env ``r * W + i``), so a window of the
    latest episodes holds every rank's, not the last rank's alone.
    """
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (returns, lengths, ends))
    merged = [
        (end, rank, r, n)
        for rank, (rank_returns, rank_lengths, rank_ends) in enumerate(everyone)
        for r, n, end in zip(rank_returns, rank_lengths, rank_ends, strict=True)
    ]
    merged.sort(key=lambda episode: (episode[0], episode[1]))  # stable: a rank's own order
    return [r for _, _, r, _ in merged], [n for _, _, _, n in merged]


class RanksRefused(ValueError):
    """A refusal every rank raises together (their settings differ, rank 0's directory is refused).

    Each rank prints it, then ``wait_for_ranks()`` before it exits: torchrun stops the other
    ranks once one has exited, and a rank stopped before it printed said nothing.
    """


def share_from_main(value: Any, ranks: Ranks) -> Any:
    """Rank 0's ``value`` (any picklable object) on every rank; ``value`` itself in one process."""
    if not ranks.distributed:
        return value
    box = [value if ranks.main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# settings a rank may hold its own value of: where it logs and how fast it runs, not what the
# ranks train together
RANK_OWN_SETTINGS = frozenset(
    {"threads", "progress", "log_level", "output", "resume", "overwrite", "env_processes"}
)


def settings_differences(settings: dict[str, Any], ranks: Ranks) -> str | None:
    """Where the ranks' ``settings`` differ from rank 0's, as one line; None where they agree.

    Every rank calls it (one ``all_gather_object``) and gets the same answer, so all refuse
    together: a rank with another ``num_minibatches`` or ``epochs`` waited forever in a
    collective, another ``hidden_size`` aborted in gloo, another ``learning_rate`` or
    ``gamma`` trained on in silence. ``RANK_OWN_SETTINGS`` are not compared.
    """
    if not ranks.distributed:
        return None
    own = {name: value for name, value in settings.items() if name not in RANK_OWN_SETTINGS}
    return differences_across_group(own)


def wait_for_ranks() -> None:
    """Returns once every rank has called it (a barrier)."""
    dist.barrier()


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank if ``flag`` is True on any (a stop request seen by one rank)."""
    value = torch.tensor([int(flag)], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
