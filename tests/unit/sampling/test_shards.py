"""Unit tests of SequenceSampler's shards across ranks (rppo_td/sampling/_sampler.py)."""

from __future__ import annotations

import re

import pytest
import torch
import torch.distributed as dist
from tensordict import TensorDict

from rppo_td import EpisodeSplitter, SequenceChunker, SequencePadder, SequenceSampler
from tests.unit._data import small_rollout


def _chunked():
    # 6 sequences: lengths 2, 2, 1 (worker 0) and 2, 2, 1 (worker 1)
    return SequenceChunker(sequence_length=2)(EpisodeSplitter()(small_rollout()))


def _padded(num_sequences=12, longest=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, longest + 1, (num_sequences,), generator=g)
    mask = torch.arange(longest) < lengths[:, None]
    row = torch.arange(num_sequences)[:, None].expand(num_sequences, longest)
    return TensorDict({"loss_mask": mask, "row": row}, batch_size=[num_sequences, longest])


def _epoch(td, num_minibatches, seed, **kwargs):
    generator = torch.Generator().manual_seed(seed)
    return list(SequenceSampler(num_minibatches, generator=generator, **kwargs)(td))


def _rows(minibatches):
    return [mb["row"][:, 0].tolist() for mb in minibatches]


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_shards_are_disjoint_cover_and_have_equal_counts(world_size):
    padded = _padded()
    shards = [
        _epoch(padded, 2, seed=4, rank=rank, world_size=world_size) for rank in range(world_size)
    ]
    assert [len(shard) for shard in shards] == [2] * world_size
    rows = [r for shard in shards for mb in _rows(shard) for r in mb]
    assert sorted(rows) == list(range(12))
    # rank r takes groups r, r + world_size, ... of one global plan of 2 * world_size groups
    groups = _epoch(padded, 2 * world_size, seed=4)
    for rank, shard in enumerate(shards):
        assert _rows(shard) == _rows(groups[rank::world_size])


def test_world_size_one_is_todays_sampler():
    padded = _padded()
    assert _rows(_epoch(padded, 3, seed=9, rank=0, world_size=1)) == _rows(_epoch(padded, 3, 9))


@pytest.mark.parametrize("reuse_memory", [False, True])
@pytest.mark.parametrize("pad_to", [None, 3])
def test_lazy_rollout_shards_equal_padded_shards(reuse_memory, pad_to):
    chunked = _chunked()
    padded = SequencePadder(pad_to=pad_to)(chunked)
    for rank in range(2):
        shard = dict(rank=rank, world_size=2, pad_to=pad_to)
        eager = _epoch(padded, 3, seed=1, **shard)
        generator = torch.Generator().manual_seed(1)
        sampler = SequenceSampler(3, generator=generator, reuse_memory=reuse_memory, **shard)
        lazy = [mb.clone() for mb in sampler(chunked)]
        assert len(eager) == len(lazy) == 3
        for a, b in zip(eager, lazy, strict=True):
            assert a.batch_size == b.batch_size
            for key in a.keys(True, True):
                assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            dict(rank=0),
            "needs rank and world_size together (or neither, to read them from the "
            "default process group), got rank=0, world_size=None",
        ),
        (dict(world_size=2), "got rank=None, world_size=2"),
        (dict(rank=2, world_size=2), "rank must be in [0, world_size) = [0, 2), got rank=2"),
        (dict(rank=-1, world_size=2), "rank must be in [0, world_size) = [0, 2), got rank=-1"),
        (dict(rank=0, world_size=0), "world_size must be >= 1, got world_size=0"),
        (dict(rank=True, world_size=2), "rank must be an int, got True"),
        (dict(rank=0, world_size=2.0), "world_size must be an int, got 2.0"),
    ],
)
def test_bad_shard_arguments(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SequenceSampler(2, **kwargs)


@pytest.mark.parametrize("padded", [True, False])
def test_too_few_sequences_for_every_rank(padded):
    td = SequencePadder()(_chunked()) if padded else _chunked()
    message = (
        "num_minibatches=2 x world_size=4 = 8 minibatches exceed the 6 sequences available "
        "(rank=1; each rank takes num_minibatches of one shared plan)"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        list(SequenceSampler(2, rank=1, world_size=4)(td))
    assert len(list(SequenceSampler(2, rank=1, world_size=3)(td))) == 2


def test_reads_the_default_group_at_each_call(monkeypatch):
    sampler = SequenceSampler(2, generator=torch.Generator().manual_seed(0))
    assert sampler.shard() == (0, 1)  # no group initialised: one process
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: 1)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 3)
    # the ranks' plans compared: as three ranks that agree
    from rppo_td.sampling import _sampler

    monkeypatch.setattr(_sampler, "gather_ints", lambda values, timeout_s: [values] * 3)
    assert sampler.shard() == (1, 3)
    padded = _padded()
    got = _rows(sampler(padded))
    assert got == _rows(_epoch(padded, 2, seed=0, rank=1, world_size=3))
    # given explicitly, the group is not read
    assert SequenceSampler(2, rank=0, world_size=1).shard() == (0, 1)
