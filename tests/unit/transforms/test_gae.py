"""Unit tests of rppo_td/transforms/_gae.py: the GAE transform."""

from __future__ import annotations

import re

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.modules import set_recurrent_mode

from rppo_td import GAE, GAEEstimator, RolloutKeys
from rppo_td.functional import generalized_advantage_estimate
from rppo_td.testing.reference import reference_gae
from tests.unit._data import small_rollout
from tests.unit.objectives._nets import make_agent, step_rollout


def _message(info):
    """A raised error's message (KeyError's str() would be the repr)."""
    return info.value.args[0]


def _golden_rollout():
    # the hand-computed case of tests/unit/functional/test_gae.py: row 0 terminates at t=1,
    # row 1 is truncated at t=1; gamma = lmbda = 0.5
    def col(*rows):
        return torch.tensor(rows).unsqueeze(-1)

    return TensorDict(
        {
            "state_value": col([0.5, 1.0, 2.0], [1.0, 2.0, 0.0]),
            "next": {
                "reward": col([1.0, 2.0, 3.0], [0.0, 1.0, -1.0]),
                "state_value": col([1.0, 4.0, 2.0], [2.0, 6.0, 4.0]),
                "terminated": col([False, True, False], [False, False, False]),
                "truncated": col([False, False, False], [False, True, False]),
            },
        },
        batch_size=[2, 3],
    )


def test_golden_through_the_transform_without_done_key():
    td = _golden_rollout()
    out = GAE(gamma=0.5, lmbda=0.5)(td)
    assert out is td  # written in place, by design
    torch.testing.assert_close(
        out["advantage"].squeeze(-1), torch.tensor([[1.25, 1.0, 2.0], [0.5, 2.0, 1.0]])
    )
    torch.testing.assert_close(
        out["value_target"].squeeze(-1), torch.tensor([[1.75, 2.0, 4.0], [1.5, 4.0, 1.0]])
    )


@pytest.mark.parametrize("seed", range(4))
def test_an_episode_start_that_only_is_init_marks_ends_the_sum_as_a_truncation(seed):
    """A collector that resets at each batch starts episodes that is_init marks without a done
    before them. GAE (the transform and the estimator) cuts there, as EpisodeSplitter does,
    and bootstraps: the same advantages as with the step before flagged truncated."""
    from rppo_td import EpisodeSplitter

    td = small_rollout(num_workers=3, num_steps=9, seed=seed)
    g = torch.Generator().manual_seed(seed)
    unflagged = torch.rand(3, 9, 1, generator=g) < 0.3
    unflagged[:, 0] = False
    td["is_init"] = td["is_init"] | unflagged
    td["next", "done"] = td["next", "terminated"] | td["next", "truncated"]
    flagged = td.clone()
    cut = torch.zeros_like(unflagged)
    cut[:, :-1] = unflagged[:, 1:]
    flagged["next", "truncated"] = flagged["next", "truncated"] | cut
    flagged["next", "done"] = flagged["next", "done"] | cut
    expected = GAE(gamma=0.9, lmbda=0.8)(flagged)["advantage"]
    reference, _ = reference_gae(td, 0.9, 0.8)
    for out in (
        GAE(gamma=0.9, lmbda=0.8)(td.clone()),
        GAEEstimator(gamma=0.9, lmbda=0.8, value_network=None)(td.clone()),
    ):
        torch.testing.assert_close(out["advantage"], expected)
        torch.testing.assert_close(out["advantage"].double(), reference)
    # no sum crosses one of the splitter's episode starts
    episode = EpisodeSplitter()(td.clone())["episode_id"]
    starts = torch.ones_like(unflagged.squeeze(-1))
    starts[:, 1:] = episode[:, 1:] != episode[:, :-1]
    assert torch.equal(
        starts[:, 1:], (td["is_init"] | torch.roll(td["next", "done"], 1, 1)).squeeze(-1)[:, 1:]
    )


def test_done_key_is_read_when_present():
    golden = GAE(gamma=0.5, lmbda=0.5)(_golden_rollout())
    # without a truncated key, done alone says where the sums stop: row 1's cut at t=1
    td = _golden_rollout().exclude(("next", "truncated"))
    td["next", "done"] = td["next", "terminated"].clone()
    td["next", "done"][1, 1] = True
    out = GAE(gamma=0.5, lmbda=0.5)(td)
    torch.testing.assert_close(out["advantage"], golden["advantage"])
    # no cut at row 1, t=1: delta = 2.0 now continues into A[2] = 1.0: 2.0 + 0.25 * 1.0
    td["next", "done"][1, 1] = False
    out = GAE(gamma=0.5, lmbda=0.5)(td)
    assert float(out["advantage"][1, 1]) == pytest.approx(2.25)


@pytest.mark.parametrize("flag", ["terminated", "truncated"])
def test_flag_without_done_is_refused(flag):
    # a done key that misses an end of terminated or truncated: GAE would sum across it
    td = _golden_rollout()
    td["next", "done"] = td["next", "terminated"] | td["next", "truncated"]
    td["next", "done"][1 if flag == "truncated" else 0, 1] = False
    with pytest.raises(ValueError) as info:
        GAE(gamma=0.5, lmbda=0.5)(td)
    assert _message(info).startswith(
        f"('next', {flag!r}) is True where ('next', 'done') is False (at 1 step, the first at "
        f"index [{1 if flag == 'truncated' else 0}, 1, 0])"
    )
    assert "advantage" not in td


def test_nested_key_overrides():
    keys = RolloutKeys(
        reward=("next", "agent", "reward"),
        terminated=("next", "agent", "terminated"),
        truncated=("next", "agent", "truncated"),
        done=("next", "agent", "done"),
        state_value=("critic", "value"),
        next_state_value=("next", "critic", "value"),
        advantage=("loss", "advantage"),
        value_target=("loss", "target"),
    )
    plain = _golden_rollout()
    td = TensorDict(
        {
            "critic": {"value": plain["state_value"]},
            "next": {
                "agent": {
                    "reward": plain["next", "reward"],
                    "terminated": plain["next", "terminated"],
                    "truncated": plain["next", "truncated"],
                },
                "critic": {"value": plain["next", "state_value"]},
            },
        },
        batch_size=[2, 3],
    )
    out = GAE(gamma=0.5, lmbda=0.5, keys=keys)(td)
    expected = GAE(gamma=0.5, lmbda=0.5)(plain)
    assert torch.equal(out["loss", "advantage"], expected["advantage"])
    assert torch.equal(out["loss", "target"], expected["value_target"])
    assert "advantage" not in out


def test_value_network_fills_missing_values():
    td = small_rollout()
    linear = torch.nn.Linear(3, 1)
    network = TensorDictModule(linear, in_keys=["observation"], out_keys=["state_value"])
    without = td.exclude("state_value", ("next", "state_value"))
    out = GAE(gamma=0.9, lmbda=0.8, value_network=network)(without)
    with torch.no_grad():
        value, next_value = linear(td["observation"]), linear(td["next", "observation"])
    assert torch.equal(out["state_value"], value)
    assert torch.equal(out["next", "state_value"], next_value)
    expected, _ = generalized_advantage_estimate(
        td["next", "reward"],
        value,
        next_value,
        td["next", "terminated"],
        td["next", "done"],
        gamma=0.9,
        lmbda=0.8,
    )
    torch.testing.assert_close(out["advantage"], expected)
    assert not out["advantage"].requires_grad


@pytest.mark.parametrize("recurrent", [False, True], ids=["sequential", "recurrent"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_recurrent_value_network_matches_the_loop_oracle(kind, recurrent):
    # step_rollout steps the network one step at a time: V(o_t | h_t), V(o_{t+1} | h_{t+1})
    agent = make_agent(kind)
    rollout, value, next_value = step_rollout(agent, W=3, T=12)
    oracle = rollout.clone()
    oracle["state_value"], oracle["next", "state_value"] = value, next_value
    advantage, target = reference_gae(oracle, 0.9, 0.8)
    before = rollout.clone()
    with set_recurrent_mode(recurrent):
        out = GAE(gamma=0.9, lmbda=0.8, value_network=agent.critic)(rollout)
    assert out is rollout
    torch.testing.assert_close(out["state_value"], value, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["next", "state_value"], next_value, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["advantage"].double(), advantage, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["value_target"].double(), target, atol=1e-5, rtol=1e-5)
    # only the four keys are added: the stored ("next", "recurrent_state_*") stay as they were
    added = {"advantage", "value_target", "state_value", ("next", "state_value")}
    assert set(out.keys(True, True)) == set(before.keys(True, True)) | added
    assert (out.exclude(*added) == before).all()
    # the same numbers as the value estimator: one value-filling code path for both
    with set_recurrent_mode(recurrent):
        estimated = GAEEstimator(gamma=0.9, lmbda=0.8, value_network=agent.critic)(before)
    torch.testing.assert_close(out["advantage"], estimated["advantage"])


def test_calling_the_critic_on_the_rollout_in_recurrent_mode_is_wrong():
    """What the transform avoids: ``next`` run across resets, stored states overwritten."""
    agent = make_agent("lstm")
    rollout, _, next_value = step_rollout(agent, W=3, T=12)
    stored = rollout["next", "recurrent_state_h"].clone()
    with set_recurrent_mode(True), torch.no_grad():
        naive = rollout.clone()
        agent.critic(naive)
        assert not torch.equal(naive["next", "recurrent_state_h"], stored)
        assert (
            agent.critic(rollout["next"].clone())["state_value"] - next_value
        ).abs().max() > 1e-3
        out = GAE(gamma=0.9, lmbda=0.8, value_network=agent.critic)(rollout)
    torch.testing.assert_close(out["next", "state_value"], next_value, atol=1e-5, rtol=1e-5)
    assert torch.equal(out["next", "recurrent_state_h"], stored)


@pytest.mark.parametrize("recurrent", [False, True], ids=["sequential", "recurrent"])
def test_recurrent_value_network_fills_only_the_missing_value(recurrent):
    agent = make_agent("gru")
    rollout, value, next_value = step_rollout(agent, W=2, T=8)
    sentinel = torch.full_like(value, 3.0)
    rollout["state_value"] = sentinel.clone()
    with set_recurrent_mode(recurrent):
        out = GAE(gamma=0.9, lmbda=0.8, value_network=agent.critic)(rollout)
    assert torch.equal(out["state_value"], sentinel)
    torch.testing.assert_close(out["next", "state_value"], next_value, atol=1e-5, rtol=1e-5)


def test_value_network_not_called_when_values_present():
    td = small_rollout()
    calls = []

    def value(observation):
        calls.append(1)
        return observation[..., :1]

    network = TensorDictModule(value, in_keys=["observation"], out_keys=["state_value"])
    before = td["state_value"].clone()
    GAE(gamma=0.9, lmbda=0.8, value_network=network)(td)
    assert calls == []
    assert torch.equal(td["state_value"], before)


def test_value_network_needs_matching_next_key():
    keys = RolloutKeys(next_state_value=("next", "other_value"))
    network = TensorDictModule(
        torch.nn.Linear(3, 1), in_keys=["observation"], out_keys=["state_value"]
    )
    td = small_rollout().exclude(("next", "state_value"))
    with pytest.raises(KeyError) as info:
        GAE(gamma=0.9, lmbda=0.8, value_network=network, keys=keys)(td)
    assert "('next', 'other_value')" in _message(info)


def _broken(mutate):
    td = small_rollout()
    mutate(td)
    return td


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda td: td.__setitem__(("next", "done"), td["next", "done"].float()),
            "('next', 'done') must have dtype torch.bool, got torch.float32",
        ),
        (
            lambda td: td.__setitem__(("next", "terminated"), td["next", "terminated"].long()),
            "('next', 'terminated') must have dtype torch.bool, got torch.int64",
        ),
        (
            lambda td: td["next"].set("reward", torch.zeros(2, 5), inplace=False),
            "('next', 'reward') must have shape [2, 5, 1], got [2, 5]",
        ),
        (
            lambda td: td.set("state_value", torch.zeros(2, 5)),
            "'state_value' must have shape [2, 5, 1], got [2, 5]",
        ),
        (
            lambda td: td.set(("next", "reward"), td["next", "reward"].long()),
            "('next', 'reward') must be a floating-point tensor, got torch.int64",
        ),
        (
            lambda td: td["next", "reward"].__setitem__((0, 2, 0), float("nan")),
            "('next', 'reward') must be finite, found NaN or inf",
        ),
        (
            lambda td: td["state_value"].__setitem__((1, 0, 0), float("inf")),
            "'state_value' must be finite, found NaN or inf",
        ),
        (
            lambda td: td["next", "state_value"].__setitem__((1, 4, 0), -float("inf")),
            "('next', 'state_value') must be finite, found NaN or inf",
        ),
    ],
)
def test_bad_inputs_name_key_expected_and_actual(mutate, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        GAE(gamma=0.9, lmbda=0.8)(_broken(mutate))


def test_wrong_batch_dims():
    td = small_rollout()[0]
    with pytest.raises(
        ValueError,
        match=re.escape(
            "GAE expects a rollout with batch dims [W, T] (worker, time), got batch size [5]"
        ),
    ):
        GAE(gamma=0.9, lmbda=0.8)(td)
    with pytest.raises(ValueError, match=re.escape("got batch size [2, 5, 1]")):
        GAE(gamma=0.9, lmbda=0.8)(small_rollout().unsqueeze(-1))


@pytest.mark.parametrize(
    "key", [("next", "reward"), "state_value", ("next", "state_value"), ("next", "terminated")]
)
def test_missing_keys(key):
    with pytest.raises(KeyError) as info:
        GAE(gamma=0.9, lmbda=0.8)(small_rollout().exclude(key))
    assert _message(info).startswith(f"key {key!r} is missing")


def test_needs_done_or_truncated():
    td = small_rollout().exclude(("next", "done"), ("next", "truncated"))
    with pytest.raises(KeyError) as info:
        GAE(gamma=0.9, lmbda=0.8)(td)
    assert "('next', 'done')" in _message(info) and "('next', 'truncated')" in _message(info)
    td = small_rollout().exclude(("next", "done"))
    td["next", "truncated"] = td["next", "truncated"].float()
    with pytest.raises(
        ValueError,
        match=re.escape("('next', 'truncated') must have dtype torch.bool, got torch.float32"),
    ):
        GAE(gamma=0.9, lmbda=0.8)(td)


def test_non_tensor_leaf():
    td = small_rollout().exclude(("next", "reward"))
    td.set_non_tensor(("next", "reward"), "one")
    with pytest.raises(
        ValueError, match=re.escape("key ('next', 'reward') must hold a tensor, got NonTensorData")
    ):
        GAE(gamma=0.9, lmbda=0.8)(td)


def test_constructor_checks():
    with pytest.raises(ValueError, match=re.escape("gamma must be in [0, 1], got 1.01")):
        GAE(gamma=1.01, lmbda=0.9)
    with pytest.raises(ValueError, match=re.escape("lmbda must be in [0, 1], got -0.5")):
        GAE(gamma=0.9, lmbda=-0.5)
    with pytest.raises(TypeError, match="keys must be a RolloutKeys, got dict"):
        GAE(gamma=0.9, lmbda=0.9, keys={"reward": "r"})
