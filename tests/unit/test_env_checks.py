"""Env faults raise one ``EnvError`` naming the env and the problem, on every path.

Each fault is a tiny env registered below under a test-only id (``rppo_td_test/Fault-*``);
it behaves until step ``AT`` and then returns the fault (reset faults fire at the first
reset). Every case runs through ``make_env`` (the single env evaluation and TorchRL use) and
``make_vector_env`` (the trainer's and ``evaluate_agent``'s path).
"""

from __future__ import annotations

import pickle
import re

import gymnasium as gym
import numpy as np
import pytest

from rppo_td.envs import CARTPOLE_NOVEL_ID, EnvError, make_env, make_vector_env, register_envs
from rppo_td.envs._vector import CheckedVectorEnv
from rppo_td.modules import RecurrentActorCritic, RecurrentPolicy
from rppo_td.train import evaluate_agent
from rppo_td.train._torchrl_collector import TorchRLCollector

register_envs()  # gym.make of the built-in task below

AT = 3


class FaultyEnv(gym.Env):
    """Box(2) float32 observations and Discrete(2) actions; ``fault`` from step ``AT`` on."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, fault: str = "none") -> None:
        if fault == "ctor_raises":
            raise KeyError("missing_asset")
        self.fault = fault
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        obs = np.zeros(2, dtype=np.float32)
        if self.fault == "old_reset":
            return obs
        if self.fault == "reset_raises":
            raise ValueError("cannot load level")
        if self.fault == "reset_nan":
            obs[1] = np.nan
        return obs, {}

    def step(self, action):
        self.t += 1
        obs = np.full(2, 0.1 * self.t, dtype=np.float32)
        reward, terminated, truncated, info = 1.0, False, False, {}
        if self.t < AT:
            return obs, reward, terminated, truncated, info
        fault = self.fault
        if fault == "step_raises":
            return 1 / 0
        if fault == "old_step":
            return obs, reward, False, info
        if fault == "nan_obs":
            obs[0] = np.nan
        elif fault == "inf_obs":
            obs[1] = -np.inf
        elif fault == "final_nan":  # only the final observation of the episode is bad
            obs[0], terminated = np.nan, True
        elif fault == "wrong_shape":
            obs = np.zeros(3, dtype=np.float32)
        elif fault == "scalar_obs":
            obs = np.float32(0.5)
        elif fault == "string_obs":
            obs = np.array(["a", "b"])
        elif fault == "array_reward":
            reward = np.array([1.0, 2.0])
        elif fault == "size1_reward":
            reward = np.array([1.0])
        elif fault == "huge_reward":  # a float64 beyond float32: stored, it would be inf
            reward = -1e39
        elif fault == "edge_reward":  # finite in float32's type, inf once rounded to it
            reward = 5e38
        elif fault == "largest_reward":  # float32's largest: stored as it is, accepted
            reward = float(np.finfo(np.float32).max)
        elif fault == "nan_reward":
            reward = float("nan")
        elif fault == "none_terminated":
            terminated = None
        elif fault == "string_truncated":
            truncated = "no"
        elif fault == "count_terminated":  # a count where a flag belongs (an env bug)
            terminated = 2
        elif fault == "array_terminated":
            terminated = np.array([True, False])
        elif fault == "list_info":
            info = []
        return obs, reward, terminated, truncated, info


class DiscreteObsEnv(FaultyEnv):
    """Discrete(3) observations; from step ``AT`` on, 5 (out of range) or 1.5 (a float)."""

    observation_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 0, {}

    def step(self, action):
        self.t += 1
        faults = {"out_of_range": 5, "one_past": 3, "float_obs": 1.5}
        obs = faults.get(self.fault, 1) if self.t >= AT else 1
        return obs, 1.0, False, False, {}


class MultiObsEnv(FaultyEnv):
    """MultiBinary(3) or MultiDiscrete([3, 3]) observations, out of range from step ``AT`` on."""

    SPACES: dict[str, gym.Space] = {  # noqa: RUF012
        "binary_two": gym.spaces.MultiBinary(3),
        "multi_one_past": gym.spaces.MultiDiscrete([3, 3]),
    }
    BAD: dict[str, list[int]] = {"binary_two": [0, 2, 1], "multi_one_past": [0, 3]}  # noqa: RUF012

    def __init__(self, fault: str) -> None:
        super().__init__(fault)
        self.observation_space = self.SPACES[fault]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(self.observation_space.shape, np.int8), {}

    def step(self, action):
        self.t += 1
        good = np.zeros(self.observation_space.shape, np.int8)
        obs = np.array(self.BAD[self.fault], np.int8) if self.t >= AT else good
        return obs, 1.0, False, False, {}


class WideObsEnv(FaultyEnv):
    """float64 Box observations; from step ``AT`` on, finite but beyond float32's range."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), dtype=np.float64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2), {}

    def step(self, action):
        self.t += 1
        # 1e39: its square is finite in float64 (the sum-of-squares check passed it); 1e300:
        # its square overflows, and the entry check found it finite
        big = {"huge_obs": 1e39, "huger_obs": -1e300}[self.fault]
        return np.array([big if self.t >= AT else 0.0, 1.0]), 1.0, False, False, {}


def _not_an_env():
    return object()


# fault -> a fragment the message must contain (besides the env id)
FAULTS = {
    "nan_obs": "observation contains NaN or inf: array([nan, 0.3]",
    "inf_obs": "observation contains NaN or inf",
    "reset_nan": "in reset(), observation contains NaN or inf",
    "final_nan": "observation contains NaN or inf",
    "wrong_shape": "observation has shape (3,), expected (2,)",
    "scalar_obs": "observation has shape (), expected (2,)",
    "string_obs": "observation has dtype <U1, expected one castable to float32",
    "array_reward": "reward is an array of shape (2,) and dtype float64, expected a scalar",
    "size1_reward": "reward is an array of shape (1,)",
    "nan_reward": "reward is nan, expected a finite number",
    "huge_reward": "reward is -1e+39, beyond float32's range",
    "edge_reward": "reward is 5e+38, beyond float32's range",
    "count_terminated": "terminated is 2 (int), expected a bool",
    "none_terminated": "terminated is None, expected a bool",
    "string_truncated": "truncated is 'no' (str), expected a bool",
    "array_terminated": "terminated is an array of shape (2,) and dtype bool, expected a bool",
    "list_info": "info is [] (list), expected a dict",
    "old_step": "step() returned 4 values (observation, reward, done, info), the old gym API",
    "old_reset": "reset() returned an array of shape (2,) and dtype float32, expected a tuple",
    "step_raises": "raised ZeroDivisionError in step(): division by zero",
    "reset_raises": "raised ValueError in reset(): cannot load level",
}
WIDE_FAULTS = {
    "huge_obs": "observation holds 1e+39, beyond float32's range",
    "huger_obs": "observation holds -1e+300, beyond float32's range",
}
DISCRETE_FAULTS = {
    "out_of_range": "observation is 5, outside Discrete(3)",
    "one_past": "observation is 3, outside Discrete(3)",
    "float_obs": "observation has dtype float64, expected one castable to int64",
}
MULTI_FAULTS = {
    "binary_two": "outside MultiBinary(3)",
    "multi_one_past": "outside MultiDiscrete([3 3])",
}
CAUSES = {"step_raises": ZeroDivisionError, "reset_raises": ValueError}


def _id(fault: str) -> str:
    return f"rppo_td_test/Fault-{fault}-v0"


for _fault in [*FAULTS, "none", "ctor_raises", "largest_reward"]:
    if _id(_fault) not in gym.registry:
        gym.register(id=_id(_fault), entry_point=FaultyEnv, kwargs={"fault": _fault})
for _fault in DISCRETE_FAULTS:
    if _id(_fault) not in gym.registry:
        gym.register(id=_id(_fault), entry_point=DiscreteObsEnv, kwargs={"fault": _fault})
for _fault in MULTI_FAULTS:
    if _id(_fault) not in gym.registry:
        gym.register(id=_id(_fault), entry_point=MultiObsEnv, kwargs={"fault": _fault})
for _fault in WIDE_FAULTS:
    if _id(_fault) not in gym.registry:
        gym.register(id=_id(_fault), entry_point=WideObsEnv, kwargs={"fault": _fault})
if _id("not_an_env") not in gym.registry:
    gym.register(id=_id("not_an_env"), entry_point=_not_an_env)
if _id("no_module") not in gym.registry:
    # a string entry point whose module does not import (as a missing optional dependency)
    gym.register(id=_id("no_module"), entry_point="rppo_td_no_such_module_xyz:Env")


def _drive(env_id: str, how: str, steps: int = AT + 2) -> None:
    """Resets and steps ``env_id`` built ``how``; a fault must raise before this returns."""
    if how == "single":
        env = make_env(env_id)
        env.reset(seed=0)
        for _ in range(steps):
            env.step(0)
    else:
        vector = make_vector_env(env_id, 2)
        vector.reset(seed=0)
        for _ in range(steps):
            vector.step(np.zeros(2, dtype=np.int64))


def _check_message(err: EnvError, env_id: str, fragment: str) -> None:
    message = str(err)
    assert message.startswith(f"env {env_id!r}"), message
    assert fragment in message, message
    assert "\n" not in message


@pytest.mark.parametrize("how", ["single", "vector"])
@pytest.mark.parametrize(
    "fault", sorted(FAULTS) + sorted(DISCRETE_FAULTS) + sorted(WIDE_FAULTS) + sorted(MULTI_FAULTS)
)
def test_fault_raises_env_error_naming_env_and_problem(fault, how):
    fragment = {**FAULTS, **DISCRETE_FAULTS, **WIDE_FAULTS, **MULTI_FAULTS}[fault]
    with pytest.raises(EnvError) as info:
        _drive(_id(fault), how)
    _check_message(info.value, _id(fault), fragment)
    if fault in CAUSES:
        assert isinstance(info.value.__cause__, CAUSES[fault])


@pytest.mark.parametrize("how", ["single", "vector"])
def test_healthy_env_runs(how):
    _drive(_id("none"), how, steps=20)
    _drive(_id("largest_reward"), how, steps=AT + 2)  # float32's largest reward is stored as is


def test_vector_message_names_the_sub_env():
    with pytest.raises(EnvError, match=re.escape("(sub-env 0 of 2): in step()")):
        _drive(_id("nan_obs"), "vector")


class CutEnv(FaultyEnv):
    """Healthy until step ``AT``, which a time limit of ``AT`` steps cuts (``truncated``)."""

    def __init__(self, final: str) -> None:
        super().__init__()
        self.final = final

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if self.t == AT:
            obs = np.zeros(3, np.float32) if self.final == "wrong_shape" else obs * np.nan
        return obs, reward, terminated, truncated, info


@pytest.mark.parametrize(
    ("final", "fragment"),
    [("nan", "contains NaN or inf"), ("wrong_shape", "has shape (3,), expected (2,)")],
)
def test_a_final_observation_cut_by_the_time_limit_is_checked(final, fragment):
    # the sub-env's checker sits below TimeLimit: on the cut step it sees truncated=False;
    # the vector env let such a final observation through to the collector's bootstrap
    env_id = f"rppo_td_test/Cut-{final}-v0"
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=CutEnv, kwargs={"final": final}, max_episode_steps=AT)
    vector = make_vector_env(env_id, 2)
    try:
        vector.reset(seed=0)
        with pytest.raises(EnvError) as info:
            for _ in range(AT):
                vector.step(np.zeros(2, dtype=np.int64))
    finally:
        vector.close()
    _check_message(info.value, env_id, fragment)


@pytest.mark.parametrize("make", [make_env, lambda env_id: make_vector_env(env_id, 2)])
def test_constructor_faults_name_the_env(make):
    with pytest.raises(EnvError) as info:
        make(_id("ctor_raises"))
    _check_message(info.value, _id("ctor_raises"), "raised KeyError while being built")
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(EnvError) as info:
        make(_id("not_an_env"))
    _check_message(info.value, _id("not_an_env"), "returned object, expected a gymnasium.Env")
    # the entry point's module failing to import (gym.make loads it for its metadata first)
    with pytest.raises(EnvError) as info:
        make(_id("no_module"))
    _check_message(
        info.value,
        _id("no_module"),
        "could not load its entry point 'rppo_td_no_such_module_xyz:Env': ModuleNotFoundError",
    )
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_our_message_comes_before_gymnasiums_passive_checker():
    # with gymnasium's checker asked for, it sits above EnvChecker, which raises first
    env = make_env(_id("old_step"), disable_env_checker=False)
    env.reset(seed=0)
    with pytest.raises(EnvError, match="the old gym API"):
        for _ in range(AT):
            env.step(0)


def test_step_before_reset_is_refused():
    with pytest.raises(gym.error.ResetNeeded, match="before reset"):
        make_env(_id("none")).step(0)


def test_step_after_the_episode_ended_is_refused():
    # an env answers a step after its end with anything: CartPole warns and steps on (a
    # truncation by gymnasium's TimeLimit, above the checker, keeps answering truncated)
    env = make_env("CartPole-v1")
    env.reset(seed=0)
    terminated = False
    while not terminated:
        _, _, terminated, _, _ = env.step(0)  # pushes left until the pole falls
    with pytest.raises(gym.error.ResetNeeded, match=r"'CartPole-v1': .*after the episode ended"):
        env.step(0)
    env.reset(seed=1)
    env.step(0)  # a new episode steps again


def test_evaluate_agent_raises_the_same_error():
    env = make_env(_id("nan_obs"))
    agent = RecurrentActorCritic(env.observation_space, env.action_space, hidden_size=8)
    with pytest.raises(EnvError) as info:
        evaluate_agent(agent, _id("nan_obs"), episodes=2, seed=0)
    _check_message(info.value, _id("nan_obs"), FAULTS["nan_obs"])


@pytest.mark.parametrize("fault", ["step_raises", "nan_obs", "old_step"])
def test_torchrl_collector_raises_the_same_error(fault):
    env = make_env(_id(fault))
    agent = RecurrentActorCritic(env.observation_space, env.action_space, hidden_size=8)
    collector = TorchRLCollector(
        _id(fault), agent, RecurrentPolicy(agent), num_workers=2, rollout_steps=8, seed=0
    )
    try:
        with pytest.raises(EnvError) as info:
            collector.rollout()
    finally:
        collector.shutdown()
    _check_message(info.value, _id(fault), FAULTS[fault])


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"render_mode": "rgb_array"}],  # the array env; the checked copies (they render)
)
def test_checks_do_not_change_a_healthy_trajectory(kwargs):
    ours = make_vector_env(CARTPOLE_NOVEL_ID, 3, **kwargs)
    plain = gym.vector.SyncVectorEnv(
        [lambda: gym.make(CARTPOLE_NOVEL_ID)] * 3, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    a, _ = ours.reset(seed=5)
    b, _ = plain.reset(seed=5)
    np.testing.assert_array_equal(a, b)
    actions = np.random.default_rng(0).integers(0, 2, (60, 3))
    for action in actions:
        for x, y in zip(ours.step(action)[:4], plain.step(action)[:4], strict=True):
            np.testing.assert_array_equal(x, y)


def test_checked_vector_env_pickles_its_sub_envs():
    # checkpoints pickle the sub-envs (VectorCollector.state_dict); the masked CartPole's
    # make_vector_env is the array env, so another built-in env
    env = make_vector_env("rppo_td/PocMemory-v0", 2)
    assert isinstance(env, CheckedVectorEnv)
    env.reset(seed=0)
    env.envs = pickle.loads(pickle.dumps(env.envs))
    env.step(np.zeros(2, dtype=np.int64))


class _ListObsEnv(gym.Env):
    """A float Box whose observations are lists, numbers' edge included (Box takes lists)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), dtype=np.float64)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return [0.1, 0.2], {}

    def step(self, action):
        self.t += 1
        # float32's largest as numpy prints it: float32 rounds it down, finite
        return [3.4028235e38, -1e30], 1.0, self.t >= 3, False, {}


def test_observations_the_float32_check_must_take():
    # a list failed with AttributeError ('list' has no dtype) in the new check's fast path
    if "rppo_td_test/ListObs-v0" not in gym.registry:
        gym.register("rppo_td_test/ListObs-v0", entry_point=_ListObsEnv)
    env = make_env("rppo_td_test/ListObs-v0")
    env.reset(seed=0)
    for _ in range(3):
        env.step(0)
    vector = make_vector_env("rppo_td_test/ListObs-v0", 2)
    vector.reset(seed=0)
    for _ in range(5):
        vector.step(np.zeros(2, dtype=np.int64))


class _ShiftedDiscreteObs(FaultyEnv):
    """``Discrete(4, start=10)`` observations, a float ``10.7`` from step ``AT`` on."""

    observation_space = gym.spaces.Discrete(4, start=10)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 10, {}

    def step(self, action):
        self.t += 1
        return (10.7 if self.t >= AT else 11), 1.0, False, False, {}


@pytest.mark.parametrize("how", ["single", "vector"])
def test_observations_are_checked_before_their_space_is_converted(how):
    # the conversion to Discrete(4) subtracts the start: 10.7 became 0 (a valid index) in the
    # vector envs' sub-envs, whose own check (off by default there) was needed first
    if "rppo_td_test/ShiftedDiscreteObs-v0" not in gym.registry:
        gym.register("rppo_td_test/ShiftedDiscreteObs-v0", entry_point=_ShiftedDiscreteObs)
    with pytest.raises(EnvError) as info:
        _drive("rppo_td_test/ShiftedDiscreteObs-v0", how)
    _check_message(
        info.value,
        "rppo_td_test/ShiftedDiscreteObs-v0",
        "observation has dtype float64, expected one castable to int64",
    )
