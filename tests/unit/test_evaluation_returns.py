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


class ActionPaysFiveSteps(ActionPays):
    """``ActionPays`` over 5 steps of zero observations: only the carried state varies."""

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return super().reset(seed=seed)

    def step(self, action):
        self.t += 1
        obs, reward, _, truncated, info = super().step(action)
        return obs, reward, self.t >= 5, truncated, info


ACTION_PAYS_5 = "rppo_td_test/ActionPaysFiveSteps-v0"

for _id, _entry in (
    (SEEDED_LENGTH, SeededLength),
    (TRUNCATED_AT_3, TruncatedAt3),
    (ACTION_PAYS, ActionPays),
    (ACTION_PAYS_5, ActionPaysFiveSteps),
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


def test_only_the_cut_episodes_are_counted_as_cut():
    result = evaluate_agent(
        _agent(SEEDED_LENGTH), SEEDED_LENGTH, episodes=3, seed=0, max_episode_steps=2
    )
    assert (result["eval_returns"], result["eval_cut_episodes"]) == ([1.0, 2.0, 2.0], 1)


def test_the_recurrent_state_is_carried_through_an_episode():
    # reset at every step, the recurrent agent was scored as a memoryless one, silently
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    from rppo_td.modules import RecurrentActor, observation_to_tensordict

    torch.manual_seed(0)
    agent = _agent(ACTION_PAYS_5)
    scored = evaluate_agent(agent, ACTION_PAYS_5, episodes=1, seed=0)["eval_returns"][0]
    actor, actions = RecurrentActor(agent), []  # one env stepped by hand, the state fed on
    zeros = np.zeros((1, 2), np.float32)
    td = observation_to_tensordict(zeros, agent.leaves, (1,))
    td.set("is_init", torch.ones(1, 1, dtype=torch.bool))
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        for _ in range(5):
            actor(td)
            actions.append(float(np.clip(td["action"].numpy(), -1.0, 1.0)[0, 0]))
            following = observation_to_tensordict(zeros, agent.leaves, (1,))
            for key in actor.state_keys:
                following.set(key, td.get(("next", key)))
            following.set("is_init", torch.zeros(1, 1, dtype=torch.bool))
            td = following
    assert len(set(actions)) > 1  # the carried state changes the action
    assert np.isclose(scored, sum(actions), rtol=1e-6)


def test_rppo_eval_stochastic_samples(tmp_path, monkeypatch):
    # --stochastic must reach the evaluation: the mode evaluated instead, silently
    from rppo_td.evaluate import main as eval_main
    from rppo_td.train import _evaluate
    from rppo_td.train import main as train_main

    run = tmp_path / "run"
    argv = ["--env", "CartPole-v1", "--total-steps", "256", "--num-workers", "2"]
    argv += ["--rollout-steps", "64", "--eval-episodes", "0", "--no-progress"]
    assert train_main([*argv, "--output", str(run)]) == 0
    seen, real = [], _evaluate.evaluate_agent

    def spy(*args, **kwargs):
        seen.append(kwargs["deterministic"])
        return real(*args, **kwargs)

    monkeypatch.setattr(_evaluate, "evaluate_agent", spy)
    assert eval_main(["--checkpoint", str(run), "--episodes", "2", "--stochastic"]) == 0
    assert eval_main(["--checkpoint", str(run), "--episodes", "2"]) == 0
    assert seen == [False, True]
