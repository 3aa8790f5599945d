"""Unit tests of rppo_td/sampling/_replay.py: SequenceReplaySampler."""

from __future__ import annotations

import re

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rppo_td import SequenceReplaySampler

MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]]).bool()


def _buffer(sampler, mask=MASK):
    buffer = ReplayBuffer(storage=LazyTensorStorage(mask.shape[0]), sampler=sampler)
    uid = torch.arange(mask.shape[0]).unsqueeze(-1).expand(mask.shape)
    buffer.extend(TensorDict({"loss_mask": mask, "uid": uid}, batch_size=mask.shape))
    return buffer


def test_docstring_case():
    buffer = _buffer(SequenceReplaySampler(2, generator=torch.Generator()))
    assert sorted(int(buffer.sample(1)["loss_mask"].sum()) for _ in range(2)) == [4, 5]


def test_epochs_and_state_dict_round_trip(tmp_path):
    sampler = SequenceReplaySampler(2, generator=torch.Generator().manual_seed(0))
    buffer = _buffer(sampler)
    assert not sampler.ran_out
    first = buffer.sample(1)["uid"][:, 0].tolist()
    state = sampler.state_dict()
    sampler.dumps(tmp_path)
    second = buffer.sample(1)["uid"][:, 0].tolist()
    assert sampler.ran_out
    assert sorted(first + second) == [0, 1, 2, 3]
    # restoring the position replays the rest of the epoch
    sampler.load_state_dict(state)
    assert not sampler.ran_out
    assert buffer.sample(1)["uid"][:, 0].tolist() == second
    fresh = SequenceReplaySampler(2)
    fresh.loads(tmp_path)
    assert fresh.state_dict()["next"] == 1
    assert [g.tolist() for g in fresh.state_dict()["plan"]] == [g.tolist() for g in state["plan"]]
    # after an epoch ran out, the next sample starts a new one
    buffer.sample(1)
    assert not sampler.ran_out
    assert repr(sampler) == "SequenceReplaySampler(num_minibatches=2, balance='steps')"


def test_balance_by_sequences():
    sampler = SequenceReplaySampler(4, generator=torch.Generator(), balance="sequences")
    buffer = _buffer(sampler)
    assert sorted(buffer.sample(1).batch_size[0] for _ in range(4)) == [1, 1, 1, 1]


def test_checks():
    with pytest.raises(ValueError, match="num_minibatches must be >= 1, got 0"):
        SequenceReplaySampler(0)
    with pytest.raises(ValueError, match="balance must be 'steps' or 'sequences', got 'x'"):
        SequenceReplaySampler(1, balance="x")
    with pytest.raises(
        ValueError,
        match=re.escape("num_minibatches must be in [1, 4] (the number of sequences), got 5"),
    ):
        _buffer(SequenceReplaySampler(5)).sample(1)
    buffer = ReplayBuffer(storage=LazyTensorStorage(3), sampler=SequenceReplaySampler(1))
    buffer.extend(TensorDict({"other": torch.zeros(3, 2)}, batch_size=[3, 2]))
    with pytest.raises(KeyError) as info:
        buffer.sample(1)
    assert "'loss_mask'" in info.value.args[0]
    buffer = ReplayBuffer(storage=LazyTensorStorage(3), sampler=SequenceReplaySampler(1))
    buffer.extend(TensorDict({"loss_mask": torch.ones(3, 2)}, batch_size=[3, 2]))
    with pytest.raises(
        ValueError,
        match=re.escape("'loss_mask' must be [N, Lp] bool in storage, got [3, 2] torch.float32"),
    ):
        buffer.sample(1)
