"""TorchRL transforms over ``[W, T]`` rollouts, each a thin wrapper of ``rppo_td.functional``."""

from rppo_td.transforms._device import DeviceMover
from rppo_td.transforms._episodes import EpisodeSplitter, SequenceChunker
from rppo_td.transforms._gae import GAE
from rppo_td.transforms._novelty import EpisodicNoveltyBonus
from rppo_td.transforms._padder import SequencePadder
from rppo_td.transforms._start_states import SequenceStartStates

__all__ = [
    "GAE",
    "DeviceMover",
    "EpisodeSplitter",
    "EpisodicNoveltyBonus",
    "SequenceChunker",
    "SequencePadder",
    "SequenceStartStates",
]
