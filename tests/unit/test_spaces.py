"""Env spaces the agent is built from: offsets, flattening, and clear refusals.

``SpaceEnv`` (registered as ``rppo_td_test/Spaces-v0``, spaces passed as ``gym.make``
kwargs) asserts that every action it receives lies in its action space, and records them.
The agent is built from ``make_env``'s spaces and the actions come from it through the
library's own rollout loop (``VectorCollector`` over ``make_vector_env``), as in training.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from rppo_td.envs import make_env, make_vector_env
from rppo_td.envs._checks import EnvChecker
from rppo_td.modules import RecurrentActorCritic, RecurrentPolicy, observation_leaves
from rppo_td.train._vector_collector import VectorCollector

ENV_ID = "rppo_td_test/Spaces-v0"
BOX = gym.spaces.Box(-1.0, 1.0, (3,), dtype=np.float32)


class SpaceEnv(gym.Env):
    """Random observations from ``observation_space``; episodes of 5 steps (a termination)."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space) -> None:
        self.observation_space = observation_space
        self.action_space = action_space
        self.actions: list = []
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        return self.observation_space.sample(), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise AssertionError(f"action {action!r} is outside {self.action_space}")
        self.actions.append(action)
        self.t += 1
        return self.observation_space.sample(), 1.0, self.t >= 5, False, {}


class CountingEnv(gym.Env):
    """Discrete(4, start=10) observations ``10 + t % 4``; 6-step episodes."""

    observation_space = gym.spaces.Discrete(4, start=10)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return 10, {}

    def step(self, action):
        self.t += 1
        return 10 + self.t % 4, 0.0, self.t >= 6, False, {}


for _id, _entry in [(ENV_ID, SpaceEnv), ("rppo_td_test/Counting-v0", CountingEnv)]:
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry)


def _train_steps(observation_space: gym.Space, action_space: gym.Space) -> tuple[list, dict]:
    """Two rollouts of the agent built from make_env's spaces; the actions each env got."""
    spaces = {"observation_space": observation_space, "action_space": action_space}
    single = make_env(ENV_ID, **spaces)
    agent = RecurrentActorCritic(single.observation_space, single.action_space, hidden_size=8)
    env = make_vector_env(ENV_ID, 3, **spaces)
    collector = VectorCollector(
        env, RecurrentPolicy(agent), leaves=agent.leaves, frames_per_batch=3 * 12, seed=0
    )
    rollout = collector.rollout()
    collector.rollout()
    assert torch.isfinite(rollout["state_value"]).all()
    actions = [a for sub in env.envs for a in sub.unwrapped.actions]
    return actions, {"obs": single.observation_space, "action": single.action_space}


@pytest.mark.parametrize(
    ("action_space", "seen"),
    [
        (gym.spaces.MultiDiscrete([3, 4], start=[-1, 2]), gym.spaces.MultiDiscrete([3, 4])),
        (gym.spaces.Discrete(3, start=-2), gym.spaces.Discrete(3)),
        (gym.spaces.MultiDiscrete([[2, 3], [4, 2]], start=[[1, 0], [0, -3]]), None),
        (gym.spaces.MultiBinary((2, 2)), gym.spaces.MultiDiscrete([2, 2, 2, 2])),
        (gym.spaces.MultiBinary(3), gym.spaces.MultiDiscrete([2, 2, 2])),
        (gym.spaces.Box(-1.0, 1.0, (2, 2), dtype=np.float32), None),
        (gym.spaces.Box(-1.0, 1.0, (), dtype=np.float32), None),
        (gym.spaces.Box(-np.inf, np.inf, (2,), dtype=np.float32), None),
        (gym.spaces.Box(np.array([0.0, -np.inf]), np.array([1.0, 5.0]), dtype=np.float64), None),
    ],
)
def test_actions_reach_the_env_inside_its_space(action_space, seen):
    actions, spaces = _train_steps(BOX, action_space)
    assert len(actions) == 2 * 12 * 3
    assert all(action_space.contains(a) for a in actions)  # SpaceEnv also asserts it
    if seen is not None:
        assert spaces["action"] == seen
    else:  # flattened: what the agent samples is 1-D
        assert len(spaces["action"].shape) == 1


def test_every_start_is_used():
    # actions cover the env's whole shifted range, not 0..n-1
    space = gym.spaces.MultiDiscrete([3, 2], start=[5, -2])
    actions = np.stack(_train_steps(BOX, space)[0])
    assert set(actions[:, 0]) <= {5, 6, 7} and set(actions[:, 1]) <= {-2, -1}
    assert actions.min(0).tolist() == [5, -2]


def test_discrete_observations_with_a_start_are_offset():
    env = make_env("rppo_td_test/Counting-v0")
    assert env.observation_space == gym.spaces.Discrete(4)
    obs, _ = env.reset(seed=0)
    assert obs == 0
    for t in range(1, 6):
        obs, *_ = env.step(0)
        assert obs == t % 4
    vector = make_vector_env("rppo_td_test/Counting-v0", 2)
    assert vector.single_observation_space == gym.spaces.Discrete(4)
    vector.reset(seed=0)
    for _ in range(6):
        obs, _, terminated, _, info = vector.step(np.zeros(2, dtype=np.int64))
    assert terminated.all()
    assert obs.tolist() == [0, 0]  # the reset observations, shifted
    assert [int(o) for o in info["final_obs"]] == [6 % 4] * 2  # the final ones, shifted


@pytest.mark.parametrize(
    "observation_space",
    [
        gym.spaces.Discrete(5, start=-2),
        gym.spaces.MultiDiscrete([3, 4], start=[2, -1]),
        gym.spaces.MultiDiscrete([[2, 3], [3, 2]]),
        gym.spaces.Dict({"cue": gym.spaces.Discrete(3, start=1), "pos": BOX}),
        gym.spaces.Tuple((gym.spaces.MultiDiscrete([2, 2], start=[1, 1]), BOX)),
        gym.spaces.MultiBinary((2, 3)),
        gym.spaces.Box(-np.inf, np.inf, (2, 2), dtype=np.float32),
        gym.spaces.Box(0, 10, (3,), dtype=np.int64),
    ],
)
def test_observation_spaces_encode_from_zero(observation_space):
    _, spaces = _train_steps(observation_space, gym.spaces.Discrete(2))
    for _, leaf in observation_leaves(spaces["obs"]):
        assert not np.any(getattr(leaf, "start", 0))
        assert not isinstance(leaf, gym.spaces.MultiDiscrete) or leaf.nvec.ndim == 1


def test_multidiscrete_observation_offset_values():
    space = gym.spaces.MultiDiscrete([3, 4], start=[2, -1])
    env = make_env(ENV_ID, observation_space=space, action_space=gym.spaces.Discrete(2))
    obs, _ = env.reset(seed=0)
    raw = env.unwrapped.observation_space
    assert env.observation_space == gym.spaces.MultiDiscrete([3, 4])
    assert env.observation_space.contains(obs)
    assert raw is space


@pytest.mark.parametrize(
    ("observation_space", "action_space", "message"),
    [
        (BOX, gym.spaces.Box(0, 3, (2,), dtype=np.int64), "Box actions must be floating point"),
        (BOX, gym.spaces.Box(-1, 1, (0,), dtype=np.float32), "has no entries"),
        (BOX, gym.spaces.MultiDiscrete(np.zeros(0, dtype=np.int64)), "has no entries"),
        (BOX, gym.spaces.Tuple((gym.spaces.Discrete(2),)), "is not supported"),
        (BOX, gym.spaces.Dict({"a": gym.spaces.Discrete(2)}), "is not supported"),
        (BOX, gym.spaces.Text(3), "is not supported"),
        (gym.spaces.Dict({}), gym.spaces.Discrete(2), "has no entries"),
        (gym.spaces.Tuple(()), gym.spaces.Discrete(2), "has no entries"),
        (gym.spaces.Dict({"e": gym.spaces.Dict({})}), gym.spaces.Discrete(2), "has no entries"),
        (gym.spaces.Box(0, 1, (0,)), gym.spaces.Discrete(2), "has no entries (shape (0,))"),
        (gym.spaces.Dict({"a": BOX, "z": gym.spaces.Box(0, 1, (3, 0))}), None, "has no entries"),
        (gym.spaces.Text(5), gym.spaces.Discrete(2), "is not supported"),
        (gym.spaces.Sequence(BOX), gym.spaces.Discrete(2), "is not supported"),
        (gym.spaces.Dict({"g": gym.spaces.Text(2)}), gym.spaces.Discrete(2), "['g'] space"),
    ],
)
def test_unusable_spaces_are_refused_at_start_up(observation_space, action_space, message):
    spaces = {
        "observation_space": observation_space,
        "action_space": gym.spaces.Discrete(2) if action_space is None else action_space,
    }
    for make in (make_env, lambda *a, **k: make_vector_env(a[0], 2, **k)):
        with pytest.raises(ValueError, match=f"^env '{ENV_ID}': ") as info:
            make(ENV_ID, **spaces)
        assert message in str(info.value)


def test_unchanged_spaces_add_no_wrapper():
    env = make_env("rppo_td/CartPoleNoVel-v1")
    assert isinstance(env, gym.wrappers.TimeLimit)
    assert "CanonicalSpaces" not in str(env)
    assert isinstance(env.env, EnvChecker)  # directly below the time limit
    assert env.observation_space is env.env.observation_space


class _RecordsBoxActions(gym.Env):
    """A ``Box(-1, 1, (2, 3))`` action space; keeps the action each step receives."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (2, 3), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.received = np.array(action)
        return np.zeros(1, np.float32), 0.0, False, False, {}


def test_multi_dimensional_spaces_flatten_in_row_major_order():
    # an action unflattened in another order stays inside symmetric bounds: the wrong
    # entries would reach the wrong actuators, silently; so would bounds or category counts
    # flattened in another order than the values
    from rppo_td.envs._spaces import (
        CanonicalSpaces,
        canonical_action_space,
        canonical_observation_space,
    )

    env = CanonicalSpaces(_RecordsBoxActions(), "records")
    env.reset(seed=0)
    flat = np.arange(6, dtype=np.float32) / 10
    env.step(flat)
    np.testing.assert_array_equal(env.unwrapped.received, flat.reshape(2, 3))
    low = np.array([[0.0, 1.0], [2.0, 3.0]], np.float32)
    box = canonical_action_space(gym.spaces.Box(low, low + 10), env_id="x")
    assert box.low.tolist() == [0, 1, 2, 3] and box.high.tolist() == [10, 11, 12, 13]
    grid = gym.spaces.MultiDiscrete([[2, 5], [3, 4]], start=[[1, 0], [0, 0]])
    assert canonical_observation_space(grid, env_id="x").nvec.tolist() == [2, 5, 3, 4]
