"""``CartPoleNoVelVectorEnv``: the same episodes as ``W`` checked copies, bit for bit."""

from __future__ import annotations

import pickle
import re

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.error import ResetNeeded
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from hypothesis import given
from hypothesis import strategies as st

from rppo_td.envs import CARTPOLE_NOVEL_ID, EnvError, make_env, make_vector_env
from rppo_td.envs._cartpole_vector import CartPoleNoVelVectorEnv
from rppo_td.envs._vector import CheckedVectorEnv


def _copies(num_envs: int, **kwargs) -> SyncVectorEnv:
    """The reference: ``W`` separate checked copies in ``SAME_STEP`` mode."""
    fns = [lambda: make_env(CARTPOLE_NOVEL_ID, **kwargs) for _ in range(num_envs)]
    return SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP)


def _bits(x: np.ndarray) -> tuple:
    x = np.ascontiguousarray(x)
    return x.dtype.str, x.shape, x.tobytes()


def _assert_same_step(a: tuple, b: tuple) -> None:
    for x, y in zip(a[:4], b[:4], strict=True):
        assert _bits(x) == _bits(y)
    info_a, info_b = a[4], b[4]
    assert set(info_a) == set(info_b)
    if "_final_obs" in info_a:
        assert _bits(info_a["_final_obs"]) == _bits(info_b["_final_obs"])
        for i in np.flatnonzero(info_a["_final_obs"]):
            assert _bits(info_a["final_obs"][i]) == _bits(info_b["final_obs"][i])


def _policy_actions(obs: np.ndarray, rng: np.random.Generator, greedy: float) -> np.ndarray:
    """Mostly a balancing controller (long episodes, so truncations), sometimes random."""
    balance = (obs[:, 1] > 0).astype(np.int64)
    random = rng.integers(0, 2, len(obs))
    return np.where(rng.random(len(obs)) < greedy, balance, random)


@given(
    num_envs=st.integers(1, 6),
    seed=st.integers(0, 2**31 - 1),
    limit=st.integers(1, 60),
    greedy=st.floats(0.0, 1.0),
    sutton_barto=st.booleans(),
)
def test_same_episodes_as_the_checked_copies(num_envs, seed, limit, greedy, sutton_barto):
    kwargs = {"max_episode_steps": limit, "sutton_barto_reward": sutton_barto}
    ours, reference = CartPoleNoVelVectorEnv(num_envs, **kwargs), _copies(num_envs, **kwargs)
    obs, _ = ours.reset(seed=seed)
    expected, _ = reference.reset(seed=seed)
    assert _bits(obs) == _bits(expected)
    rng = np.random.default_rng(seed)
    for _ in range(150):
        actions = _policy_actions(obs, rng, greedy)
        step = ours.step(actions)
        _assert_same_step(step, reference.step(actions))
        obs = step[0]


def test_the_trainers_shape_over_thousands_of_steps():
    # 32 copies and CartPole's own 500-step limit, under a controller that sees the whole
    # state and mostly keeps the poles up (so episodes end in truncations), sometimes not
    ours, reference = make_vector_env(CARTPOLE_NOVEL_ID, 32), _copies(32)
    assert isinstance(ours, CartPoleNoVelVectorEnv)
    ours.reset(seed=0)
    reference.reset(seed=0)
    rng, terminations, truncations = np.random.default_rng(0), 0, 0
    for _ in range(3000):
        x, x_dot, theta, theta_dot = ours.state.T
        actions = (10 * theta + 2 * theta_dot + 0.1 * x + 0.5 * x_dot > 0).astype(np.int64)
        actions = np.where(rng.random(32) < 0.2, 1 - actions, actions)
        step = ours.step(actions)
        _assert_same_step(step, reference.step(actions))
        terminations += int(step[2].sum())
        truncations += int(step[3].sum())
    assert terminations > 100 and truncations > 100


def test_reset_seeds_and_options_as_the_copies():
    ours, reference = CartPoleNoVelVectorEnv(3), _copies(3)
    for kwargs in [
        {"seed": 0},
        {"seed": [5, None, 9]},  # None: the copy's generator goes on
        {"seed": None},
        {"seed": 4, "options": {"low": -0.2, "high": 0.1}},
        {"options": {"high": 0.01}},
    ]:
        assert _bits(ours.reset(**kwargs)[0]) == _bits(reference.reset(**kwargs)[0])
        actions = np.array([1, 0, 1])
        for _ in range(40):  # autoresets use CartPole's own bounds again
            _assert_same_step(ours.step(actions), reference.step(actions))


def test_state_round_trip_goes_on_exactly():
    env = CartPoleNoVelVectorEnv(4)
    env.reset(seed=1)
    for _ in range(30):
        env.step(np.array([0, 1, 1, 0]))
    saved = pickle.loads(pickle.dumps(env.get_state()))
    ahead = [env.step(np.array([1, 1, 0, 0])) for _ in range(40)]
    other = CartPoleNoVelVectorEnv(4)
    other.set_state(saved)
    for step in ahead:
        _assert_same_step(other.step(np.array([1, 1, 0, 0])), step)


def test_state_of_separate_copies_goes_on_exactly():
    # a checkpoint written before the array env held the checked copies themselves
    copies = _copies(3)
    copies.reset(seed=2)
    for _ in range(25):
        copies.step(np.array([1, 0, 1]))
    env = CartPoleNoVelVectorEnv(3)
    env.set_state(env.copies_state(pickle.loads(pickle.dumps(copies.envs))))
    for _ in range(60):
        _assert_same_step(env.step(np.array([0, 1, 1])), copies.step(np.array([0, 1, 1])))
    # their time limits' counters come along: restarted at 0, episodes were cut up to 500
    # steps late after such a resume (the 85 steps above never reach the limit)
    short = [make_env(CARTPOLE_NOVEL_ID, max_episode_steps=10) for _ in range(2)]
    for i, copy in enumerate(short):
        copy.reset(seed=i)
        for action in (0, 1, 0, 1, 0):
            copy.step(action)
    counts = CartPoleNoVelVectorEnv(2, max_episode_steps=10).copies_state(short)["elapsed"]
    assert counts.tolist() == [5, 5]


@pytest.mark.parametrize(
    "actions",
    [np.array([0, 2]), np.array([0, -1]), np.array([0.0, 1.0]), np.array([0, 1, 1]), np.array(1)],
)
def test_bad_actions_are_refused_by_name(actions):
    env = CartPoleNoVelVectorEnv(2)
    env.reset(seed=0)
    expected = r"CartPoleNoVel-v1': expected 2 integer actions in \{0, 1\}"
    with pytest.raises(EnvError, match=expected):
        env.step(actions)


def test_misuse_is_refused():
    env = CartPoleNoVelVectorEnv(2)
    with pytest.raises(ResetNeeded, match="reset"):
        env.step(np.array([0, 1]))
    with pytest.raises(NotImplementedError, match="render_mode='rgb_array'"):
        env.render()
    with pytest.raises(ValueError, match="expected an int, W ints or None, got True"):
        env.reset(seed=True)
    with pytest.raises(ValueError, match="expected 2 seeds, got 3"):
        env.reset(seed=[1, 2, 3])
    with pytest.raises(ValueError, match="low <= high"):
        env.reset(options={"low": 0.1, "high": -0.1})
    with pytest.raises(ValueError, match="num_envs"):
        CartPoleNoVelVectorEnv(0)
    for limit in (0, 2.5, np.int64(5), True):
        with pytest.raises(ValueError, match="max_episode_steps must be an int >= 1"):
            CartPoleNoVelVectorEnv(2, max_episode_steps=limit)
    with pytest.raises(ValueError, match="expected 2 envs, got 3"):
        env.set_state(CartPoleNoVelVectorEnv(3).get_state())


def test_make_vector_env_uses_it_only_where_it_is_the_same_env():
    assert isinstance(make_vector_env(CARTPOLE_NOVEL_ID, 2), CartPoleNoVelVectorEnv)
    quiet = make_vector_env(CARTPOLE_NOVEL_ID, 2, render_mode=None, disable_env_checker=True)
    assert isinstance(quiet, CartPoleNoVelVectorEnv)
    limit = make_vector_env(CARTPOLE_NOVEL_ID, 2, max_episode_steps=None)  # gym.make's None
    assert isinstance(limit, CartPoleNoVelVectorEnv) and limit.max_episode_steps == 500
    assert isinstance(make_vector_env(CARTPOLE_NOVEL_ID, 2, arrays=False), CheckedVectorEnv)
    limited = make_vector_env(f"rppo_td.envs:{CARTPOLE_NOVEL_ID}", 2, max_episode_steps=7)
    assert isinstance(limited, CartPoleNoVelVectorEnv) and limited.max_episode_steps == 7
    # anything else it does not do (rendering, other keywords) goes to the checked copies
    rendering = make_vector_env(CARTPOLE_NOVEL_ID, 2, render_mode="rgb_array")
    assert isinstance(rendering, CheckedVectorEnv)
    in_processes = make_vector_env(CARTPOLE_NOVEL_ID, 2, processes=1)
    assert not isinstance(in_processes, CartPoleNoVelVectorEnv)
    in_processes.close()
    env = make_vector_env(CARTPOLE_NOVEL_ID, 2)
    assert env.single_observation_space == make_env(CARTPOLE_NOVEL_ID).observation_space
    assert env.single_action_space == gym.spaces.Discrete(2)
    assert env.autoreset_mode == AutoresetMode.SAME_STEP


def test_reset_mask_resets_only_those_copies():
    ours, reference = CartPoleNoVelVectorEnv(3), _copies(3)
    for env in (ours, reference):
        env.reset(seed=0)
    actions = np.zeros(3, dtype=np.int64)
    for _ in range(7):
        _assert_same_step(ours.step(actions), reference.step(actions))
    options = {"reset_mask": np.array([True, False, True])}
    obs = ours.reset(seed=[4, None, None], options=options)[0]
    expected = reference.reset(seed=[4, None, None], options=dict(options))[0]
    assert _bits(obs) == _bits(expected)
    assert "reset_mask" in options  # the caller's options are left alone
    for _ in range(30):
        _assert_same_step(ours.step(actions), reference.step(actions))
    with pytest.raises(ValueError, match=r"'reset_mask' must be a bool array \(3,\)"):
        ours.reset(options={"reset_mask": [True, False, True]})
    with pytest.raises(ValueError, match="first reset must reset every copy"):
        CartPoleNoVelVectorEnv(3).reset(options=options)


def test_refused_calls_leave_the_env_as_it_was():
    env, twin = CartPoleNoVelVectorEnv(3), CartPoleNoVelVectorEnv(3)
    for one in (env, twin):
        one.reset(seed=0)
        one.step(np.array([1, 0, 1]))
    refused = [
        ({"seed": [7, -1, 2]}, "every seed must be None or an int >= 0, got -1"),
        ({"seed": 5, "options": {"low": 1, "high": 0}}, "expected low <= high"),
        ({"seed": 5, "options": {"low": "a"}}, "'low' must be a finite number, got 'a'"),
        ({"options": {"high": float("nan")}}, "'high' must be a finite number"),
        ({"options": {"low": None}}, "'low' must be a finite number, got None"),
    ]
    for kwargs, message in refused:
        with pytest.raises(ValueError, match=re.escape(message)):
            env.reset(**kwargs)
    good = env.get_state()
    corrupt = [
        ({**good, "generators": good["generators"][:2]}, "expected 3 generator states"),
        ({**good, "generators": [{"bit_generator": "MT19937", "state": {}}] * 3}, "unusable"),
        ({k: v for k, v in good.items() if k != "started"}, "missing ['started']"),
        ({**good, "generators": [None] * 3}, "a started env needs every generator"),
        ({**good, "state": np.full((3, 4), np.nan)}, "'state' must be finite float64 (3, 4)"),
        ({**good, "state": good["state"].T.copy()}, "'state' must be finite float64 (3, 4)"),
        ({**good, "elapsed": np.array([1.5, 0, 0])}, "'elapsed' must be ints >= 0 (3,)"),
        ({**good, "elapsed": np.array([-1, 0, 0])}, "'elapsed' must be ints >= 0 (3,)"),
        ({**good, "started": "no"}, "'started' must be a bool"),
        ("not a state", "expected a dict, got str"),
    ]
    for saved, message in corrupt:
        with pytest.raises(ValueError, match=re.escape(message)):
            env.set_state(saved)
    for _ in range(40):
        _assert_same_step(env.step(np.array([0, 1, 1])), twin.step(np.array([0, 1, 1])))


def test_copies_state_refuses_other_copies():
    env = CartPoleNoVelVectorEnv(2)
    never_reset = [make_env(CARTPOLE_NOVEL_ID) for _ in range(2)]
    with pytest.raises(ValueError, match="never reset"):
        env.copies_state(never_reset)
    acrobot = [gym.make("Acrobot-v1") for _ in range(2)]
    for one in acrobot:
        one.reset(seed=0)
    with pytest.raises(ValueError, match="expected CartPole copies with a time limit"):
        env.copies_state(acrobot)
    short = _copies(2, max_episode_steps=9)
    short.reset(seed=0)
    with pytest.raises(ValueError, match="time limit is 9 steps, this env's 500"):
        env.copies_state(short.envs)
    with pytest.raises(ValueError, match="expected 2 envs, got 3"):
        env.copies_state(_copies(3).envs)


def test_what_a_sync_vector_env_user_reads():
    ours, reference = CartPoleNoVelVectorEnv(3), _copies(3)
    obs, _ = ours.reset(seed=0)
    reference.reset(seed=0)
    assert obs.flags.c_contiguous and ours.step(np.zeros(3, dtype=np.int64))[0].flags.c_contiguous
    assert ours.np_random_seed == reference.np_random_seed == (0, 1, 2)
    assert len(ours.np_random) == 3
    for call in (lambda: ours.get_attr("spec"), lambda: ours.call("render")):
        with pytest.raises(NotImplementedError, match=r"make_vector_env\(\.\.\., arrays=False\)"):
            call()
    with pytest.raises(NotImplementedError, match="arrays=False"):
        ours.set_attr("x", [1, 2, 3])


def test_a_bool_count_of_envs_is_refused_by_name():
    # True passed as 1 env, then failed later in an unclear TypeError
    with pytest.raises(ValueError, match="num_envs must be an int >= 1, got True"):
        CartPoleNoVelVectorEnv(num_envs=True)
