"""rppo_td/CartPoleNoVel-v1 registration and the env helpers."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from rppo_td.envs import (
    CARTPOLE_NOVEL_ID,
    make_env,
    make_vector_env,
    register_envs,
    resolve_env_id,
)

register_envs()


def _run(code: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr


def test_registered_by_register_envs():
    assert CARTPOLE_NOVEL_ID == "rppo_td/CartPoleNoVel-v1"
    spec = gym.spec(CARTPOLE_NOVEL_ID)
    assert spec.max_episode_steps == 500
    register_envs()  # a second call does nothing
    assert gym.spec(CARTPOLE_NOVEL_ID) is spec


def test_importing_has_no_side_effects():
    # functional needs torch alone; rppo_td registers nothing; rppo_td.envs registers its env
    _run(
        "import sys, rppo_td.functional\n"
        "loaded = {'torchrl', 'gymnasium', 'tensordict'} & set(sys.modules)\n"
        "assert not loaded, loaded\n"
        "import rppo_td, gymnasium as gym\n"
        f"assert {CARTPOLE_NOVEL_ID!r} not in gym.registry\n"
        "assert 'torchrl' not in sys.modules\n"
        "import rppo_td.envs\n"
        f"assert {CARTPOLE_NOVEL_ID!r} in gym.registry\n"
    )


def test_gymnasium_module_syntax_registers():
    _run(
        "import gymnasium as gym\n"
        f"env = gym.make('rppo_td.envs:{CARTPOLE_NOVEL_ID}')\n"
        "assert env.observation_space.shape == (2,)\n"
    )


def test_first_use_registers():
    _run(
        "import gymnasium as gym\n"
        "from rppo_td.envs import make_env\n"
        f"assert make_env({CARTPOLE_NOVEL_ID!r}).observation_space.shape == (2,)\n"
        f"assert gym.make({CARTPOLE_NOVEL_ID!r}).spec.max_episode_steps == 500\n"
    )


def test_top_level_names_load_on_access():
    _run(
        "import sys, rppo_td\n"
        "assert 'torchrl' not in sys.modules\n"
        "for name in rppo_td.__all__:\n"
        "    assert getattr(rppo_td, name) is not None, name\n"
        "assert set(rppo_td.__all__) <= set(dir(rppo_td))\n"
        "from rppo_td import SequencePadder, functional\n"
        "assert functional is sys.modules['rppo_td.functional']\n"
        "assert rppo_td.envs.make_env is sys.modules['rppo_td.envs'].make_env\n"
        "try:\n"
        "    rppo_td.NoSuchName\n"
        "except AttributeError as err:\n"
        "    assert 'NoSuchName' in str(err)\n"
        "else:\n"
        "    raise AssertionError('no AttributeError')\n"
    )


def test_observation_is_position_and_angle():
    env = gym.make(CARTPOLE_NOVEL_ID)
    assert env.observation_space.shape == (2,)
    assert env.action_space == gym.spaces.Discrete(2)
    obs, _ = env.reset(seed=3)
    for _ in range(5):
        state = np.asarray(env.unwrapped.state, dtype=np.float32)
        np.testing.assert_allclose(obs, state[[0, 2]])
        obs, reward, *_ = env.step(0)
        assert reward == 1.0
    assert env.observation_space.contains(obs)


def test_same_dynamics_as_cartpole():
    ours, full = gym.make(CARTPOLE_NOVEL_ID), gym.make("CartPole-v1")
    a, _ = ours.reset(seed=7)
    b, _ = full.reset(seed=7)
    for action in [0, 1, 1, 0, 1, 0, 0]:
        np.testing.assert_allclose(a, b[[0, 2]])
        a, *_ = ours.step(action)
        b, *_ = full.step(action)


def test_time_limit_is_a_truncation_at_500():
    env = gym.make(CARTPOLE_NOVEL_ID)
    env.reset(seed=0)
    env._elapsed_steps = 499  # the outermost wrapper is gymnasium's TimeLimit
    assert isinstance(env, gym.wrappers.TimeLimit)
    _, _, terminated, truncated, _ = env.step(0)
    assert truncated and not terminated


def test_module_colon_id_imports_the_module():
    assert resolve_env_id(f"rppo_td.envs:{CARTPOLE_NOVEL_ID}") == CARTPOLE_NOVEL_ID
    assert make_env(f"rppo_td.envs:{CARTPOLE_NOVEL_ID}").observation_space.shape == (2,)


def test_module_colon_id_finds_the_module_in_the_current_directory(tmp_path, monkeypatch):
    # rppo-train (a console script, whose sys.path lacks the current directory) could not
    # import my_envs.py from where it was run; python -m rppo_td.train could
    (tmp_path / "rppo_probe_cwd_envs.py").write_text(
        "import gymnasium\n"
        "gymnasium.register('probe/CwdCartPole-v0', "
        "entry_point='gymnasium.envs.classic_control:CartPoleEnv')\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "rppo_probe_cwd_envs", raising=False)
    assert resolve_env_id("rppo_probe_cwd_envs:probe/CwdCartPole-v0") == "probe/CwdCartPole-v0"
    assert sys.path[-1] == str(tmp_path)  # appended: installed packages come first
    with pytest.raises(ValueError, match="cannot import module 'rppo_probe_nowhere'"):
        resolve_env_id("rppo_probe_nowhere:Foo-v0")
    assert sys.path.count(str(tmp_path)) == 1


@pytest.mark.parametrize(
    ("env_id", "message"),
    [
        ("NoSuchEnv-v0", "unknown env 'NoSuchEnv-v0'"),
        ("no_such_module_xyz:Foo-v0", "cannot import module 'no_such_module_xyz'"),
        (":Foo-v0", "must look like 'module:EnvId'"),
        ("json:Foo-v0", "unknown env 'json:Foo-v0': module 'json' was imported but 'Foo-v0'"),
        ("", "non-empty"),
        # registered, deprecated: it was called "not registered"
        ("Taxi-v3", "env 'Taxi-v3' is deprecated in gymnasium: .*Please use `Taxi-v4`"),
    ],
)
def test_bad_env_ids_raise_clear_errors(env_id, message):
    with pytest.raises(ValueError, match=message):
        resolve_env_id(env_id)


def test_vector_env_autoresets_in_same_step_mode():
    env = make_vector_env(CARTPOLE_NOVEL_ID, 3)
    assert env.autoreset_mode == AutoresetMode.SAME_STEP
    env.reset(seed=0)
    for _ in range(200):
        obs, _, terminated, truncated, info = env.step(np.zeros(3, dtype=np.int64))
        done = terminated | truncated
        if done.any():
            i = int(np.flatnonzero(done)[0])
            assert info["_final_obs"][i]
            # the returned observation is the reset one, the final one is in the info
            assert not np.allclose(obs[i], info["final_obs"][i])
            return
    pytest.fail("no episode ended in 200 steps of a constant action")


def test_vector_env_rejects_bad_sizes():
    with pytest.raises(ValueError, match="num_envs"):
        make_vector_env(CARTPOLE_NOVEL_ID, 0)
