"""EpisodeSplitter and SequenceChunker: id keys on a ``[W, T]`` rollout."""

from __future__ import annotations

import torch
from tensordict import NestedKey, TensorDictBase

from rppo_td._keys import RolloutKeys
from rppo_td._validation import (
    check_dtype,
    check_sequence_length,
    check_shape,
    get_key,
    rollout_shape,
)
from rppo_td.functional._sequences import chunk_episodes, episode_ids, episode_starts
from rppo_td.transforms._base import RolloutTransform

__all__ = ["EpisodeSplitter", "SequenceChunker"]


def _flag(td: TensorDictBase, key: NestedKey, shape: tuple[int, int]) -> torch.Tensor:
    value = get_key(td, key)
    check_shape(key, value, (*shape, 1))
    check_dtype(key, value, torch.bool)
    return value.squeeze(-1)


class EpisodeSplitter(RolloutTransform):
    """Numbers the episode fragments of a ``[W, T]`` rollout.

    Batch ``[W, T] -> [W, T]``; adds ``episode_id`` (``[W, T]`` int64, row-major, starting at 0)
    in place. A fragment starts at each worker's first step, after every ``("next", "done")``
    step, and wherever ``is_init`` (optional) is True. Time-limit truncations end fragments
    too, since the environment resets after them.

    Args:
        keys: key overrides.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> done = torch.tensor([[0, 1, 0, 0], [0, 0, 0, 1]]).bool().unsqueeze(-1)
        >>> td = TensorDict({"next": {"done": done}}, batch_size=[2, 4])
        >>> EpisodeSplitter()(td)["episode_id"]
        tensor([[0, 0, 1, 1],
                [2, 2, 2, 2]])
    """

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        shape = rollout_shape(tensordict, "EpisodeSplitter")
        done = _flag(tensordict, self.keys.done, shape)
        has_init = tensordict.get(self.keys.is_init, None) is not None
        is_init = _flag(tensordict, self.keys.is_init, shape) if has_init else None
        tensordict.set(self.keys.episode_id, episode_ids(episode_starts(done, is_init)))
        return tensordict


class SequenceChunker(RolloutTransform):
    """Cuts every episode fragment into sequences of at most ``sequence_length`` steps.

    Batch ``[W, T] -> [W, T]``; reads ``episode_id`` (run ``EpisodeSplitter`` first) and adds
    ``sequence_id`` (``[W, T]`` int64, row-major) and ``sequence_offset`` (``[W, T]`` int64,
    the step's position in its sequence) in place.

    Args:
        sequence_length: ``L >= 1``, or None for whole episode fragments.
        keys: key overrides.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"episode_id": torch.tensor([[0, 0, 0, 1, 1]])}, batch_size=[1, 5])
        >>> td = SequenceChunker(sequence_length=2)(td)
        >>> td["sequence_id"], td["sequence_offset"]
        (tensor([[0, 0, 1, 2, 2]]), tensor([[0, 1, 0, 0, 1]]))
    """

    def __init__(self, *, sequence_length: int | None, keys: RolloutKeys | None = None) -> None:
        super().__init__(keys=keys)
        check_sequence_length(sequence_length)
        self.sequence_length = sequence_length

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        shape = rollout_shape(tensordict, "SequenceChunker")
        episode = get_key(
            tensordict, self.keys.episode_id, hint="Run EpisodeSplitter before SequenceChunker."
        )
        check_shape(self.keys.episode_id, episode, shape)
        check_dtype(self.keys.episode_id, episode, torch.int64)
        start = torch.ones(shape, dtype=torch.bool, device=episode.device)
        start[:, 1:] = episode[:, 1:] != episode[:, :-1]
        sequence_id, offset = chunk_episodes(start, self.sequence_length)
        tensordict.set(self.keys.sequence_id, sequence_id)
        tensordict.set(self.keys.sequence_offset, offset)
        return tensordict
