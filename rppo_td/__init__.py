"""rppo_td: recurrent PPO data pipeline on TorchRL and TensorDict.

A rollout ``[W, T]`` goes through ``GAE -> EpisodeSplitter -> SequenceChunker ->
SequencePadder -> DeviceMover -> SequenceSampler`` and comes out as minibatches of whole,
right-padded sequences ``[B, Lp]`` with a ``loss_mask``.
"""

import rppo_td.envs  # noqa: F401  (registers rppo_td/CartPoleNoVel-v1)
from rppo_td import functional
from rppo_td._keys import RolloutKeys
from rppo_td.objectives import GAEEstimator, RecurrentPPOLoss
from rppo_td.sampling import SequenceReplaySampler, SequenceSampler
from rppo_td.transforms import (
    GAE,
    DeviceMover,
    EpisodeSplitter,
    SequenceChunker,
    SequenceLayout,
    SequencePadder,
)

__version__ = "0.1.0"

__all__ = [
    "GAE",
    "DeviceMover",
    "EpisodeSplitter",
    "GAEEstimator",
    "RecurrentPPOLoss",
    "RolloutKeys",
    "SequenceChunker",
    "SequenceLayout",
    "SequencePadder",
    "SequenceReplaySampler",
    "SequenceSampler",
    "functional",
]
