"""Evaluation of an env without a time limit: its episodes are cut, with a warning."""

from __future__ import annotations

import json
import logging
import re

import gymnasium as gym
import numpy as np
import pytest
import torch

from rppo_td.envs import make_env
from rppo_td.evaluate import main as eval_main
from rppo_td.modules import RecurrentActorCritic
from rppo_td.train import _evaluate
from rppo_td.train._evaluate import episode_step_limit, evaluate_agent, record_agent
from rppo_td.train._video import VideoWriter

ENDLESS = "rppo_td_test/Endless-v0"


class Endless(gym.Env):
    """Never terminates; reward 1 a step; registered with no time limit."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}  # noqa: RUF012

    def __init__(self, render_mode=None):
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 1.0, False, False, {}

    def render(self):
        return np.zeros((8, 8, 3), np.uint8)


if ENDLESS not in gym.registry:
    gym.register(id=ENDLESS, entry_point=Endless)


def _agent(env_id=ENDLESS):
    env = make_env(env_id)
    return RecurrentActorCritic(env.observation_space, env.action_space, hidden_size=4)


def test_the_default_cut_is_for_envs_without_a_time_limit_only():
    assert episode_step_limit("CartPole-v1") is None
    assert episode_step_limit(ENDLESS) == _evaluate.EVAL_STEP_LIMIT
    assert episode_step_limit("CartPole-v1", 7) == 7
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_episode_steps must be an int >= 1"):
            episode_step_limit(ENDLESS, bad)


def test_an_endless_evaluation_is_cut_and_says_so(monkeypatch, caplog):
    # this evaluation once ran for ever
    monkeypatch.setattr(_evaluate, "EVAL_STEP_LIMIT", 25)
    with caplog.at_level(logging.WARNING):
        result = evaluate_agent(_agent(), ENDLESS, episodes=3, seed=0)
    assert result["eval_returns"] == [25.0, 25.0, 25.0]
    assert result["eval_cut_episodes"] == 3
    assert "3 of 3 evaluation episodes did not end within 25 steps" in caplog.text
    assert "no time limit of its own" in caplog.text
    given = evaluate_agent(_agent(), ENDLESS, episodes=2, seed=0, max_episode_steps=4)
    assert (given["eval_returns"], given["eval_cut_episodes"]) == ([4.0, 4.0], 2)


def test_evaluate_agent_checks_its_arguments_by_name():
    # np.int64(2) episodes gave "num_envs must be an int >= 1" (a name of inside), "2" a
    # TypeError from a comparison, deterministic="no" was taken as True
    import numpy as np

    agent = _agent("CartPole-v1")
    result = evaluate_agent(
        agent, "CartPole-v1", episodes=np.int64(2), seed=np.int64(3), max_episode_steps=np.int64(5)
    )
    assert result["eval_returns"] == [5.0, 5.0]
    bad = [
        ({"episodes": 2.0}, "episodes must be an int >= 1, got 2.0"),
        ({"episodes": "2"}, "episodes must be an int >= 1, got '2'"),
        ({"episodes": True}, "episodes must be an int >= 1, got True"),
        ({"seed": -1}, "seed must be an int >= 0, got -1"),
        ({"deterministic": "no"}, "deterministic must be True or False, got 'no'"),
    ]
    for given, message in bad:
        with pytest.raises(ValueError, match=re.escape(message)):
            evaluate_agent(agent, "CartPole-v1", **{"episodes": 2, "seed": 0, **given})


def test_an_env_that_ends_its_episodes_is_not_cut():
    result = evaluate_agent(_agent("CartPole-v1"), "CartPole-v1", episodes=2, seed=0)
    assert result["eval_cut_episodes"] == 0
    assert all(r < 500 for r in result["eval_returns"])  # ended by the pole, not a cut


def test_a_recording_is_cut_as_the_evaluation(tmp_path, caplog):
    env = gym.make(ENDLESS, render_mode="rgb_array")
    writer = VideoWriter(tmp_path / "x.gif", fps=10)
    with caplog.at_level(logging.WARNING):
        returns, lengths = record_agent(
            _agent(), env, writer, env_id=ENDLESS, episodes=2, seed=0, max_episode_steps=6
        )
    writer.close()
    assert (returns, lengths, writer.frames) == ([6.0, 6.0], [6, 6], 14)
    assert "2 of 2 recorded episodes did not end within 6 steps" in caplog.text


def test_rppo_eval_takes_and_checks_the_flag(tmp_path, capsys):
    from rppo_td.train import main as train_main

    run = tmp_path / "run"
    argv = ["--env", "CartPole-v1", "--total-steps", "256", "--num-workers", "2"]
    argv += ["--rollout-steps", "64", "--eval-episodes", "0", "--no-progress"]
    assert train_main([*argv, "--output", str(run)]) == 0
    capsys.readouterr()
    assert eval_main(["--checkpoint", str(run), "--episodes", "2", "--max-episode-steps", "3"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["eval_cut_episodes"] == 2
    assert result["eval_returns"] == [3.0, 3.0]
    with pytest.raises(SystemExit) as info:
        eval_main(["--checkpoint", str(run), "--max-episode-steps", "0"])
    assert info.value.code == 2
    assert "--max-episode-steps must be >= 1, got 0" in capsys.readouterr().err
    # --threads, as rppo-train's (rppo-eval had none): it wins over the run's (1), and
    # load_agent leaves torch's thread count alone (it set the run's, for any caller)
    from rppo_td.train import load_agent

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        load_agent(run)
        assert torch.get_num_threads() == 2
        assert eval_main(["--checkpoint", str(run), "--episodes", "1"]) == 0
        assert torch.get_num_threads() == 1  # the run's --threads
        assert eval_main(["--checkpoint", str(run), "--episodes", "1", "--threads", "2"]) == 0
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    with pytest.raises(SystemExit) as info:
        eval_main(["--checkpoint", str(run), "--threads", "-1"])
    assert info.value.code == 2
    assert "--threads must be in [0, 4096], got -1" in capsys.readouterr().err
