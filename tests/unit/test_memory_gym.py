"""The Memory Gym tasks (``rppo_td.envs._memory_gym``, the ``memory-gym`` extra)."""

from __future__ import annotations

import itertools
import json
from collections import deque

import gymnasium as gym
import numpy as np
import pytest

from rppo_td.envs import make_env, make_vector_env, register_envs
from rppo_td.envs._memory_gym import (
    MEMORY_GYM_IDS,
    MemoryGymAdapter,
    _headless_pygame,
    import_memory_gym,
)
from rppo_td.modules._spaces import is_image
from rppo_td.train import main

_headless_pygame()  # before pygame's first import: no ALSA errors without a sound card
pytest.importorskip("memory_gym")
register_envs()
import_memory_gym()

# Mystery Path Grid's moves (GridCharacterController): rotate left 1, right 2, forward 3;
# facing 0 north (y - 1), 1 west (x - 1), 2 south (y + 1), 3 east (x + 1)
_STEP = {0: (0, -1), 1: (-1, 0), 2: (0, 1), 3: (1, 0)}


def _episode(env: gym.Env, actions, *, seed: int, options=None, limit: int = 10_000):
    """Steps ``actions`` (a list, or one action repeated) until an end; (steps, flags, info)."""
    env.reset(seed=seed, options=options)
    for t in range(limit):
        action = actions[t] if isinstance(actions, list) else actions
        obs, _, terminated, truncated, info = env.step(action)
        assert env.observation_space.contains(obs)
        if terminated or truncated:
            return t + 1, (terminated, truncated), info
    raise AssertionError(f"no end within {limit} steps")


def _path_actions(env: gym.Env) -> list[int]:
    """Actions that walk Mystery Path Grid's (hidden) path from the start to the goal."""
    inner = env.unwrapped
    tiles = {(node.x, node.y) for node in inner.mystery_path.path}
    start, goal = tuple(inner.agent.grid_position), tuple(inner.end)
    came = {start: start}
    queue = deque([start])
    while queue:  # breadth-first over the path's tiles
        here = queue.popleft()
        for dx, dy in _STEP.values():
            there = (here[0] + dx, here[1] + dy)
            if there in tiles and there not in came:
                came[there] = here
                queue.append(there)
    route = [goal]
    while route[-1] != start:
        route.append(came[route[-1]])
    route.reverse()
    actions, facing = [], 0  # the agent starts facing north
    for here, there in itertools.pairwise(route):
        want = next(
            d for d, step in _STEP.items() if step == (there[0] - here[0], there[1] - here[1])
        )
        turn = (want - facing) % 4
        actions += {0: [], 1: [1], 2: [1, 1], 3: [2]}[turn] + [3]
        facing = want
    return actions


# ---- ids and spaces ------------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", sorted(MEMORY_GYM_IDS))
def test_spaces_are_uint8_images_and_memory_gyms_actions(env_id):
    env = make_env(env_id)
    assert env.observation_space == gym.spaces.Box(0, 255, (84, 84, 3), dtype=np.uint8)
    assert is_image(env.observation_space)  # the agent's CNN encoder takes it
    grid = "Grid" in env_id
    expected = gym.spaces.Discrete(4) if grid else gym.spaces.MultiDiscrete([3, 3])
    assert env.action_space == expected
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.uint8 and obs.shape == (84, 84, 3) and obs.max() > obs.min()
    obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
    assert env.observation_space.contains(obs) and type(reward) is float
    assert (terminated, truncated) == (False, False)


def test_float_images_of_memory_gym_1_0_0_become_uint8():
    class FloatImages(gym.Env):  # memory-gym 1.0.0 returned float32 in [0, 1]
        observation_space = gym.spaces.Box(0.0, 1.0, (84, 84, 3), dtype=np.float32)
        action_space = gym.spaces.Discrete(4)

        def reset(self, *, seed=None, options=None):
            return np.linspace(0.0, 1.0, 84 * 84 * 3, dtype=np.float32).reshape(84, 84, 3), {}

        def step(self, action):
            return np.ones((84, 84, 3), np.float32), 0, False, False, {}

    env = MemoryGymAdapter(FloatImages())
    assert is_image(env.observation_space)
    obs, _ = env.reset()
    assert obs.dtype == np.uint8 and obs.min() == 0 and obs.max() == 255
    np.testing.assert_allclose(obs / 255.0, FloatImages().reset()[0], atol=0.5 / 255 + 1e-6)
    with pytest.raises(ValueError, match="image Box"):
        MemoryGymAdapter(gym.make("CartPole-v1"))


# ---- time-outs are truncations, real ends terminations -------------------------------------------
@pytest.mark.parametrize(
    ("env_id", "idle"),
    [("rppo_td/MysteryPath-Grid-v0", 0), ("rppo_td/SearingSpotlights-v0", [0, 0])],
)
def test_the_time_limit_truncates(env_id, idle):
    env = make_env(env_id)
    action = idle if isinstance(idle, int) else np.array(idle)
    # standing still never reaches the goal; 3 steps cannot use up Searing Spotlights' 5 health
    steps, flags, info = _episode(env, action, seed=1, options={"max_steps": 3})
    assert (steps, flags, info["success"]) == (3, (False, True), 0)


def test_mystery_path_grids_default_limit_is_128_steps_and_a_truncation():
    steps, flags, _ = _episode(make_env("rppo_td/MysteryPath-Grid-v0"), 0, seed=0)
    assert (steps, flags) == (128, (False, True))


def test_a_step_after_the_end_is_refused():
    # memory-gym steps on past its end; Mystery Path after its time-out without an end flag
    env = gym.make("rppo_td/MysteryPath-Grid-v0")
    steps, flags, _ = _episode(env, 0, seed=1, options={"max_steps": 3})
    assert (steps, flags) == (3, (False, True))
    with pytest.raises(gym.error.ResetNeeded, match=r"MysteryPath-Grid-v0: .*after the episode"):
        env.step(0)
    env.reset(seed=1)
    env.step(0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reaching_the_goal_terminates_even_on_the_last_step(seed):
    env = make_env("rppo_td/MysteryPath-Grid-v0")
    env.reset(seed=seed)
    actions = _path_actions(env)
    steps, flags, info = _episode(env, actions, seed=seed)
    assert (steps, flags, info["success"]) == (len(actions), (True, False), 1)
    # the goal reached on the very step the time limit ends: still a real end
    limited = {"max_steps": len(actions)}
    steps, flags, info = _episode(env, actions, seed=seed, options=limited)
    assert (steps, flags, info["success"]) == (len(actions), (True, False), 1)
    # one step short of the goal, the limit cuts the episode: a truncation
    limited = {"max_steps": len(actions) - 1}
    steps, flags, info = _episode(env, actions, seed=seed, options=limited)
    assert (steps, flags, info["success"]) == (len(actions) - 1, (False, True), 0)


def test_dying_in_the_spotlights_terminates():
    env = make_env("rppo_td/SearingSpotlights-v0")
    # no time limit to speak of: the spotlights find an agent that stands still
    still = np.array([0, 0])
    steps, flags, info = _episode(env, still, seed=0, options={"max_steps": 10_000})
    assert flags == (True, False) and info["agent_health"] <= 0 and info["success"] == 0
    # dying on the very step the time limit ends: still a real end
    again, flags, info = _episode(env, still, seed=0, options={"max_steps": steps})
    assert (again, flags) == (steps, (True, False)) and info["agent_health"] <= 0


@pytest.mark.parametrize("env_id", ["rppo_td/MortarMayhem-Grid-v0", "rppo_td/MortarMayhem-v0"])
def test_mortar_mayhem_has_no_time_limit_every_end_terminates(env_id):
    env = make_env(env_id)
    for seed in range(3):
        _, flags, info = _episode(env, env.action_space.sample(), seed=seed)
        assert flags == (True, False) and info["success"] in (0, 1)


# ---- the missing extra ---------------------------------------------------------------------------
# ---- vector envs ---------------------------------------------------------------------------------
def test_vector_env_truncates_and_keeps_the_final_observation():
    envs = make_vector_env("rppo_td/MysteryPath-Grid-v0", 2)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (2, 84, 84, 3) and obs.dtype == np.uint8
    for t in range(128):  # standing still: both episodes time out at step 128
        obs, rewards, terminated, truncated, info = envs.step(np.zeros(2, dtype=np.int64))
        assert not terminated.any() and rewards.dtype == np.float64
        assert truncated.all() == (t == 127) and truncated.any() == (t == 127)
    assert info["_final_obs"].all() and info["final_obs"][0].dtype == np.uint8
    envs.close()


def test_two_envs_in_one_process_render_their_own_frames():
    """memory-gym draws on pygame's one display; each step redraws the whole frame."""
    alone = make_env("rppo_td/MortarMayhem-Grid-v0")
    pair = [make_env("rppo_td/MortarMayhem-Grid-v0") for _ in range(2)]
    first = alone.reset(seed=3)[0]
    assert np.array_equal(pair[0].reset(seed=3)[0], first)
    pair[1].reset(seed=4)
    for action in [3, 1, 2, 0, 3]:
        other = pair[1].step(2)[0]
        mine = pair[0].step(action)[0]
        assert np.array_equal(mine, alone.step(action)[0]) and not np.array_equal(mine, other)


def test_closing_one_env_leaves_the_others_running_and_the_last_ends_pygame(monkeypatch):
    """memory-gym's close calls pygame.quit(), which would stop every env of the process: an
    eval env closed beside a training vector env must not break it."""
    import pygame

    from rppo_td.envs._memory_gym import MemoryGymAdapter

    monkeypatch.setattr(MemoryGymAdapter, "_open", 0)  # envs other tests left open
    envs = make_vector_env("rppo_td/MysteryPath-Grid-v0", 2)
    envs.reset(seed=0)
    other = make_env("rppo_td/MysteryPath-Grid-v0")
    other.reset(seed=5)
    other.close()
    other.close()  # a second close changes nothing
    obs = envs.step(np.array([0, 1]))[0]
    assert obs.shape == (2, 84, 84, 3) and pygame.get_init()
    envs.close()
    assert not pygame.get_init() and MemoryGymAdapter._open == 0
    again = make_env("rppo_td/MysteryPath-Grid-v0")  # a new env starts pygame again
    assert again.reset(seed=1)[0].shape == (84, 84, 3)
    again.close()


# ---- presets and a short training run ------------------------------------------------------------
def test_a_short_training_run_on_a_grid_task(tmp_path):
    out = tmp_path / "run"
    argv = ["--preset", "mortar-mayhem-grid", "--total-steps", "128", "--num-workers", "2"]
    argv += ["--rollout-steps", "32", "--sequence-length", "16", "--num-minibatches", "2"]
    argv += ["--hidden-size", "16", "--epochs", "1", "--eval-episodes", "1", "--no-progress"]
    assert main([*argv, "--output", str(out), "--threads", "1"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["env_steps"] == 128 and summary["eval_episodes"] == 1
    # Mortar Mayhem Grid pays 0.1 per command done, 10 commands at most
    assert 0.0 <= summary["eval_return_mean"] <= 1.0 + 1e-6
