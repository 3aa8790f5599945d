"""The recurrent actor-critic: encoders per space, heads per action space, states."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rppo_td.agent import (
    RecurrentActorCritic,
    RecurrentPolicyModule,
    observation_leaves,
    observation_to_tensordict,
    recurrent_state_primer,
)

BOX = gym.spaces.Box(-1.0, 1.0, (3,), dtype=np.float32)
SPACES = {
    "box": BOX,
    "image_hwc": gym.spaces.Box(0, 255, (8, 8, 3), dtype=np.uint8),
    "image_chw": gym.spaces.Box(0, 255, (1, 10, 6), dtype=np.uint8),
    "discrete": gym.spaces.Discrete(4),
    "multi_discrete": gym.spaces.MultiDiscrete([2, 3]),
    "tuple": gym.spaces.Tuple((BOX, gym.spaces.Discrete(3))),
    "dict": gym.spaces.Dict({"pos": BOX, "img": gym.spaces.Box(0, 255, (6, 6, 1), dtype=np.uint8)}),
}
ACTIONS = {
    "discrete": gym.spaces.Discrete(3),
    "multi_discrete": gym.spaces.MultiDiscrete([2, 4, 3]),
    "box": gym.spaces.Box(-2.0, 2.0, (2,), dtype=np.float32),
}


def _batch(space: gym.Space, shape: tuple[int, ...]) -> TensorDict:
    space.seed(0)
    flat = int(np.prod(shape))
    samples = [space.sample() for _ in range(flat)]
    obs = gym.vector.utils.concatenate(
        space, samples, gym.vector.utils.create_empty_array(space, flat)
    )
    td = observation_to_tensordict(obs, observation_leaves(space), (flat,))
    return td.reshape(shape)


@pytest.mark.parametrize("obs_name", sorted(SPACES))
@pytest.mark.parametrize("act_name", sorted(ACTIONS))
@pytest.mark.parametrize("recurrence", ["lstm", "gru", "none"])
def test_act_and_evaluate_shapes(obs_name, act_name, recurrence):
    obs_space, act_space = SPACES[obs_name], ACTIONS[act_name]
    net = RecurrentActorCritic(obs_space, act_space, recurrence=recurrence, hidden_size=8)
    w, length = 3, 4
    out = net.act(_batch(obs_space, (w,)), net.initial_state(w), torch.ones(w, dtype=torch.bool))
    action_shape = (w,) if act_name == "discrete" else (w, act_space.shape[0])
    assert tuple(out.action.shape) == action_shape
    assert out.log_prob.shape == (w,)
    assert out.value.shape == (w, 1)
    assert len(out.state) == {"lstm": 2, "gru": 1, "none": 0}[recurrence]
    for s in out.state:
        assert s.shape == (w, 1, 16)
    actions = torch.stack([out.action] * length, dim=1)
    log_prob, entropy, value = net.evaluate(
        _batch(obs_space, (w, length)), net.initial_state(w), actions
    )
    assert log_prob.shape == entropy.shape == (w, length)
    assert value.shape == (w, length, 1)
    (log_prob.sum() + value.sum()).backward()


@pytest.mark.parametrize("recurrence", ["lstm", "gru"])
@pytest.mark.parametrize("shared", [True, False])
def test_sequence_evaluation_matches_step_by_step(recurrence, shared):
    torch.manual_seed(0)
    net = RecurrentActorCritic(
        BOX,
        ACTIONS["discrete"],
        recurrence=recurrence,
        hidden_size=8,
        num_layers=2,
        shared_critic=shared,
    )
    obs = _batch(BOX, (2, 5))
    state = tuple(torch.randn_like(s) for s in net.initial_state(2))
    start = state
    log_probs, values, actions = [], [], []
    no_reset = torch.zeros(2, dtype=torch.bool)
    for t in range(5):
        out = net.act(obs[:, t], state, no_reset)
        log_probs.append(out.log_prob)
        values.append(out.value)
        actions.append(out.action)
        state = out.state
    log_prob, _, value = net.evaluate(obs, start, torch.stack(actions, 1))
    torch.testing.assert_close(log_prob, torch.stack(log_probs, 1))
    torch.testing.assert_close(value, torch.stack(values, 1))


def test_is_init_resets_the_state():
    net = RecurrentActorCritic(BOX, ACTIONS["discrete"], hidden_size=8)
    obs = _batch(BOX, (2,))
    state = tuple(torch.randn_like(s) for s in net.initial_state(2))
    reset = net.act(obs, state, torch.tensor([True, True]), deterministic=True)
    zero = net.act(obs, net.initial_state(2), torch.tensor([False, False]), deterministic=True)
    for a, b in zip(reset.state, zero.state, strict=True):
        torch.testing.assert_close(a, b)


def test_deterministic_action_is_the_mode():
    net = RecurrentActorCritic(BOX, ACTIONS["box"], hidden_size=8)
    obs = _batch(BOX, (4,))
    init = torch.ones(4, dtype=torch.bool)
    a = net.act(obs, net.initial_state(4), init, deterministic=True).action
    b = net.act(obs, net.initial_state(4), init, deterministic=True).action
    torch.testing.assert_close(a, b)


def test_observation_leaves_keys():
    keys = [key for key, _ in observation_leaves(SPACES["tuple"])]
    assert keys == [("observation", "0"), ("observation", "1")]
    assert [key for key, _ in observation_leaves(BOX)] == ["observation"]


@pytest.mark.parametrize(
    ("space", "match"),
    [
        (gym.spaces.Text(5), "observation space"),
        (gym.spaces.Discrete(3, start=1), "does not start at 0.*make_env shifts"),
        (gym.spaces.MultiDiscrete([2, 3], start=[0, -1]), "does not start at 0"),
        (gym.spaces.MultiDiscrete([[2, 3], [3, 2]]), "must be 1-D.*make_env flattens"),
        (gym.spaces.Dict({}), "no leaves"),
        (gym.spaces.Box(0, 1, (0,)), "has no entries"),
    ],
)
def test_unsupported_observation_space(space, match):
    with pytest.raises(ValueError, match=match):
        RecurrentActorCritic(space, ACTIONS["discrete"])


@pytest.mark.parametrize(
    ("space", "match"),
    [
        (gym.spaces.Box(-1, 1, (2, 2)), "not supported.*make_env"),
        (gym.spaces.Discrete(3, start=1), "starts at 1.*make_env"),
        (gym.spaces.MultiDiscrete([3, 2], start=[1, -2]), r"start \[1, -2\].*make_env"),
        (gym.spaces.MultiBinary(3), "not supported.*make_env"),
        (gym.spaces.Box(0, 3, (2,), dtype=np.int64), "must be floating point"),
        (gym.spaces.Box(-1, 1, (0,)), "no entries"),
    ],
)
def test_unsupported_action_space(space, match):
    # make_env converts the convertible ones (tests/unit/test_spaces.py); built directly,
    # the agent refuses them instead of sampling actions outside the space
    with pytest.raises(ValueError, match=f"action space.*{match}"):
        RecurrentActorCritic(BOX, space)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"recurrence": "rnn"}, "recurrence"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"num_layers": 0}, "num_layers"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RecurrentActorCritic(BOX, ACTIONS["discrete"], **kwargs)


def test_policy_module_and_primer():
    net = RecurrentActorCritic(BOX, ACTIONS["discrete"], hidden_size=8)
    module = RecurrentPolicyModule(net)
    assert "is_init" in module.in_keys
    assert ("next", "recurrent_state_c") in module.out_keys
    td = TensorDict(
        {
            "observation": torch.zeros(2, 5, 3),
            "is_init": torch.ones(2, 5, 1, dtype=torch.bool),
            "recurrent_state_h": torch.zeros(2, 5, 1, 16),
            "recurrent_state_c": torch.zeros(2, 5, 1, 16),
        },
        batch_size=[2, 5],
    )
    module(td)
    assert td["action"].shape == (2, 5)
    assert td["state_value"].shape == (2, 5, 1)
    assert td["next", "recurrent_state_h"].shape == (2, 5, 1, 16)
    primer = recurrent_state_primer(net)
    assert set(primer.primers.keys()) == {"recurrent_state_h", "recurrent_state_c"}
    with pytest.raises(ValueError, match="no recurrent state"):
        recurrent_state_primer(RecurrentActorCritic(BOX, ACTIONS["discrete"], recurrence="none"))


def test_observation_normalizer_running_statistics():
    from rppo_td.agent._normalizer import ObservationNormalizer

    norm = ObservationNormalizer(observation_leaves(SPACES["tuple"]))
    assert norm.keys == [("observation", "0")]  # the Discrete leaf passes through
    data = torch.randn(50, 3, dtype=torch.float64) * 3 + 1
    for chunk in data.split([20, 30]):
        norm.update(TensorDict({"observation": {"0": chunk.float()}}, [chunk.shape[0]]))
    torch.testing.assert_close(norm.mean_0, data.mean(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(norm.var_0, data.var(0, unbiased=False), rtol=1e-4, atol=1e-4)
    td = TensorDict(
        {"observation": {"0": data.float(), "1": torch.zeros(50, dtype=torch.long)}}, [50]
    )
    out = norm(td)
    torch.testing.assert_close(out["observation", "0"].mean(0), torch.zeros(3), atol=1e-4, rtol=0)
    assert out["observation", "1"] is td["observation", "1"]
    assert td["observation", "0"].dtype == torch.float32  # input left as it was
