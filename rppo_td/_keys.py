"""Key names read and written by rppo_td, defined once.

TorchRL's names are used wherever TorchRL has one; only ``loss_mask`` and the index keys
(``episode_id``, ``sequence_id``, ``sequence_offset``, ``worker_index``, ``time_index``) are ours.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensordict import NestedKey

__all__ = ["RolloutKeys"]


@dataclass(frozen=True)
class RolloutKeys:
    """The keys every rppo_td component reads and writes.

    Each component takes ``keys=RolloutKeys(...)``; override any field with another nested key,
    e.g. ``RolloutKeys(reward=("next", "agents", "reward"))``.

    Attributes:
        state_value: ``V(o_t)``, ``[W, T, 1]`` float.
        next_state_value: ``V(o_{t+1})``, ``[W, T, 1]`` float.
        reward: reward after acting at ``t``, ``[W, T, 1]`` float.
        terminated: true episode end (no bootstrap), ``[W, T, 1]`` bool.
        truncated: time limit or cut (bootstrap), ``[W, T, 1]`` bool. Optional in rollouts.
        done: ``terminated | truncated``, ``[W, T, 1]`` bool.
        is_init: first step of an episode, ``[W, T, 1]`` bool. Optional in rollouts.
        advantage: written by GAE, ``[W, T, 1]`` float.
        value_target: written by GAE, ``[W, T, 1]`` float.
        episode_id: written by EpisodeSplitter, ``[W, T]`` int64, global and row-major.
        sequence_id: written by SequenceChunker, ``[W, T]`` int64, global and row-major.
        sequence_offset: written by SequenceChunker, ``[W, T]`` int64, position in the sequence.
        loss_mask: written by SequencePadder, ``[N, Lp]`` bool, True on real steps.
        worker_index: written by SequencePadder, ``[N, Lp]`` int64, the rollout row of a step.
        time_index: written by SequencePadder, ``[N, Lp]`` int64, the rollout column of a step.

    Example:
        >>> keys = RolloutKeys(reward=("next", "agents", "reward"))
        >>> keys.reward, keys.done
        (('next', 'agents', 'reward'), ('next', 'done'))
    """

    state_value: NestedKey = "state_value"
    next_state_value: NestedKey = ("next", "state_value")
    reward: NestedKey = ("next", "reward")
    terminated: NestedKey = ("next", "terminated")
    truncated: NestedKey = ("next", "truncated")
    done: NestedKey = ("next", "done")
    is_init: NestedKey = "is_init"
    advantage: NestedKey = "advantage"
    value_target: NestedKey = "value_target"
    episode_id: NestedKey = "episode_id"
    sequence_id: NestedKey = "sequence_id"
    sequence_offset: NestedKey = "sequence_offset"
    loss_mask: NestedKey = "loss_mask"
    worker_index: NestedKey = "worker_index"
    time_index: NestedKey = "time_index"

    def index_keys(self) -> tuple[NestedKey, ...]:
        """The keys SequencePadder adds and its inverse removes."""
        return (self.loss_mask, self.worker_index, self.time_index)


DEFAULT_KEYS = RolloutKeys()
