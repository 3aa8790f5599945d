"""What evaluate_agent scores: each episode's own rewards, ended by either flag."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from rppo_td.envs import make_env
from rppo_td.modules import RecurrentActorCritic
from rppo_td.modules._heads import ActionHead
from rppo_td.train._evaluate import evaluate_agent

SEEDED_LENGTH = "rppo_td_test/SeededLength-v0"
TRUNCATED_AT_3 = "rppo_td_test/TruncatedAt3-v0"
ACTION_PAYS = "rppo_td_test/ActionPays-v0"


class SeededLength(gym.Env):
    """Reward 1 a step; terminates after ``seed + 1`` steps (the seed of its first reset)."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.length, self.steps = 1, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.length = seed + 1
        self.steps = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.steps += 1
        return np.zeros(2, np.float32), 1.0, self.steps >= self.length, False, {}


class TruncatedAt3(gym.Env):
    """Reward 1 a step; never terminates, truncated at its 3rd step (no registered limit)."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.steps += 1
        return np.zeros(2, np.float32), 1.0, False, self.steps >= 3, {}


class ActionPays(gym.Env):
    """One step; pays the action it is given, unclipped (``Box(-1, 1, (1,))`` actions)."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), float(action[0]), True, False, {}


for _id, _entry in (
    (SEEDED_LENGTH, SeededLength),
    (TRUNCATED_AT_3, TruncatedAt3),
    (ACTION_PAYS, ActionPays),
):
    if _id not in gym.registry:
        gym.register(id=_id, entry_point=_entry)


def _agent(env_id):
    env = make_env(env_id)
    return RecurrentActorCritic(env.observation_space, env.action_space, hidden_size=4)


def test_each_return_is_its_own_episodes_rewards():
    # an env whose episode ended was stepped on (autoreset) until the last one ended: its
    # next episode's rewards must not be added to the one scored
    result = evaluate_agent(_agent(SEEDED_LENGTH), SEEDED_LENGTH, episodes=3, seed=0)
    assert result["eval_returns"] == [1.0, 2.0, 3.0]
    assert result["eval_return_mean"] == 2.0
    assert np.isclose(result["eval_return_std"], np.std([1.0, 2.0, 3.0]))


def test_a_truncated_episode_ends_its_evaluation():
    result = evaluate_agent(
        _agent(TRUNCATED_AT_3), TRUNCATED_AT_3, episodes=2, seed=0, max_episode_steps=10
    )
    assert (result["eval_returns"], result["eval_cut_episodes"]) == ([3.0, 3.0], 0)


def test_box_actions_are_clipped_into_the_space_before_the_env():
    # an env that does not clip for itself saw the mode 5 of a [-1, 1] space
    agent = _agent(ACTION_PAYS)
    (head,) = [m for m in agent.modules() if isinstance(m, ActionHead)]
    with torch.no_grad():
        head.linear.weight.zero_()
        head.linear.bias.fill_(5.0)
    assert evaluate_agent(agent, ACTION_PAYS, episodes=2, seed=0)["eval_returns"] == [1.0, 1.0]
    with torch.no_grad():
        head.linear.bias.fill_(-5.0)
    assert evaluate_agent(agent, ACTION_PAYS, episodes=1, seed=0)["eval_returns"] == [-1.0]
