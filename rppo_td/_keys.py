"""Key names read and written by rppo_td, defined once.

TorchRL's names are used wherever TorchRL has one; only ``loss_mask`` and the index keys
(``episode_id``, ``sequence_id``, ``sequence_offset``, ``worker_index``, ``time_index``,
``rollout_steps``) are ours.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from tensordict import NestedKey

__all__ = ["RolloutKeys", "as_path"]


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
        rollout_steps: written by SequencePadder, ``[N, Lp]`` int64, ``W * T`` of the rollout
            the sequences were padded from on real steps (0 on padding). It survives indexing,
            ``torch.cat`` and replay-buffer storage, so ``SequencePadder.inv`` can refuse a
            subset of the sequences (one minibatch, a rollout missing its last worker) that
            would otherwise look like a smaller rollout.

    Every field must be a ``str`` or a non-empty tuple of ``str``. The keys rppo_td writes
    (``advantage``, ``value_target`` and the index keys) must differ from every other field,
    and none may be a prefix of another field (``("ids",)`` and ``("ids", "sequence")``):
    writing one would overwrite the other. Otherwise a ``ValueError`` or ``TypeError`` names
    the fields.

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
    rollout_steps: NestedKey = "rollout_steps"

    def __post_init__(self) -> None:
        paths = {}
        for item in fields(self):
            value = getattr(self, item.name)
            paths[item.name] = _path(item.name, value)
        written = {"advantage", "value_target", "episode_id", "sequence_id", "sequence_offset"}
        written |= {"loss_mask", "worker_index", "time_index", "rollout_steps"}
        names = list(paths)
        for i, first in enumerate(names):
            for second in names[i + 1 :]:
                if first not in written and second not in written:
                    continue  # two read keys may coincide (e.g. terminated = done)
                a, b = paths[first], paths[second]
                shorter = min(len(a), len(b))
                if a[:shorter] == b[:shorter]:
                    relation = "the same key" if len(a) == len(b) else "one inside the other"
                    writer = first if first in written else second
                    raise ValueError(
                        f"RolloutKeys fields {first}={getattr(self, first)!r} and "
                        f"{second}={getattr(self, second)!r} are {relation}: writing {writer} "
                        "would overwrite the other"
                    )

    def index_keys(self) -> tuple[NestedKey, ...]:
        """The keys SequencePadder adds and its inverse removes."""
        return (self.loss_mask, self.worker_index, self.time_index, self.rollout_steps)


def _path(name: str, key: object) -> tuple[str, ...]:
    """``key`` as a tuple of strs, or a ``TypeError`` naming the field."""
    if isinstance(key, str) and key:
        return (key,)
    if isinstance(key, tuple) and key and all(isinstance(k, str) and k for k in key):
        return key
    raise TypeError(
        f"RolloutKeys.{name} must be a str or a non-empty tuple of str (a nested key), got "
        f"{key!r} ({type(key).__name__})"
    )


DEFAULT_KEYS = RolloutKeys()


def as_path(key: NestedKey) -> tuple[str, ...]:
    """``key`` as a tuple of strs: ``"a"`` is ``("a",)``, so that two spellings compare equal."""
    return key if isinstance(key, tuple) else (key,)
