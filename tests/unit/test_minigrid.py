"""MiniGrid Memory behind the ``minigrid`` extra: spaces, actions, view, ends, errors, presets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("minigrid")

from minigrid.core.constants import OBJECT_TO_IDX

from rppo_td.envs import make_env, make_vector_env, register_envs
from rppo_td.envs._minigrid import (
    MINIGRID_MEMORY_SIZES,
    make_minigrid_memory,
    minigrid_memory_id,
)
from rppo_td.train import main
from rppo_td.train._cli import config_from_args

register_envs()

S9 = minigrid_memory_id(9)
LEFT, RIGHT, FORWARD = 0, 1, 2


def _image(obs: np.ndarray) -> np.ndarray:
    """Symbolic observation ``[28]`` -> the ``[3, 3, 3]`` view (x, y, channel)."""
    return obs[:27].reshape(3, 3, 3)


def test_ids_are_registered_without_importing_minigrid():
    code = (
        "import sys, gymnasium as gym, rppo_td.envs\n"
        "ids = [i for i in gym.registry if i.startswith('rppo_td/MiniGrid-Memory')]\n"
        "assert 'minigrid' not in sys.modules, 'registration imported minigrid'\n"
        "print(sorted(ids))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    expected = sorted(
        minigrid_memory_id(size, mode)
        for size in MINIGRID_MEMORY_SIZES
        for mode in ("symbolic", "rgb")
    )
    assert out.stdout.strip() == str(expected)


def test_spaces_symbolic_and_rgb():
    env = gym.make(S9)
    assert env.action_space == gym.spaces.Discrete(3)
    space = env.observation_space
    assert isinstance(space, gym.spaces.MultiDiscrete) and space.shape == (28,)
    assert space.nvec.tolist() == [len(OBJECT_TO_IDX), 6, 3] * 9 + [4]
    obs, info = env.reset(seed=0)
    assert space.contains(obs) and "mission" not in info
    rgb = gym.make(minigrid_memory_id(9, "rgb"))
    assert rgb.observation_space == gym.spaces.Box(0, 255, (84, 84, 3), dtype=np.uint8)
    image, _ = rgb.reset(seed=0)
    assert image.shape == (84, 84, 3) and image.dtype == np.uint8 and image.any()
    turned, *_ = rgb.step(LEFT)
    assert not np.array_equal(image, turned)


def test_the_view_is_three_by_three_and_shows_the_cell_ahead():
    env = gym.make(S9)
    base = env.unwrapped
    assert base.agent_view_size == 3
    for seed in range(5):
        obs, _ = env.reset(seed=seed)
        for action in [LEFT, FORWARD, RIGHT, RIGHT, FORWARD, FORWARD, LEFT]:
            ahead = base.grid.get(*base.front_pos)
            ahead_code = ahead.encode() if ahead is not None else (OBJECT_TO_IDX["empty"], 0, 0)
            # the agent stands at (1, 2) of its view, looking towards y = 0
            assert tuple(_image(obs)[1, 1]) == tuple(ahead_code)
            assert obs[27] == base.agent_dir
            obs, *_ = env.step(action)


def test_actions_are_left_right_forward():
    env = gym.make(S9)
    base = env.unwrapped
    env.reset(seed=1)
    assert base.agent_dir == 0  # MiniGrid starts the agent facing right (east)
    env.step(LEFT)
    assert base.agent_dir == 3
    env.step(RIGHT)
    env.step(RIGHT)
    assert base.agent_dir == 1
    env.step(LEFT)
    start = base.agent_pos
    env.step(FORWARD)  # the row of the start is open up to the junction
    assert tuple(base.agent_pos) == (start[0] + 1, start[1])
    with pytest.raises(ValueError, match="0 \\(left\\), 1 \\(right\\) or 2 \\(forward\\)"):
        env.step(3)


def _walk_to_the_junction(env: gym.Env) -> tuple[int, float]:
    """Forward along the middle row to the junction cell; returns steps and total reward."""
    base = env.unwrapped
    steps, total = 0, 0.0
    while base.agent_pos[0] < base.width - 2:
        _, reward, terminated, truncated, _ = env.step(FORWARD)
        steps, total = steps + 1, total + reward
        assert not (terminated or truncated)
    return steps, total


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("correct", [True, False])
def test_the_matching_object_pays_and_the_other_does_not(seed, correct):
    env = gym.make(S9)
    base = env.unwrapped
    env.reset(seed=seed)
    steps, total = _walk_to_the_junction(env)
    assert total == 0.0
    goal = base.success_pos if correct else base.failure_pos
    env.step(LEFT if goal[1] < base.agent_pos[1] else RIGHT)
    _, reward, terminated, truncated, _ = env.step(FORWARD)
    assert (terminated, truncated) == (True, False)
    expected = 1 - 0.9 * (steps + 2) / (5 * 9**2) if correct else 0.0
    assert reward == pytest.approx(expected)


def test_the_time_limit_is_a_truncation_at_five_size_squared():
    env = make_env(S9)
    env.reset(seed=0)
    for step in range(1, 5 * 9**2 + 1):
        _, reward, terminated, truncated, _ = env.step(LEFT)  # spinning never ends an episode
        assert reward == 0.0 and not terminated
        assert truncated == (step == 5 * 9**2)


def test_make_env_and_make_vector_env():
    env = make_env(minigrid_memory_id(11))
    obs, _ = env.reset(seed=0)
    assert obs.shape == (28,) and env.observation_space.contains(obs)
    vec = make_vector_env(S9, 3)
    obs, _ = vec.reset(seed=0)
    assert obs.shape == (3, 28) and obs.dtype == np.int64
    obs, reward, terminated, truncated, _ = vec.step(np.array([LEFT, RIGHT, FORWARD]))
    assert obs.shape == (3, 28) and reward.shape == terminated.shape == truncated.shape == (3,)


def test_missing_extra_raises_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "minigrid", None)  # import minigrid -> ImportError
    message = "rppo_td/MiniGrid-MemoryS9-v0 needs the minigrid extra: pip install"
    with pytest.raises(ImportError, match=message):
        gym.make(S9)
    with pytest.raises(ImportError, match="rppo_td\\[minigrid\\]"):
        make_minigrid_memory(11, observation="rgb")


def test_rppo_train_without_the_extra_is_a_usage_error(monkeypatch, tmp_path, capsys):
    """A preset whose env needs a package that is not installed cannot run as set: one line
    naming the extra to install, and exit status 2, as for an unknown env id (an env that
    fails while training is status 1)."""
    monkeypatch.setitem(sys.modules, "minigrid", None)
    argv = ["--preset", "minigrid-memory-s9", "--total-steps", "2048", "--output", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "needs the minigrid extra: pip install 'rppo_td[minigrid]'" in err
    assert len(err.strip().splitlines()) == 1


def test_bad_size_or_mode_is_refused():
    with pytest.raises(ValueError, match="size must be one of"):
        make_minigrid_memory(8)
    with pytest.raises(ValueError, match="observation must be"):
        make_minigrid_memory(9, observation="pixels")  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [9, 11])
def test_presets_load_by_either_name(size):
    for name in (f"minigrid-memory-s{size}", f"minigrid_memory_s{size}"):
        config, _ = config_from_args(["--preset", name])
        assert config.env == minigrid_memory_id(size)
        assert config.recurrence == "lstm" and config.total_steps >= 100_000


def test_a_short_training_run(tmp_path):
    """A short run trains and evaluates; ``benchmarks/minigrid_starts.py`` then splits the
    checkpoint's deterministic episodes by start x, each episode once, as ``rppo-eval``
    scores them, and refuses a checkpoint of another env."""
    out = tmp_path / "run"
    argv = ["--preset", "minigrid-memory-s9", "--total-steps", "512", "--num-workers", "4"]
    argv += ["--rollout-steps", "64", "--num-minibatches", "2", "--epochs", "1"]
    argv += ["--hidden-size", "16", "--eval-episodes", "2", "--no-progress"]
    assert main([*argv, "--output", str(out), "--threads", "1"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env_steps"] == 512 and summary["eval_episodes"] == 2
    assert 0.0 <= summary["eval_return_mean"] <= 1.0

    benchmarks = str(Path(__file__).resolve().parents[2] / "benchmarks")
    sys.path.insert(0, benchmarks)
    try:
        import minigrid_starts
    finally:
        sys.path.remove(benchmarks)
    result = minigrid_starts.by_start(str(out), episodes=12, seed=7)
    played = {int(x): n for x, (_, n) in result["by_start"].items()}
    assert sum(played.values()) == 12 and set(played) <= set(range(1, 7))
    assert result["solved"] == sum(k for k, _ in result["by_start"].values())
    assert result["first_action"].keys() == result["by_start"].keys()
    assert all(a in "LRF" and 0.0 < p <= 1.0 for a, p in result["first_action"].values())
    expected = []
    for i in range(12):
        env = gym.make(S9)
        env.reset(seed=7 + i)
        expected.append(int(env.unwrapped.agent_pos[0]))
        env.close()
    assert played == {x: expected.count(x) for x in set(expected)}
    other = tmp_path / "poc"
    poc = ["--preset", "poc-memory", "--total-steps", "256", "--num-workers", "4"]
    poc += ["--eval-episodes", "1", "--no-progress", "--output", str(other)]
    assert main(poc) == 0
    with pytest.raises(SystemExit, match="is not a MiniGrid Memory env"):
        minigrid_starts.by_start(str(other), episodes=2, seed=0)
