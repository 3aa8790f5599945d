"""EpisodicNoveltyBonus: a reward bonus for reaching an observation new to the episode."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import NestedKey, TensorDictBase

from rppo_td._keys import RolloutKeys, as_path
from rppo_td._validation import (
    check_device,
    check_floating,
    check_key_list,
    check_not_padded,
    check_not_split_trajs,
    check_shape,
    get_key,
    rollout_shape,
)
from rppo_td.functional import (
    NoveltyCarry,
    episode_starts,
    episodic_novelty,
    observation_words,
)
from rppo_td.transforms._base import RolloutTransform
from rppo_td.transforms._episodes import read_done

__all__ = ["EpisodicNoveltyBonus"]


def _check_coef(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"coef must be a real number >= 0, got {value!r} ({type(value).__name__})")
    if not math.isfinite(float(value)) or float(value) < 0:
        raise ValueError(f"coef must be a finite number >= 0, got {value}")
    return float(value)


class EpisodicNoveltyBonus(RolloutTransform):
    """Adds ``coef`` to the reward of each step whose next observation is new to its episode.

    An exploration bonus for memory tasks: an agent that walks back to look at a cue reaches
    views it has not seen in this episode, and is paid for it while the cue's use is still
    being learnt. Each episode pays it at most once per distinct observation, so the bonus of
    an episode is bounded; lower ``coef`` to zero over training (the attribute can be set
    between rollouts) so that the final policy serves the task's reward alone.

    Batch ``[W, T] -> [W, T]``, in place: ``reward`` (``[W, T, 1]`` float) gets
    ``coef * novel`` added, and ``("next", "novel")`` (``novel_key``, ``[W, T, 1]`` bool) is
    written. A step is novel when the observation after it (each of ``observation_keys``
    under ``"next"``, all equal together) matches none of its episode before it, byte for
    byte: the episode's first observation and every later one (``functional.episodic_novelty``;
    floats compare by their bits). Episodes end at ``done`` (or ``terminated | truncated``)
    and at ``is_init`` (optional), as ``EpisodeSplitter`` reads them.

    **Stateful.** Episodes run across rollouts: the transform keeps what each worker's open
    episode has seen, so call it once on every rollout of the same ``W`` workers, in order
    (a collector's batches). ``reset()`` forgets it (new envs); ``state_dict()`` holds it, for
    a checkpoint that resumes exactly. The first rollout after construction or ``reset()``
    starts every episode fresh.

    Refused with a ``ValueError`` naming the key or setting: a rollout that holds
    ``novel_key`` already (the bonus was added: a second call would add it again), a rollout
    of another ``W`` or another observation size than the carried one (``reset()`` first),
    a non-float reward, padded sequences, missing keys.

    Args:
        coef: the bonus per novel step, a finite number ``>= 0`` (0 writes the flags only).
        observation_keys: the observation leaves read, at the root (each step's observation,
            read at episode starts) and under ``"next"``.
        novel_key: where the flags are written.
        keys: key overrides (``reward``, ``done``, ``terminated``, ``truncated``,
            ``is_init``).

    ``in_keys`` are the observation keys (both), ``reward``, ``done``, ``terminated``,
    ``truncated`` and ``is_init`` (the flags as ``EpisodeSplitter`` reads them); ``out_keys``
    are ``reward`` and ``novel_key``.

    Example:
        >>> from tensordict import TensorDict
        >>> obs = torch.tensor([[0, 1, 0, 2]]).unsqueeze(-1)
        >>> td = TensorDict({"observation": obs, "next": {
        ...     "observation": torch.tensor([[1, 0, 2, 2]]).unsqueeze(-1),
        ...     "reward": torch.zeros(1, 4, 1),
        ...     "done": torch.tensor([[False, False, True, False]]).unsqueeze(-1)}},
        ...     batch_size=[1, 4])
        >>> td = EpisodicNoveltyBonus(0.1)(td)
        >>> td["next", "reward"].squeeze(-1)
        tensor([[0.1000, 0.0000, 0.1000, 0.0000]])
    """

    _in_fields = ("reward", "done", "terminated", "truncated", "is_init")
    _out_fields = ("reward",)

    def __init__(
        self,
        coef: float,
        *,
        observation_keys: Sequence[NestedKey] = ("observation",),
        novel_key: NestedKey = ("next", "novel"),
        keys: RolloutKeys | None = None,
    ) -> None:
        self.observation_keys = [
            key if isinstance(key, str) else tuple(key)
            for key in check_key_list("observation_keys", observation_keys)
        ]
        if not self.observation_keys:
            raise ValueError("observation_keys must name at least one observation leaf")
        self.novel_key = novel_key
        super().__init__(keys=keys)  # _follow checks the keys against novel_key
        self.coef = coef
        self._carry: NoveltyCarry | None = None
        self._open: torch.Tensor | None = None  # [W] bool, the last step was not done
        self._signature: list[str] | None = None  # the carried observations' dtypes, shapes

    @property
    def coef(self) -> float:
        """The bonus per novel step (settable: a finite number ``>= 0``)."""
        return self._coef

    @coef.setter
    def coef(self, value: float) -> None:
        self._coef = _check_coef(value)

    def _observation_pairs(self) -> list[tuple[NestedKey, NestedKey]]:
        def under_next(key: NestedKey) -> NestedKey:
            return ("next", key) if isinstance(key, str) else ("next", *key)

        return [(key, under_next(key)) for key in self.observation_keys]

    def _keys_of(self, keys: RolloutKeys, names: tuple[str, ...]) -> list[NestedKey]:  # type: ignore[override]
        own = [getattr(keys, name) for name in names]
        if names == self._in_fields:
            return [key for pair in self._observation_pairs() for key in pair] + own
        return [*own, self.novel_key]

    def _follow(self, keys: RolloutKeys) -> None:
        """``RolloutTransform._follow``, refusing first keys that clash, before taking any.

        ``set_keys(is_init="observation")`` read the observation as ``is_init``, silently; a
        key field moved onto ``novel_key`` was refused only at the next call.
        """
        observed = {as_path(key) for pair in self._observation_pairs() for key in pair}
        for name in self._in_fields:
            key = getattr(keys, name)
            if as_path(key) in observed:
                raise ValueError(
                    f"EpisodicNoveltyBonus: {name}={key!r} is one of the observation keys it "
                    f"hashes ({self.observation_keys}, and under 'next'); give it a key of its "
                    "own"
                )
        self._check_novel_key(self._keys_of(keys, self._in_fields))
        super()._follow(keys)

    def _check_novel_key(self, in_keys: list[NestedKey]) -> None:
        """``novel_key`` must not be one of ``in_keys`` (writing it would clobber it)."""
        if as_path(self.novel_key) in {as_path(key) for key in in_keys}:
            raise ValueError(
                f"EpisodicNoveltyBonus: novel_key={self.novel_key!r} is a key it reads (its "
                f"in_keys: {in_keys}); give the flags a key of their own"
            )

    def _repr_args(self) -> str:
        return f"coef={self.coef}"

    def reset(self) -> None:
        """Forgets the open episodes: the next rollout starts every episode fresh."""
        self._carry = None
        self._open = None
        self._signature = None

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        keys = self.keys
        who = "EpisodicNoveltyBonus"
        shape = rollout_shape(tensordict, who)
        self._check_takes_outputs(tensordict)
        check_not_padded(tensordict, keys.loss_mask, who)
        check_not_split_trajs(tensordict, who)
        self._check_novel_key(self.in_keys)  # novel_key may have been reassigned since
        if tensordict.get(self.novel_key, None) is not None:
            raise ValueError(
                f"{who} got a rollout that holds {self.novel_key!r} already: its bonus was "
                "added (a second call would add it again and misread the episodes it carries)"
            )
        reward = get_key(tensordict, keys.reward)
        check_shape(keys.reward, reward, (*shape, 1))
        check_floating(keys.reward, reward)
        done, is_init = read_done(tensordict, keys, shape, who)
        words: list[torch.Tensor] = []
        next_words: list[torch.Tensor] = []
        signature: list[str] = []  # each observation leaf's dtype and shape, for the carry
        for key, next_key in self._observation_pairs():
            pair = []
            for k in (key, next_key):
                value = get_key(tensordict, k)
                if value.shape[:2] != shape:
                    raise ValueError(
                        f"{k!r} must have batch dims {list(shape)} like the rollout, got shape "
                        f"{list(value.shape)}"
                    )
                check_device({keys.reward: reward, k: value})
                pair.append(value)
            if pair[0].shape != pair[1].shape or pair[0].dtype != pair[1].dtype:
                raise ValueError(
                    f"{key!r} and {next_key!r} must have the same shape and dtype (they are "
                    f"compared byte for byte), got {list(pair[0].shape)} {pair[0].dtype} and "
                    f"{list(pair[1].shape)} {pair[1].dtype}"
                )
            signature.append(f"{key!r}: {pair[0].dtype} {list(pair[0].shape[2:])}")
            words.append(observation_words(pair[0]))
            next_words.append(observation_words(pair[1]))
        observation = torch.cat(words, -1)
        next_observation = torch.cat(next_words, -1)
        carry = self._carry
        if carry is not None:
            assert self._open is not None
            # bytes padded to whole words compare equal across sizes (a float32 [1] and [2],
            # or [2] and a float64 [1]): the carried leaves' dtypes and shapes must match too
            carried = self._signature if self._signature is not None else signature
            if (
                self._open.shape[0] != shape[0]
                or carry.rows.shape[1] != observation.shape[2]
                or carried != signature
            ):
                raise ValueError(
                    f"{who} carries the open episodes of {self._open.shape[0]} workers with "
                    f"observations {', '.join(carried)} ({carry.rows.shape[1] * 8} bytes), but "
                    f"got a rollout of {shape[0]} workers with {', '.join(signature)} "
                    f"({observation.shape[2] * 8} bytes): call reset() when the envs change"
                )
            if self._open.device != reward.device:
                carry = NoveltyCarry(*(x.to(reward.device) for x in carry))
        # column 0 starts an episode unless the worker's carried one goes on
        start = episode_starts(done, is_init)
        if self._open is not None and shape[1]:
            start[:, 0] &= ~self._open.to(start.device)
            if is_init is not None:
                start[:, 0] |= is_init[:, 0]
        novel, carry = episodic_novelty(observation, next_observation, start, carry)
        if shape[1]:
            self._carry, self._open, self._signature = carry, ~done[:, -1], signature
        novel = novel.unsqueeze(-1)
        tensordict.set(self.novel_key, novel)
        if self.coef:
            tensordict.set(keys.reward, reward + self.coef * novel.to(reward.dtype))
        return tensordict

    def get_extra_state(self) -> dict[str, Any]:
        """The open episodes' observations (``state_dict``'s ``_extra_state``)."""
        if self._carry is None:
            return {}
        return {
            "rows": self._carry.rows,
            "worker": self._carry.worker,
            "open": self._open,
            "signature": self._signature,
        }

    def set_extra_state(self, state: dict[str, Any]) -> None:
        """Restores ``get_extra_state``'s output (an empty dict: nothing carried)."""
        if not state:
            self.reset()
            return
        self._carry = NoveltyCarry(state["rows"], state["worker"])
        self._open = state["open"]
        self._signature = state.get("signature")  # absent from states saved before it
