"""rppo_td: recurrent PPO data pipeline on TorchRL and TensorDict.

A rollout ``[W, T]`` goes through ``GAE -> EpisodeSplitter -> SequenceChunker ->
SequencePadder -> DeviceMover -> SequenceSampler`` and comes out as minibatches of whole,
right-padded sequences ``[B, Lp]`` with a ``loss_mask``.

Importing ``rppo_td`` has no side effects and loads no dependency: each name below is imported
from its subpackage on first access, so ``import rppo_td.functional`` needs torch only.
Importing registers no gym env; ``rppo_td.envs.register_envs()`` does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rppo_td import functional
    from rppo_td._keys import RolloutKeys
    from rppo_td._layout import SequenceLayout
    from rppo_td.objectives import GAEEstimator, RecurrentPPOLoss
    from rppo_td.sampling import SequenceReplaySampler, SequenceSampler
    from rppo_td.transforms import (
        GAE,
        DeviceMover,
        EpisodeSplitter,
        EpisodicNoveltyBonus,
        SequenceChunker,
        SequencePadder,
        SequenceStartStates,
    )

__version__ = "0.1.0"

__all__ = [
    "GAE",
    "DeviceMover",
    "EpisodeSplitter",
    "EpisodicNoveltyBonus",
    "GAEEstimator",
    "RecurrentPPOLoss",
    "RolloutKeys",
    "SequenceChunker",
    "SequenceLayout",
    "SequencePadder",
    "SequenceReplaySampler",
    "SequenceSampler",
    "SequenceStartStates",
    "functional",
]

# where each public name lives (the TYPE_CHECKING imports above, for type checkers)
_HOMES = {
    "GAE": "rppo_td.transforms",
    "DeviceMover": "rppo_td.transforms",
    "EpisodeSplitter": "rppo_td.transforms",
    "EpisodicNoveltyBonus": "rppo_td.transforms",
    "GAEEstimator": "rppo_td.objectives",
    "RecurrentPPOLoss": "rppo_td.objectives",
    "RolloutKeys": "rppo_td._keys",
    "SequenceChunker": "rppo_td.transforms",
    "SequenceLayout": "rppo_td._layout",
    "SequencePadder": "rppo_td.transforms",
    "SequenceReplaySampler": "rppo_td.sampling",
    "SequenceSampler": "rppo_td.sampling",
    "SequenceStartStates": "rppo_td.transforms",
}


# subpackages reachable as attributes after ``import rppo_td``, as before the lazy imports
_SUBPACKAGES = frozenset({"agent", "envs", "functional", "objectives", "sampling", "transforms"})


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        return importlib.import_module(f"rppo_td.{name}")
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'rppo_td' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
