"""``rppo_td/PendulumNoVel-v1``: Pendulum-v1 with the angular velocity hidden."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control.pendulum import PendulumEnv
from gymnasium.utils.env_checker import check_env

from rppo_td.envs import PENDULUM_NOVEL_ID, make_env, make_vector_env, register_envs
from rppo_td.envs._pendulum_novel import AngularVelocityMask, make_pendulum_novel
from rppo_td.train import main
from rppo_td.train._cli import config_from_args

register_envs()


def _actions(n: int, seed: int = 0) -> np.ndarray:
    """``[n, 1]`` float32 torques, some outside ``[-2, 2]`` (the env clips them)."""
    return np.random.default_rng(seed).uniform(-3.0, 3.0, (n, 1)).astype(np.float32)


def test_spaces():
    env = gym.make(PENDULUM_NOVEL_ID)
    space = env.observation_space
    assert isinstance(space, gym.spaces.Box) and space.shape == (2,)
    assert space.dtype == np.float32
    np.testing.assert_array_equal(space.low, [-1.0, -1.0])
    np.testing.assert_array_equal(space.high, [1.0, 1.0])
    action = env.action_space
    assert isinstance(action, gym.spaces.Box) and action.shape == (1,)
    np.testing.assert_array_equal(action.low, [-2.0])
    np.testing.assert_array_equal(action.high, [2.0])
    assert env.spec is not None and env.spec.max_episode_steps == 200


@pytest.mark.parametrize("seed", [0, 7])
def test_observes_pendulums_angle_but_not_its_velocity(seed):
    masked, full = gym.make(PENDULUM_NOVEL_ID), gym.make("Pendulum-v1")
    obs, _ = masked.reset(seed=seed)
    reference, _ = full.reset(seed=seed)
    np.testing.assert_array_equal(obs, reference[:2])
    velocities = []
    for action in _actions(50, seed):
        obs, reward, *_ = masked.step(action)
        reference, reference_reward, *_ = full.step(action)
        assert obs.shape == (2,) and obs.dtype == np.float32
        np.testing.assert_array_equal(obs, reference[:2])
        assert reward == pytest.approx(reference_reward)
        velocities.append(reference[2])
    # the hidden entry does change, so the mask hides information
    assert np.ptp(velocities) > 0.5


def test_the_time_limit_truncates_at_200_steps():
    env = gym.make(PENDULUM_NOVEL_ID)
    env.reset(seed=1)
    ends = []
    for action in _actions(200, seed=1):
        _, _, terminated, truncated, _ = env.step(action)
        ends.append((terminated, truncated))
    assert ends[-1] == (False, True)
    assert all(end == (False, False) for end in ends[:-1])


def test_mask_refuses_other_observation_spaces():
    with pytest.raises(ValueError, match="shape \\(3,\\)"):
        AngularVelocityMask(gym.make("CartPole-v1"))
    assert make_pendulum_novel(g=9.81).unwrapped.g == pytest.approx(9.81)
    assert isinstance(make_pendulum_novel().unwrapped, PendulumEnv)


# check_env warns about any wrapper (the mask is the env under test) and about Pendulum's own
# [-2, 2] torque range
@pytest.mark.filterwarnings("ignore:.*different from the unwrapped version")
@pytest.mark.filterwarnings("ignore:.*symmetric and normalized space")
def test_passes_gymnasiums_and_rppo_tds_checks():
    check_env(make_pendulum_novel(), skip_render_check=True)
    env = make_env(PENDULUM_NOVEL_ID)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2,) and env.observation_space.contains(obs)
    assert env.action_space.shape == (1,)
    obs, reward, terminated, truncated, _ = env.step(np.array([0.5], dtype=np.float32))
    assert obs.shape == (2,) and np.isfinite(reward) and not terminated and not truncated


def test_vector_env_steps_and_truncates_every_copy():
    env = make_vector_env(PENDULUM_NOVEL_ID, 3)
    try:
        obs, _ = env.reset(seed=0)
        assert obs.shape == (3, 2)
        for t in range(200):
            obs, reward, terminated, truncated, info = env.step(np.zeros((3, 1), np.float32))
            assert obs.shape == (3, 2) and reward.shape == (3,)
            assert not terminated.any()
            assert truncated.all() == (t == 199)
        assert info["_final_obs"].all()
    finally:
        env.close()


def test_preset_loads_by_either_name():
    for name in ("pendulum-novel", "pendulum_novel"):
        config, _ = config_from_args(["--preset", name])
        assert config.env == PENDULUM_NOVEL_ID and config.total_steps == 150_000
        assert config.recurrence == "lstm"


def test_a_short_training_run(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--preset", "pendulum-novel", "--output", str(out), "--threads", "1"]
    tiny = ["--total-steps", "512", "--num-workers", "2", "--rollout-steps", "128"]
    tiny += ["--epochs", "1", "--num-minibatches", "2", "--eval-episodes", "1"]
    assert main([*argv, *tiny, "--hidden-size", "16", "--no-progress"]) == 0
    capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env_steps"] == 512 and summary["updates"] == 2
    # one deterministic episode of at most 200 steps costing at most ~16.3 each
    assert -16.3 * 200 <= summary["eval_return_mean"] <= 0.0
    assert summary["config"]["env"] == PENDULUM_NOVEL_ID
