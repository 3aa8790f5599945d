"""EpisodeSplitter and SequenceChunker: id keys on a ``[W, T]`` rollout."""

from __future__ import annotations

import torch
from tensordict import NestedKey, TensorDictBase

from rppo_td._keys import RolloutKeys
from rppo_td._validation import (
    MissingKeyError,
    check_device,
    check_dtype,
    check_not_meta,
    check_not_padded,
    check_not_split_trajs,
    check_not_transposed,
    check_sequence_length,
    check_shape,
    check_values,
    done_consistent,
    get_key,
    rollout_shape,
)
from rppo_td.functional import chunk_episodes_unchecked, episode_ids_unchecked, episode_starts
from rppo_td.transforms._base import RolloutTransform

__all__ = ["EpisodeSplitter", "SequenceChunker", "read_done"]


def _flag(td: TensorDictBase, key: NestedKey, shape: tuple[int, int]) -> torch.Tensor:
    value = get_key(td, key)
    check_shape(key, value, (*shape, 1))
    check_dtype(key, value, torch.bool)
    return value.squeeze(-1)


def _optional_flag(
    tensordict: TensorDictBase, key: NestedKey, shape: tuple[int, int]
) -> torch.Tensor | None:
    if tensordict.get(key, None) is None:
        return None
    return _flag(tensordict, key, shape)


def read_done(
    tensordict: TensorDictBase, keys: RolloutKeys, shape: tuple[int, int], who: str
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``done`` and ``is_init`` (or None) of a ``[W, T]`` rollout, each ``[W, T]`` bool.

    Without a ``done`` key, ``done`` is ``terminated | truncated``; with ``done`` and flags,
    they must agree (one device synchronisation). A ``MissingKeyError`` or ``ValueError``
    names the key otherwise.
    """
    is_init = _optional_flag(tensordict, keys.is_init, shape)
    terminated = _optional_flag(tensordict, keys.terminated, shape)
    truncated = _optional_flag(tensordict, keys.truncated, shape)
    done = _optional_flag(tensordict, keys.done, shape)
    if done is None:
        if terminated is None or truncated is None:
            raise MissingKeyError(
                f"{who} needs {keys.done!r}, or {keys.terminated!r} and "
                f"{keys.truncated!r} to make it; the tensordict has "
                f"{sorted(str(k) for k in tensordict.keys(True, True))}"
            )
        return terminated | truncated, is_init
    if terminated is not None or truncated is not None:
        named = {keys.done: done}
        for key, flag in ((keys.terminated, terminated), (keys.truncated, truncated)):
            if flag is not None:
                named[key] = flag
        check_device(named)
        check_not_meta(named)
        check_values(
            {},
            done_consistent(
                (keys.done, done),
                None if terminated is None else (keys.terminated, terminated),
                None if truncated is None else (keys.truncated, truncated),
            ),
        )
    check_not_transposed(keys.done, done, keys.is_init, is_init)
    return done, is_init


class EpisodeSplitter(RolloutTransform):
    """Numbers the episode fragments of a ``[W, T]`` rollout.

    Batch ``[W, T] -> [W, T]``; adds ``episode_id`` (``[W, T]`` int64, row-major, starting at 0)
    in place. A fragment starts at each worker's first step, after every ``("next", "done")``
    step, and wherever ``is_init`` (optional) is True. Time-limit truncations end fragments
    too, since the environment resets after them.

    ``done`` decides where fragments end; without a ``done`` key it is
    ``terminated | truncated``, as in ``GAE``. When ``done`` and the flags are all present,
    ``done`` must be ``terminated | truncated`` (with one flag only, that flag must imply
    ``done``): one device synchronisation checks it, so that GAE and the splitter agree on
    every episode end. Refused with a ``ValueError`` or ``KeyError`` naming the key: padded
    sequences (``loss_mask`` present), TorchRL's own padded trajectories
    (``Collector(split_trajs=True)``: ``("collector", "mask")`` present; collect with
    ``split_trajs=False``, the default), wrong shapes or dtypes, inconsistent flags, no ``done``
    and no flags to make it, a rollout whose ``is_init`` shows it is ``[T, W]`` (each end
    followed by a start down the rows, not along time: ``torch.stack(steps)`` stacks on dim
    0). A ``[W, 0]`` or ``[0, T]`` rollout gets an empty id key.

    Args:
        keys: key overrides (also ``set_keys(...)`` after construction).

    ``in_keys`` are ``done``, ``is_init``, ``terminated`` and ``truncated`` (each read when
    present: ``done``, or both flags to make it); ``out_keys`` is ``episode_id``.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> done = torch.tensor([[0, 1, 0, 0], [0, 0, 0, 1]]).bool().unsqueeze(-1)
        >>> td = TensorDict({"next": {"done": done}}, batch_size=[2, 4])
        >>> EpisodeSplitter()(td)["episode_id"]
        tensor([[0, 0, 1, 1],
                [2, 2, 2, 2]])
    """

    _in_fields = ("done", "is_init", "terminated", "truncated")
    _out_fields = ("episode_id",)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        keys = self.keys
        shape = rollout_shape(tensordict, "EpisodeSplitter")
        self._check_takes_outputs(tensordict)
        check_not_padded(tensordict, keys.loss_mask, "EpisodeSplitter")
        check_not_split_trajs(tensordict, "EpisodeSplitter")
        done, is_init = read_done(tensordict, keys, shape, "EpisodeSplitter")
        starts = episode_starts(done, is_init)
        self._check_writable(tensordict, keys.episode_id, tuple(shape), torch.int64)
        tensordict.set(keys.episode_id, episode_ids_unchecked(starts))
        return tensordict


class SequenceChunker(RolloutTransform):
    """Cuts every episode fragment into sequences of at most ``sequence_length`` steps.

    Batch ``[W, T] -> [W, T]``; reads ``episode_id`` (run ``EpisodeSplitter`` first) and adds
    ``sequence_id`` (``[W, T]`` int64, row-major) and ``sequence_offset`` (``[W, T]`` int64,
    the step's position in its sequence) in place. Padded sequences (``loss_mask`` present)
    are refused with a ``ValueError``; a ``[W, 0]`` or ``[0, T]`` rollout gets empty keys.

    Args:
        sequence_length: ``L >= 1``, or None for whole episode fragments.
        keys: key overrides (also ``set_keys(...)`` after construction).

    ``in_keys`` is ``episode_id``; ``out_keys`` are ``sequence_id`` and ``sequence_offset``.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"episode_id": torch.tensor([[0, 0, 0, 1, 1]])}, batch_size=[1, 5])
        >>> td = SequenceChunker(sequence_length=2)(td)
        >>> td["sequence_id"], td["sequence_offset"]
        (tensor([[0, 0, 1, 2, 2]]), tensor([[0, 1, 0, 0, 1]]))
    """

    _in_fields = ("episode_id",)
    _out_fields = ("sequence_id", "sequence_offset")

    def __init__(self, *, sequence_length: int | None, keys: RolloutKeys | None = None) -> None:
        super().__init__(keys=keys)
        self.sequence_length = check_sequence_length(sequence_length)

    def _repr_args(self) -> str:
        return f"sequence_length={self.sequence_length}"

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        shape = rollout_shape(tensordict, "SequenceChunker")
        self._check_takes_outputs(tensordict)
        check_not_padded(tensordict, self.keys.loss_mask, "SequenceChunker")
        episode = get_key(
            tensordict, self.keys.episode_id, hint="Run EpisodeSplitter before SequenceChunker."
        )
        check_shape(self.keys.episode_id, episode, shape)
        check_dtype(self.keys.episode_id, episode, torch.int64)
        check_not_meta({self.keys.episode_id: episode})
        start = torch.ones(shape, dtype=torch.bool, device=episode.device)
        start[:, 1:] = episode[:, 1:] != episode[:, :-1]
        # start[:, 0] is True by construction: no check (and no device sync) needed
        for key in (self.keys.sequence_id, self.keys.sequence_offset):
            self._check_writable(tensordict, key, tuple(shape), torch.int64)
        sequence_id, offset = chunk_episodes_unchecked(start, self.sequence_length)
        tensordict.set(self.keys.sequence_id, sequence_id)
        tensordict.set(self.keys.sequence_offset, offset)
        return tensordict
