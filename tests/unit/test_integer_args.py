"""Integer settings given as numpy integers (a sweep's ``np.arange``, a value read from an
array) act as the same Python ints everywhere: stored as ``int``, same outputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rppo_td import (
    GAE,
    EpisodeSplitter,
    SequenceChunker,
    SequencePadder,
    SequenceReplaySampler,
    SequenceSampler,
)
from rppo_td.functional import (
    chunk_episodes,
    discounted_segment_sum,
    episode_starts,
    observation_words,
    pad_sequences,
    padding_positions,
    sequence_layout,
    unpad_sequences,
)
from tests.unit._data import small_rollout

NUMPY_INTS = [np.int8, np.int32, np.int64, np.uint16]


def _chunked(length) -> TensorDict:
    td = small_rollout(num_workers=3, num_steps=7)
    td = GAE(gamma=0.9, lmbda=0.8)(td)
    return SequenceChunker(sequence_length=length)(EpisodeSplitter()(td))


@pytest.mark.parametrize("kind", NUMPY_INTS)
def test_transforms_and_samplers_take_numpy_ints(kind):
    chunker = SequenceChunker(sequence_length=kind(2))
    padder = SequencePadder(pad_to=kind(3))
    sampler = SequenceSampler(
        kind(2),
        generator=torch.Generator().manual_seed(0),
        pad_to=kind(3),
        rank=kind(0),
        world_size=kind(1),
    )
    replay = SequenceReplaySampler(kind(2))
    for value in (
        chunker.sequence_length,
        padder.pad_to,
        sampler.num_minibatches,
        sampler.pad_to,
        sampler.rank,
        sampler.world_size,
        replay.num_minibatches,
    ):
        assert type(value) is int
    assert (_chunked(kind(2)) == _chunked(2)).all()
    assert (padder(_chunked(2)) == SequencePadder(pad_to=3)(_chunked(2))).all()
    same = SequenceSampler(2, generator=torch.Generator().manual_seed(0), pad_to=3)
    for ours, theirs in zip(sampler(_chunked(2)), same(_chunked(2)), strict=True):
        assert (ours == theirs).all()


@pytest.mark.parametrize("kind", NUMPY_INTS)
def test_functions_take_numpy_ints(kind):
    done = torch.tensor([[False, True, False, False], [False, False, False, True]])
    start = episode_starts(done)
    for ours, theirs in zip(chunk_episodes(start, kind(2)), chunk_episodes(start, 2), strict=True):
        assert torch.equal(ours, theirs)
    flat, mask = sequence_layout(*chunk_episodes(start, 2))
    x = torch.arange(8.0).view(2, 4, 1)
    pads = padding_positions(mask)
    padded = pad_sequences(x, flat, pads, batch_dims=kind(2))
    assert torch.equal(padded, pad_sequences(x, flat, pads))
    real = mask.flatten().nonzero().squeeze(-1)
    back = unpad_sequences(padded, flat.flatten()[real], real, kind(8))
    assert torch.equal(back, x.view(8, 1))
    carry = torch.ones(2, 4, 1, dtype=torch.bool)
    assert torch.equal(
        discounted_segment_sum(x, carry, 0.5, time_dim=kind(1)),
        discounted_segment_sum(x, carry, 0.5, time_dim=1),
    )
    words = torch.arange(8, dtype=torch.int32).view(2, 4, 1)
    assert torch.equal(observation_words(words, kind(2)), observation_words(words))


@pytest.mark.parametrize("bad", [True, 2.0, "2", torch.tensor(2)])
def test_other_types_still_refused_by_name(bad):
    with pytest.raises(ValueError, match="num_minibatches must be an int"):
        SequenceSampler(bad)
    with pytest.raises(ValueError, match="rank must be an int"):
        SequenceSampler(2, rank=bad, world_size=2)
    with pytest.raises(ValueError, match="sequence_length must be an int >= 1 or None"):
        SequenceChunker(sequence_length=bad)
