"""Hypothesis strategies for ``[W, T]`` rollouts and their parts, for testing transforms.

Structure (sizes, keys, shapes, dtypes, episode ends) is drawn by hypothesis so failures shrink
to small, readable cases; tensor *values* (observations, rewards, values, states) are filled
from a ``torch.Generator`` seeded by a drawn integer, which keeps examples fast and still
reproducible. As in ``xarray.testing.strategies``, what a rollout is made of is given as
strategies: pass ``st.just(...)`` to fix a part (``num_workers=st.just(2)``).

Strategies:

- ``observation_specs()``: one to three observation keys (flat or nested) with shapes and dtypes
  (float vectors, uint8 images, int64 and bool features).
- ``action_specs()``: discrete (scalar int64), one-hot, multi-discrete (int64 vector) or
  continuous (float32 vector) actions.
- ``recurrent_specs()``: LSTM (``h`` and ``c``) or GRU (``h``) states ``[layers, H]``, or none.
- ``episode_ends(W, T)``: ``(terminated, truncated)`` flags, ``[W, T, 1]`` bool; both True
  at one step only with ``allow_both=True`` (a time limit that falls on a terminal step).
- ``rollouts()``: a full rollout TensorDict ``[W, T]`` keyed as ``rppo_td.RolloutKeys`` says
  (or as given overrides say), with ``done = terminated | truncated`` and ``is_init``
  consistent with the previous step's ``done``.
- ``sequence_lengths()``: ``L >= 1`` or None (whole fragments).
- ``discounts()``: gamma / lambda values in ``[0, 1]``, the end points included.
- ``step_masks(W, T)``: episode-start masks ``[W, T]`` bool with column 0 True.

Example:
    >>> from hypothesis import given, settings, strategies as st
    >>> from rppo_td import EpisodeSplitter
    >>> @settings(max_examples=5, database=None)
    ... @given(rollouts(num_workers=st.just(2), num_steps=st.integers(1, 6)))
    ... def test_episode_ids_are_int64(td):
    ...     assert EpisodeSplitter()(td)["episode_id"].shape == td.batch_size  # [W, T]
    >>> test_episode_ids_are_int64()
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st
from tensordict import NestedKey, TensorDict

from rppo_td import RolloutKeys
from rppo_td._validation import check_int_at_least

__all__ = [
    "OBSERVATION_KEYS",
    "ActionSpec",
    "FeatureSpec",
    "RecurrentSpec",
    "action_specs",
    "discounts",
    "episode_ends",
    "observation_specs",
    "recurrent_specs",
    "rollouts",
    "sequence_lengths",
    "step_masks",
]

OBSERVATION_KEYS: tuple[NestedKey, ...] = (
    "observation",
    "pixels",
    ("obs", "camera"),
    ("obs", "joints"),
    ("agents", "observation"),
)
"""The pool observation keys are drawn from: flat and nested, none a prefix of another."""


@dataclass(frozen=True)
class FeatureSpec:
    """The per-step shape and dtype of one key (the part after ``[W, T]``)."""

    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True)
class ActionSpec:
    """An action space: ``kind`` is discrete, one_hot, multi_discrete or continuous."""

    kind: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    num_values: int = 0


@dataclass(frozen=True)
class RecurrentSpec:
    """Recurrent state entering each step: ``cell`` is lstm (h, c) or gru (h only)."""

    cell: str
    num_layers: int
    hidden_size: int

    @property
    def state_names(self) -> tuple[str, ...]:
        """The state keys this cell stores."""
        if self.cell == "lstm":
            return ("recurrent_state_h", "recurrent_state_c")
        return ("recurrent_state_h",)


_small = st.integers(1, 4)


def _check_strategy(name: str, value: object) -> None:
    """A strategy parameter that must be a hypothesis strategy, refused by name."""
    if not isinstance(value, st.SearchStrategy):
        raise TypeError(
            f"{name} must be a hypothesis strategy (st.just({value!r}) for a fixed value), "
            f"got {value!r}"
        )


def _is_flag(value: object) -> bool:
    """A bool, numpy's bool, or an integer 0 or 1 (not a str, whose truth is its length)."""
    if isinstance(value, bool | np.bool_):
        return True
    return isinstance(value, numbers.Integral) and value in (0, 1)


def _check_bool(name: str, value: object) -> None:
    """A flag given by the caller, refused by name unless ``_is_flag``."""
    if not _is_flag(value):
        raise TypeError(f"{name} must be True or False, got {value!r}")


def _check_drawn(name: str, value: object, expected: type | tuple[type, ...], what: str) -> None:
    """A value drawn from a caller's strategy, refused by name unless of ``expected`` type."""
    if not isinstance(value, expected):
        raise TypeError(f"rollouts' {name} strategy must draw {what}, drew {value!r}")


def _check_drawn_flag(name: str, value: object) -> bool:
    """A flag drawn from a caller's strategy, as a ``bool`` (refused by name unless one)."""
    if not _is_flag(value):
        raise TypeError(f"rollouts' {name} strategy must draw True or False, drew {value!r}")
    return bool(value)


@st.composite
def _feature_specs(draw: st.DrawFn) -> FeatureSpec:
    kind = draw(st.sampled_from(["vector", "image", "integer", "flag"]), label="feature kind")
    if kind == "vector":
        dtype = draw(st.sampled_from([torch.float32, torch.float64]))
        return FeatureSpec((draw(_small),), dtype)
    if kind == "image":
        shape = (draw(st.integers(1, 3)), draw(_small), draw(_small))
        return FeatureSpec(shape, torch.uint8)
    if kind == "integer":
        return FeatureSpec((draw(_small),), torch.int64)
    return FeatureSpec((draw(_small),), torch.bool)


def observation_specs(
    min_keys: int = 1, max_keys: int = 3
) -> st.SearchStrategy[dict[NestedKey, FeatureSpec]]:
    """Observation keys (from ``OBSERVATION_KEYS``) mapped to their per-step spec.

    ``min_keys`` and ``max_keys`` are ints with ``0 <= min_keys <= max_keys`` and ``min_keys``
    at most ``len(OBSERVATION_KEYS)`` (5; else a ``ValueError`` names the parameter); at most
    5 keys are drawn whatever ``max_keys``.
    """
    check_int_at_least("min_keys", min_keys, 0)
    check_int_at_least("max_keys", max_keys, min_keys)
    if min_keys > len(OBSERVATION_KEYS):
        raise ValueError(
            f"min_keys must be at most {len(OBSERVATION_KEYS)} (the keys of OBSERVATION_KEYS), "
            f"got {min_keys}"
        )
    return st.dictionaries(
        st.sampled_from(OBSERVATION_KEYS), _feature_specs(), min_size=min_keys, max_size=max_keys
    )


@st.composite
def action_specs(draw: st.DrawFn) -> ActionSpec:
    """Discrete, one-hot, multi-discrete or continuous actions."""
    kind = draw(st.sampled_from(["discrete", "one_hot", "multi_discrete", "continuous"]))
    if kind == "discrete":
        return ActionSpec(kind, (), torch.int64, num_values=draw(st.integers(2, 5)))
    if kind == "one_hot":
        n = draw(st.integers(2, 5))
        return ActionSpec(kind, (n,), torch.int64, num_values=n)
    if kind == "multi_discrete":
        return ActionSpec(kind, (draw(_small),), torch.int64, num_values=draw(st.integers(2, 5)))
    return ActionSpec(kind, (draw(_small),), torch.float32)


def recurrent_specs(allow_none: bool = True) -> st.SearchStrategy[RecurrentSpec | None]:
    """LSTM or GRU states with 1-3 layers and hidden size 1-4, or (if allowed) None."""
    _check_bool("allow_none", allow_none)
    spec = st.builds(
        RecurrentSpec,
        cell=st.sampled_from(["lstm", "gru"]),
        num_layers=st.integers(1, 3),
        hidden_size=_small,
    )
    return st.one_of(st.none(), spec) if allow_none else spec


def episode_ends(
    num_workers: int, num_steps: int, end_rate: int = 4, allow_both: bool = False
) -> st.SearchStrategy[tuple[torch.Tensor, torch.Tensor]]:
    """``(terminated, truncated)``, each ``[W, T, 1]`` bool.

    Each step is an end with probability about ``2 / (end_rate + 2)``, half terminations and
    half truncations; shrinks towards no ends at all. With ``allow_both`` a step may also be
    both (a time limit on a terminal step, as gymnasium allows): each of the three with
    probability about ``1 / (end_rate + 3)``. ``num_workers``, ``num_steps`` and ``end_rate``
    are ints ``>= 0`` (else a ``ValueError`` names the parameter, when called).
    """
    check_int_at_least("num_workers", num_workers, 0)
    check_int_at_least("num_steps", num_steps, 0)
    check_int_at_least("end_rate", end_rate, 0)
    _check_bool("allow_both", allow_both)
    return _episode_ends(num_workers, num_steps, end_rate, allow_both)


@st.composite
def _episode_ends(
    draw: st.DrawFn, num_workers: int, num_steps: int, end_rate: int, allow_both: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    codes = draw(
        st.lists(
            st.integers(0, end_rate + (2 if allow_both else 1)),
            min_size=num_workers * num_steps,
            max_size=num_workers * num_steps,
        ),
        label="step end codes",
    )
    code = torch.tensor(codes, dtype=torch.int64).view(num_workers, num_steps, 1)
    both = code == end_rate + 2
    return (code == end_rate) | both, (code == end_rate + 1) | both


def sequence_lengths(max_length: int = 12, allow_none: bool = True) -> st.SearchStrategy:
    """``L`` in ``[1, max_length]``, or None (whole fragments) if allowed.

    ``max_length`` is an int ``>= 1`` (else a ``ValueError`` names it).
    """
    check_int_at_least("max_length", max_length, 1)
    _check_bool("allow_none", allow_none)
    lengths = st.integers(1, max_length)
    return st.one_of(lengths, st.none()) if allow_none else lengths


def discounts() -> st.SearchStrategy[float]:
    """A discount factor in ``[0, 1]``: the end points, or any float in between."""
    return st.one_of(
        st.sampled_from([0.0, 1.0, 0.5, 0.99]),
        st.floats(0.0, 1.0, allow_nan=False, allow_subnormal=False),
    )


def step_masks(num_workers: int, num_steps: int) -> st.SearchStrategy[torch.Tensor]:
    """Episode-start masks ``[W, T]`` bool with column 0 True (every row starts a fragment).

    ``num_workers`` and ``num_steps`` are ints ``>= 0`` (else a ``ValueError`` names them).
    """
    check_int_at_least("num_workers", num_workers, 0)
    check_int_at_least("num_steps", num_steps, 0)
    return _step_masks(num_workers, num_steps)


@st.composite
def _step_masks(draw: st.DrawFn, num_workers: int, num_steps: int) -> torch.Tensor:
    flags = draw(
        st.lists(st.booleans(), min_size=num_workers * num_steps, max_size=num_workers * num_steps)
    )
    start = torch.tensor(flags, dtype=torch.bool).view(num_workers, num_steps)
    start[:, :1] = True  # no column at all where num_steps is 0
    return start


_workers = st.integers(1, 4)
_steps = st.integers(1, 12)
_observations = observation_specs()
_actions = action_specs()
_recurrent = recurrent_specs()
_true = st.just(True)
_booleans = st.booleans()


def _fill(
    generator: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, num_values: int = 0
) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator, dtype=dtype)
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) < 0.5
    high = num_values if num_values else (256 if dtype == torch.uint8 else 100)
    return torch.randint(0, high, shape, generator=generator, dtype=dtype)


def _action(generator: torch.Generator, spec: ActionSpec, batch: tuple[int, int]) -> torch.Tensor:
    if spec.kind == "one_hot":
        index = torch.randint(0, spec.num_values, batch, generator=generator)
        return torch.nn.functional.one_hot(index, spec.num_values).to(spec.dtype)
    return _fill(generator, batch + spec.shape, spec.dtype, spec.num_values)


def rollouts(
    *,
    num_workers: st.SearchStrategy[int] = _workers,
    num_steps: st.SearchStrategy[int] = _steps,
    observations: st.SearchStrategy[dict[NestedKey, FeatureSpec]] = _observations,
    actions: st.SearchStrategy[ActionSpec] = _actions,
    recurrent: st.SearchStrategy[RecurrentSpec | None] = _recurrent,
    with_done: st.SearchStrategy[bool] = _true,
    with_is_init: st.SearchStrategy[bool] = _booleans,
    end_rate: int = 4,
    extra_starts: bool = False,
    allow_both: bool = False,
    keys: RolloutKeys | None = None,
) -> st.SearchStrategy[TensorDict]:
    """A random rollout ``[W, T]`` as a TorchRL collector writes it.

    Keys (names from ``keys``, default ``RolloutKeys()``): the drawn observation keys at the
    root and under ``"next"``; ``action``; ``action_log_prob`` ``[W, T]``; ``state_value``,
    ``("next", "state_value")``, ``("next", "reward")`` ``[W, T, 1]`` float32;
    ``("next", "terminated")``, ``("next", "truncated")`` and (if ``with_done``)
    ``("next", "done")`` ``[W, T, 1]`` bool; (if ``with_is_init``) ``is_init`` ``[W, T, 1]``
    bool, True after every done step and drawn at ``t = 0`` (a rollout may continue an episode);
    recurrent states ``[W, T, layers, H]`` (if ``recurrent`` draws a spec).

    The keys relate as a collector's do: ``("next", key)[:, t]`` equals ``key[:, t + 1]`` where
    step ``t`` is not done (observations and ``state_value``; after a done step and at the last
    step it is drawn on its own), and the recurrent states are zero where an episode starts
    (a reset stores the zero state; ``is_init``'s starts where it is written, extra ones
    included). Rewards, actions and other states are drawn independently.

    Hypothesis draws each per-step flag as a list, and caps lists at a few thousand
    elements: ``W * T`` of 4,096 or more (where ``rppo_td``'s compiled CPU kernels take over,
    ``rppo_td._native``) is refused by Hypothesis (``Unsatisfiable`` or ``InvalidArgument``).
    Property-test the kernels on small rollouts inside
    ``with rppo_td._native.native_kernels(True):``.

    ``done`` is always ``terminated | truncated``. With ``extra_starts`` (``with_is_init`` is
    then True), ``is_init`` is also True at random steps not preceded by ``done``, e.g. an
    environment reset that the rollout did not record as done: the data is then inconsistent
    for GAE, but it tests that splitting honours ``is_init``.

    Args:
        num_workers: ``W`` (default 1 to 4).
        num_steps: ``T`` (default 1 to 12).
        observations: the observation keys and specs (default ``observation_specs()``).
        actions: the action space (default ``action_specs()``).
        recurrent: the recurrent state, or None for none (default ``recurrent_specs()``,
            which draws None too; ``st.none()`` for a memory-less rollout).
        with_done: whether ``("next", "done")`` is written (default ``st.just(True)``).
        with_is_init: whether ``is_init`` is written (default ``st.booleans()``).
        end_rate: an int ``>= 0``: each step ends an episode with probability about
            ``2 / (end_rate + 2)`` (0: every step).
        extra_starts: add ``is_init`` starts not preceded by ``done`` (see above).
        allow_both: steps may be terminated and truncated at once (``episode_ends``).
        keys: key names (default ``RolloutKeys()``).

    Raises:
        TypeError: when called, a parameter that must be a strategy is not one
            (``st.just(2)``, not ``2``), or ``extra_starts``/``allow_both``/``keys`` of another
            type; when drawn, a strategy that draws the wrong type (``recurrent`` must draw a
            ``RecurrentSpec`` or None, ``actions`` an ``ActionSpec``, ``observations`` a dict
            of ``FeatureSpec``, ``with_done``/``with_is_init`` a bool).
        ValueError: when called, ``end_rate`` not an int ``>= 0``; when drawn, ``W`` or ``T``
            not an int ``>= 1``.

    Example:
        >>> from hypothesis import given, settings, strategies as st
        >>> @settings(max_examples=3, database=None)
        ... @given(rollouts(num_workers=st.just(3), num_steps=st.just(4), recurrent=st.none()))
        ... def test_shape(td):
        ...     assert td.batch_size == (3, 4) and td["state_value"].shape == (3, 4, 1)
        >>> test_shape()
    """
    strategies = {
        "num_workers": num_workers,
        "num_steps": num_steps,
        "observations": observations,
        "actions": actions,
        "recurrent": recurrent,
        "with_done": with_done,
        "with_is_init": with_is_init,
    }
    for name, value in strategies.items():
        _check_strategy(name, value)
    check_int_at_least("end_rate", end_rate, 0)
    _check_bool("extra_starts", extra_starts)
    _check_bool("allow_both", allow_both)
    if keys is not None and not isinstance(keys, RolloutKeys):
        raise TypeError(f"keys must be a RolloutKeys or None, got {keys!r}")
    return _rollouts(
        strategies, end_rate, extra_starts, allow_both, keys if keys is not None else RolloutKeys()
    )


@st.composite
def _rollouts(
    draw: st.DrawFn,
    strategies: dict[str, st.SearchStrategy],
    end_rate: int,
    extra_starts: bool,
    allow_both: bool,
    keys: RolloutKeys,
) -> TensorDict:
    """``rollouts``' draw, its arguments checked."""
    workers = draw(strategies["num_workers"], label="W")
    steps = draw(strategies["num_steps"], label="T")
    for name, drawn in (("num_workers", workers), ("num_steps", steps)):
        if isinstance(drawn, bool) or not isinstance(drawn, int) or drawn < 1:
            raise ValueError(f"rollouts' {name} strategy must draw ints >= 1, drew {drawn!r}")
    batch = (workers, steps)
    observation_spec = draw(strategies["observations"], label="observations")
    _check_drawn("observations", observation_spec, Mapping, "a mapping of keys to FeatureSpec")
    for key, spec in observation_spec.items():
        _check_drawn("observations", spec, FeatureSpec, f"a FeatureSpec for {key!r}")
    action = draw(strategies["actions"], label="action")
    _check_drawn("actions", action, ActionSpec, "an ActionSpec")
    state = draw(strategies["recurrent"], label="recurrent")
    _check_drawn("recurrent", state, (RecurrentSpec, type(None)), "a RecurrentSpec or None")
    done_key = _check_drawn_flag("with_done", draw(strategies["with_done"], label="with done"))
    is_init_key = True
    if not extra_starts:
        drawn = draw(strategies["with_is_init"], label="with is_init")
        is_init_key = _check_drawn_flag("with_is_init", drawn)
    ends = episode_ends(workers, steps, end_rate, allow_both)
    terminated, truncated = draw(ends, label="ends")
    first_is_init = draw(
        st.lists(st.booleans(), min_size=workers, max_size=workers), label="is_init[:, 0]"
    )
    seed = draw(st.integers(0, 2**32 - 1), label="value seed")
    generator = torch.Generator().manual_seed(seed)

    done = terminated | truncated
    td = TensorDict(batch_size=batch)
    for key, spec in observation_spec.items():
        next_key = ("next", *(key if isinstance(key, tuple) else (key,)))
        td.set(key, _fill(generator, batch + spec.shape, spec.dtype))
        td.set(next_key, _next_values(td.get(key), done, generator))
    td.set("action", _action(generator, action, batch))
    td.set("action_log_prob", torch.randn(batch, generator=generator))
    td.set(keys.state_value, torch.randn((*batch, 1), generator=generator))
    td.set(keys.next_state_value, _next_values(td.get(keys.state_value), done, generator))
    td.set(keys.reward, torch.randn((*batch, 1), generator=generator))
    td.set(keys.terminated, terminated)
    td.set(keys.truncated, truncated)
    if done_key:
        td.set(keys.done, done)
    # where an episode starts: after a done step, and at t = 0 where drawn so
    starts = torch.zeros((*batch, 1), dtype=torch.bool)
    starts[:, 0, 0] = torch.tensor(first_is_init, dtype=torch.bool)
    starts[:, 1:] = done[:, :-1]
    if extra_starts:  # (is_init is then written)
        extra = draw(
            st.lists(
                st.booleans(),
                min_size=workers * steps,
                max_size=workers * steps,
            ),
            label="extra is_init",
        )
        starts = starts | torch.tensor(extra, dtype=torch.bool).view(workers, steps, 1)
    if is_init_key:
        td.set(keys.is_init, starts)
    if state is not None:
        for name in state.state_names:
            shape = (*batch, state.num_layers, state.hidden_size)
            # a reset stores the zero state; other steps the state the network carried
            values = torch.randn(shape, generator=generator)
            td.set(name, values.masked_fill(starts.unsqueeze(-1), 0.0))
    return td


def _next_values(
    values: torch.Tensor, done: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """``("next", key)`` of a root ``[W, T, *F]`` leaf, as a collector writes it.

    The next step's value where the episode goes on; a value of its own after a done step
    (the final observation, or its value, which the reset's does not replace) and at the
    rollout's last step.
    """
    fresh = _fill(generator, tuple(values.shape), values.dtype)
    following = torch.cat([values[:, 1:], fresh[:, -1:]], dim=1)
    ended = done.view(*done.shape[:2], *([1] * (values.ndim - 2)))
    return torch.where(ended, fresh, following)
