"""Tests of the public test kit, rppo_td.testing: what its strategies draw is well formed and
covers what they promise, parts given as strategies are honoured, hypothesis stays optional, and
the project imports the kit from the package (never tests/ through sys.path)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from rppo_td import RolloutKeys
from rppo_td.testing.strategies import (
    OBSERVATION_KEYS,
    ActionSpec,
    FeatureSpec,
    RecurrentSpec,
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


@given(td=rollouts(with_done=st.booleans()))
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


@given(td=rollouts(with_is_init=st.booleans()))
def test_rollouts_relate_their_keys_as_a_collector_does(td):
    # ("next", key) was drawn apart from key[t + 1], and start states at random: GAE at
    # lmbda = 1 then differed from the Monte-Carlo returns on the kit's own data
    from rppo_td.testing.reference import reference_gae, reference_monte_carlo_returns

    done = td["next", "done"].squeeze(-1)
    going_on = ~done[:, :-1]
    present, _ = _observation_keys(td)
    for key in [*present, "state_value"]:
        nested = ("next", *(key if isinstance(key, tuple) else (key,)))
        assert torch.equal(td[nested][:, :-1][going_on], td[key][:, 1:][going_on]), key
    starts = torch.zeros_like(done)
    starts[:, 1:] = done[:, :-1]
    if td.get("is_init", None) is not None:
        starts |= td["is_init"].squeeze(-1)
    for key in ("recurrent_state_h", "recurrent_state_c"):
        if td.get(key, None) is not None:
            assert td[key][starts].eq(0).all(), key
    _, target = reference_gae(td, 0.9, 1.0)
    assert torch.allclose(target, reference_monte_carlo_returns(td, 0.9), atol=1e-9)


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
        with_is_init=st.just(True),
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
    terminated, truncated = data.draw(episode_ends(num_workers, num_steps, allow_both=True))
    assert terminated.shape == truncated.shape == (num_workers, num_steps, 1)
    start = data.draw(step_masks(num_workers, num_steps), label="start")
    assert start.shape == (num_workers, num_steps) and start.dtype == torch.bool
    assert bool(start[:, 0].all())
    # no steps: an empty mask (an IndexError from inside the strategy)
    assert data.draw(step_masks(num_workers, 0), label="no steps").shape == (num_workers, 0)


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
    strategy = rollouts(with_done=st.booleans())
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


# --- parts given as strategies (xarray.testing.strategies' model) -------------------------
@given(
    td=rollouts(
        num_workers=st.just(3),
        num_steps=st.just(5),
        observations=st.just({("obs", "joints"): FeatureSpec((2,), torch.float64)}),
        actions=st.just(ActionSpec("continuous", (2,), torch.float32)),
        recurrent=st.just(RecurrentSpec("gru", 2, 3)),
        with_done=st.just(False),
        with_is_init=st.just(False),
    )
)
def test_fixed_parts_are_honoured(td):
    assert td.batch_size == (3, 5)
    assert td["obs", "joints"].shape == (3, 5, 2) and td["obs", "joints"].dtype == torch.float64
    assert td["next", "obs", "joints"].shape == (3, 5, 2)
    assert td.get("observation", None) is None
    assert td["action"].shape == (3, 5, 2) and td["action"].dtype == torch.float32
    assert td["recurrent_state_h"].shape == (3, 5, 2, 3)
    assert td.get("recurrent_state_c", None) is None
    assert td.get(("next", "done"), None) is None and td.get("is_init", None) is None


@given(td=rollouts(num_workers=st.integers(5, 6), num_steps=st.sampled_from([2, 20])))
def test_size_strategies_are_drawn_from(td):
    assert td.batch_size[0] in (5, 6) and td.batch_size[1] in (2, 20)


@given(td=rollouts(recurrent=st.none(), with_is_init=st.just(True), with_done=st.booleans()))
def test_no_recurrent_state_and_is_init_always(td):
    assert td.get("recurrent_state_h", None) is None
    assert td["is_init"].shape == (*td.batch_size, 1)


def test_both_flags_on_one_step_are_drawn_when_allowed():
    # gymnasium allows a time limit on a terminal step; the default never draws it
    def both(td):
        return bool((td["next", "terminated"] & td["next", "truncated"]).any())

    td = find(rollouts(allow_both=True), both, settings=_FIND)
    assert torch.equal(td["next", "done"], td["next", "terminated"] | td["next", "truncated"])
    ends = episode_ends(2, 3, end_rate=0, allow_both=True)
    find(ends, lambda flags: bool((flags[0] & flags[1]).any()), settings=_FIND)


def test_what_the_checks_must_not_refuse():
    # numpy's bools and ints, any mapping, no observation keys, more keys than the pool:
    # each worked before the checks, and works
    from types import MappingProxyType

    from rppo_td.testing.reference import reference_minibatch_sizes

    spec = MappingProxyType({"observation": FeatureSpec((2,), torch.float32)})
    strategy = rollouts(
        with_done=st.sampled_from(np.array([True, False])),
        with_is_init=st.just(np.True_),
        observations=st.just(spec),
        extra_starts=np.False_,
    )
    td = find(strategy, lambda td: True)
    assert td["observation"].shape == (*td.batch_size, 2) and td.get("is_init") is not None
    assert find(rollouts(observations=observation_specs(0, 0)), lambda td: True) is not None
    assert len(find(observation_specs(max_keys=8), lambda obs: len(obs) == 5)) == 5
    for flag in (np.False_, 0, 1):
        recurrent_specs(flag), sequence_lengths(5, flag)
    assert reference_minibatch_sizes([3, 2, 4], np.int64(2)) == [2, 1]


@pytest.mark.parametrize(
    ("strategy", "error", "message"),
    [
        (
            dict(num_workers=st.just(0)),
            ValueError,
            "num_workers strategy must draw ints >= 1, drew 0",
        ),
        # 2.0 was refused as "num_workers must be an int >= 0" (episode_ends' bound)
        (
            dict(num_steps=st.just(2.0)),
            ValueError,
            "num_steps strategy must draw ints >= 1, drew 2.0",
        ),
        # a str failed with an AttributeError inside the strategy; 0 was taken as False
        (
            dict(recurrent=st.just("lstm")),
            TypeError,
            "recurrent strategy must draw a RecurrentSpec",
        ),
        (dict(actions=st.just("discrete")), TypeError, "actions strategy must draw an ActionSpec"),
        (dict(with_done=st.just("no")), TypeError, "with_done strategy must draw True or False"),
        (dict(observations=st.just({"observation": (3,)})), TypeError, "a FeatureSpec for"),
    ],
)
def test_wrong_draws_are_refused_by_name(strategy, error, message):
    with pytest.raises(error, match=message):
        find(rollouts(**strategy), lambda td: True)


@pytest.mark.parametrize(
    ("strategy", "error", "message"),
    [
        # end_rate -1 made every step a truncation silently; -2 and "x" failed in hypothesis
        # and in an addition, naming nothing
        (lambda: rollouts(end_rate=-1), ValueError, "end_rate must be an int >= 0, got -1"),
        (lambda: rollouts(end_rate="x"), ValueError, "end_rate must be an int >= 0, got 'x'"),
        (lambda: rollouts(num_workers=2), TypeError, r"num_workers must be a hypothesis"),
        (lambda: rollouts(extra_starts="yes"), TypeError, "extra_starts must be True or False"),
        (lambda: rollouts(allow_both="yes"), TypeError, "allow_both must be True or False"),
        # each failed in hypothesis, naming min_size / max_size (or, for 6 keys of 5, nothing)
        (lambda: observation_specs(-1), ValueError, "min_keys must be an int >= 0, got -1"),
        (lambda: observation_specs(3, 1), ValueError, "max_keys must be an int >= 3, got 1"),
        (lambda: observation_specs(6, 6), ValueError, "min_keys must be at most 5"),
        # a str was taken as True
        (lambda: recurrent_specs(allow_none="no"), TypeError, "allow_none must be True or False"),
        (lambda: sequence_lengths(allow_none="no"), TypeError, "allow_none must be True or False"),
        (lambda: episode_ends(-1, 3), ValueError, "num_workers must be an int >= 0, got -1"),
        (
            lambda: episode_ends(2, 3, end_rate=-2),
            ValueError,
            "end_rate must be an int >= 0, got -2",
        ),
        (lambda: step_masks(2, 1.5), ValueError, "num_steps must be an int >= 0, got 1.5"),
        (
            lambda: sequence_lengths(max_length=0),
            ValueError,
            "max_length must be an int >= 1, got 0",
        ),
    ],
)
def test_bad_parameters_are_refused_by_name(strategy, error, message):
    # when the strategy is built, on the caller's line, not when hypothesis draws from it
    with pytest.raises(error, match=message):
        strategy()


# --- packaging: hypothesis optional, no tests/ on sys.path ---------------------------------
ROOT = Path(__file__).resolve().parents[2]


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_import_rppo_td_does_not_import_hypothesis_or_the_kit():
    result = _python(
        "import sys, rppo_td; "
        "assert 'hypothesis' not in sys.modules, 'hypothesis imported'; "
        "assert 'rppo_td.testing' not in sys.modules, 'rppo_td.testing imported'"
    )
    assert result.returncode == 0, result.stderr


def test_kit_without_hypothesis_names_the_test_extra():
    # sys.modules[name] = None makes `import name` raise ImportError, as if not installed
    result = _python(
        "import sys; sys.modules['hypothesis'] = None\n"
        "try:\n    import rppo_td.testing\n"
        "except ImportError as error:\n    print(error)\n"
        "else:\n    raise SystemExit('imported')"
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'rppo_td[test]'" in result.stdout


def test_tests_modules_reexport_the_kit():
    import rppo_td.testing.reference as reference
    import rppo_td.testing.strategies as strategies
    import tests.reference
    import tests.strategies

    assert tests.strategies.rollouts is strategies.rollouts
    assert tests.reference.reference_gae is reference.reference_gae
    assert set(tests.reference.__all__) == set(reference.__all__)


def test_nothing_puts_tests_on_sys_path():
    # --env module:EnvId imports the module from the current directory too, as python -m
    # does: the one sys.path change the library makes, and never of tests
    allowed = {"rppo_td/envs/_make.py": "sys.path.append(here)"}
    offenders = []
    for folder in ("benchmarks", "examples", "rppo_td", "docs"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            name = str(path.relative_to(ROOT))
            if name in allowed:
                assert allowed[name] in text and "tests" not in text
                text = text.replace("sys.path", "")
            if "sys.path" in text or "tests.reference" in text or "tests.strategies" in text:
                offenders.append(name)
    assert offenders == []


# --- the references refuse what the library refuses ---------------------------------------
def test_references_refuse_what_the_library_refuses():
    from rppo_td.functional import balanced_minibatches
    from rppo_td.testing.reference import (
        reference_chunk_ids,
        reference_minibatch_sizes,
        reference_pad,
        reference_sequences,
    )

    # 5 groups of 3 sequences gave [-1, 1, 1, 1, 1]; 0 a ZeroDivisionError
    for m in (5, 0, 2.0, True):
        with pytest.raises(ValueError, match=r"num_minibatches must be"):
            balanced_minibatches(torch.ones(3, dtype=torch.int64), m)
        with pytest.raises(ValueError, match=r"num_minibatches must be an int in \[1, 3\]"):
            reference_minibatch_sizes([1, 1, 1], m)
    td = find(rollouts(), lambda td: True)
    # 0 gave an empty sequence; -1 and 2.5 whole fragments
    for length in (0, -1, 2.5):
        for reference in (reference_sequences, reference_chunk_ids, reference_pad):
            with pytest.raises(
                ValueError, match=f"sequence_length must be an int >= 1 or None, got {length}"
            ):
                reference(td, length)
