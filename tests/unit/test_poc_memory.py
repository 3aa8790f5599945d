"""``rppo_td/PocMemory-v0``: the seed design's proof-of-concept memory task."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from rppo_td.envs import POC_MEMORY_ID, PocMemory, make_env, register_envs
from rppo_td.train._cli import config_from_args

register_envs()


def _run(env: gym.Env, actions: list[int], seed: int = 0):
    obs, _ = env.reset(seed=seed)
    seen, rewards, ends = [obs], [], []
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        seen.append(obs)
        rewards.append(reward)
        ends.append((terminated, truncated))
        if terminated or truncated:
            break
    return np.stack(seen), rewards, ends


@pytest.mark.parametrize("seed", range(6))
def test_remembering_the_flags_returns_one(seed):
    env = PocMemory()
    obs, _ = env.reset(seed=seed)
    right = obs[2] > 0
    seen, rewards, ends = _run(env, [int(right)] * 7, seed=seed)
    # flags only while the agent cannot move: the first 2 observations
    assert set(np.abs(seen[:2, [0, 2]]).ravel()) == {1.0} and not seen[2:, [0, 2]].any()
    np.testing.assert_allclose(seen[:3, 1], 0.0)  # no movement during the 2 shown steps
    assert ends[-1] == (True, False) and len(rewards) == 7
    assert sum(rewards) == pytest.approx(1.0)
    assert seen[-1, 1] == pytest.approx(1.0 if right else -1.0)


def test_the_wrong_end_punishes_and_the_time_limit_truncates():
    env = PocMemory()
    obs, _ = env.reset(seed=3)
    wrong = int(not obs[2] > 0)
    _, rewards, ends = _run(env, [wrong] * 7, seed=3)
    assert rewards[-1] == pytest.approx(-1.6) and ends[-1] == (True, False)
    limited = gym.make(POC_MEMORY_ID)
    _, rewards, ends = _run(limited, [0, 1] * 20)  # back and forth: never an end
    assert len(rewards) == 32 and ends[-1] == (False, True)
    assert all(r == pytest.approx(-0.1) for r in rewards)


def test_a_step_after_the_end_is_refused():
    # it moved on past the end, out of its own observation space, and paid again
    env = PocMemory()
    obs, _ = env.reset(seed=0)
    _, _, ends = _run(env, [int(obs[2] > 0)] * 7, seed=0)
    assert ends[-1] == (True, False)
    with pytest.raises(gym.error.ResetNeeded, match="after the episode ended"):
        env.step(1)
    env.reset(seed=0)
    assert env.step(1)[1] == pytest.approx(-0.1)


def test_both_ends_pay_as_often():
    env = PocMemory()
    right = [bool(env.reset(seed=s)[0][2] > 0) for s in range(400)]
    assert 150 < sum(right) < 250


def test_passes_gymnasiums_and_rppo_tds_checks():
    check_env(PocMemory(), skip_render_check=True)
    env = make_env(POC_MEMORY_ID)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    with pytest.raises(ValueError, match="0 \\(left\\) or 1 \\(right\\)"):
        PocMemory().step(2)


def test_preset_loads_by_either_name():
    for name in ("poc-memory", "poc_memory"):
        config, _ = config_from_args(["--preset", name])
        assert config.env == POC_MEMORY_ID and config.total_steps == 30_000


def test_each_env_has_its_own_spaces():
    # class-level spaces were shared: seeding one env's action space re-seeded every other's
    first, second = PocMemory(), PocMemory()
    assert first.action_space is not second.action_space
    assert first.observation_space is not second.observation_space
    first.action_space.seed(0)
    draws = [first.action_space.sample() for _ in range(20)]
    first.action_space.seed(0)
    second.action_space.seed(1)
    assert [first.action_space.sample() for _ in range(20)] == draws
