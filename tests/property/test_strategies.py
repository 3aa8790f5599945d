"""Tests of tests/strategies.py: what it draws is well formed and covers what it promises."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from rppo_td import RolloutKeys
from tests.strategies import (
    OBSERVATION_KEYS,
    action_specs,
    discounts,
    episode_ends,
    observation_specs,
    recurrent_specs,
    rollouts,
    sequence_lengths,
    step_masks,
)

# find() only needs one example of each kind: generate, do not shrink
_FIND = settings(
    max_examples=500,
    database=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def _observation_keys(td):
    nested = [("next", *(k if isinstance(k, tuple) else (k,))) for k in OBSERVATION_KEYS]
    present = [k for k in OBSERVATION_KEYS if td.get(k, None) is not None]
    return present, [k for k in nested if td.get(k, None) is not None]


@given(td=rollouts(with_is_init=None, with_done=None))
def test_rollouts_are_well_formed(td):
    assert td.batch_dims == 2
    num_workers, num_steps = td.batch_size
    assert 1 <= num_workers <= 4 and 1 <= num_steps <= 12
    flags = [("next", "terminated"), ("next", "truncated")]
    for key in [*flags, ("next", "reward"), "state_value", ("next", "state_value")]:
        assert td[key].shape == (num_workers, num_steps, 1), key
    for key in flags:
        assert td[key].dtype == torch.bool
    terminated, truncated = td["next", "terminated"], td["next", "truncated"]
    assert not bool((terminated & truncated).any())
    done = terminated | truncated
    if td.get(("next", "done"), None) is not None:
        assert torch.equal(td["next", "done"], done)
    if td.get("is_init", None) is not None:
        assert td["is_init"].dtype == torch.bool
        assert torch.equal(td["is_init"][:, 1:], done[:, :-1])
    present, next_present = _observation_keys(td)
    assert 1 <= len(present) == len(next_present) <= 3
    for key in present:
        assert td[key].dtype in (torch.float32, torch.float64, torch.uint8, torch.int64, torch.bool)
    assert td["action_log_prob"].shape == (num_workers, num_steps)
    if td.get("recurrent_state_c", None) is not None:
        assert td["recurrent_state_h"].shape == td["recurrent_state_c"].shape
    if td.get("recurrent_state_h", None) is not None:
        assert td["recurrent_state_h"].ndim == 4


@given(td=rollouts(extra_starts=True))
def test_rollouts_with_extra_starts(td):
    done = td["next", "done"]
    # is_init still covers every step after a done one, and may hold more
    assert bool(td["is_init"][:, 1:][done[:, :-1]].all())


def test_extra_starts_do_happen():
    find(
        rollouts(extra_starts=True),
        lambda td: bool((td["is_init"][:, 1:] & ~td["next", "done"][:, :-1]).any()),
        settings=_FIND,
    )


@given(
    td=rollouts(
        keys=RolloutKeys(
            reward=("next", "agent", "reward"),
            state_value=("critic", "value"),
            next_state_value=("next", "critic", "value"),
            terminated=("next", "agent", "terminated"),
            truncated=("next", "agent", "truncated"),
            done=("next", "agent", "done"),
        ),
        with_is_init=True,
    )
)
def test_rollouts_follow_key_overrides(td):
    for key in [
        ("next", "agent", "reward"),
        ("critic", "value"),
        ("next", "critic", "value"),
        ("next", "agent", "done"),
        "is_init",
    ]:
        assert td.get(key, None) is not None, key
    assert td.get(("next", "reward"), None) is None
    assert td.get(("next", "done"), None) is None


@given(data=st.data())
def test_episode_ends_and_step_masks(data):
    num_workers = data.draw(st.integers(1, 4), label="W")
    num_steps = data.draw(st.integers(1, 10), label="T")
    terminated, truncated = data.draw(episode_ends(num_workers, num_steps), label="ends")
    assert terminated.shape == truncated.shape == (num_workers, num_steps, 1)
    assert not bool((terminated & truncated).any())
    start = data.draw(step_masks(num_workers, num_steps), label="start")
    assert start.shape == (num_workers, num_steps) and start.dtype == torch.bool
    assert bool(start[:, 0].all())


@given(
    length=sequence_lengths(),
    gamma=discounts(),
    action=action_specs(),
    recurrent=recurrent_specs(),
    observations=observation_specs(),
)
def test_small_strategies_stay_in_range(length, gamma, action, recurrent, observations):
    assert length is None or 1 <= length <= 12
    assert 0.0 <= gamma <= 1.0
    assert action.kind in ("discrete", "one_hot", "multi_discrete", "continuous")
    assert recurrent is None or (
        1 <= recurrent.num_layers <= 3 and recurrent.cell in ("lstm", "gru")
    )
    assert 1 <= len(observations) <= 3
    assert set(observations) <= set(OBSERVATION_KEYS)


def _has(td, key):
    return td.get(key, None) is not None


def test_rollouts_cover_the_promised_variety():
    # each kind of rollout the properties rely on can be drawn
    strategy = rollouts(with_is_init=None, with_done=None)
    for condition in (
        lambda td: _has(td, "recurrent_state_c"),
        lambda td: _has(td, "recurrent_state_h") and not _has(td, "recurrent_state_c"),
        lambda td: _has(td, "recurrent_state_h") and td["recurrent_state_h"].shape[2] >= 2,
        lambda td: not _has(td, "recurrent_state_h"),
        lambda td: any(
            _has(td, k) and td[k].dtype == torch.uint8 and td[k].ndim == 5 for k in OBSERVATION_KEYS
        ),
        lambda td: _has(td, ("obs", "camera")) or _has(td, ("obs", "joints")),
        lambda td: sum(_has(td, k) for k in OBSERVATION_KEYS) >= 2,
        lambda td: td["action"].dtype == torch.float32,
        lambda td: td["action"].dtype == torch.int64 and td["action"].ndim == 2,
        lambda td: td["action"].dtype == torch.int64 and td["action"].ndim == 3,
        lambda td: bool(td["next", "terminated"].any()) and bool(td["next", "truncated"].any()),
        lambda td: not _has(td, ("next", "done")),
        lambda td: _has(td, "is_init") and not bool(td["is_init"][:, 0].all()),
    ):
        find(strategy, condition, settings=_FIND)
