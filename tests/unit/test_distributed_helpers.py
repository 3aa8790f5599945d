"""The trainer's collective helpers with ``torch.distributed`` stood in for (one process)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from rppo_td.train import _distributed
from rppo_td.train._config import TrainConfig
from rppo_td.train._distributed import Ranks


def test_gradients_are_averaged_not_summed(monkeypatch):
    # summed, each step's gradient was world_size times too large: clipping bit that much
    # earlier, grad_norm logged that much larger, and the ranks stayed in sync
    monkeypatch.setattr(_distributed.dist, "all_reduce", lambda t, *a, **k: t.mul_(2))
    a, b = nn.Parameter(torch.zeros(2)), nn.Parameter(torch.zeros(3))
    a.grad = torch.tensor([1.0, -2.0])  # two ranks holding it; b has none: zero
    _distributed.average_gradients([a, b], world_size=2)
    assert a.grad.tolist() == [1.0, -2.0] and b.grad.tolist() == [0.0, 0.0, 0.0]


def test_ranks_are_read_and_checked_from_torchruns_variables(monkeypatch):
    for name, value in (("RANK", "3"), ("WORLD_SIZE", "4"), ("LOCAL_RANK", "1")):
        monkeypatch.setenv(name, value)
    assert Ranks.from_environment() == Ranks(3, 4, 1)  # LOCAL_RANK picks the node's GPU
    for rank, world in (("4", "4"), ("-1", "4"), ("0", "0")):
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", world)
        with pytest.raises(ValueError, match="must be in"):
            Ranks.from_environment()


def test_parameters_that_differ_from_rank_0s_are_reported(monkeypatch):
    # "always in sync" would hide ranks that parted
    monkeypatch.setattr(_distributed.dist, "broadcast", lambda t, src: t.zero_())  # rank 0's
    monkeypatch.setattr(_distributed.dist, "all_reduce", lambda t, *a, **k: t)
    net = nn.Linear(2, 2)
    with torch.no_grad():
        net.weight.fill_(1.0)
    assert _distributed.parameters_in_sync(net) is False
    with torch.no_grad():
        net.weight.zero_()
        net.bias.zero_()
    assert _distributed.parameters_in_sync(net) is True


def test_every_setting_but_each_ranks_own_is_compared(monkeypatch):
    # a setting left out (learning_rate, say) would let ranks train on different ones
    seen: dict = {}
    monkeypatch.setattr(_distributed, "differences_across_group", lambda own: seen.update(own))
    settings = dataclasses.asdict(TrainConfig())
    _distributed.settings_differences(settings, Ranks(0, 2, 0))
    own = {"threads", "progress", "log_level", "output", "resume", "overwrite", "env_processes"}
    assert set(seen) == set(settings) - own
