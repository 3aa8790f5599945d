"""``TorchRLCollector``: TorchRL's ``Collector`` in the library's ``[W, T]`` layout.

Both TorchRL constructions (``GymWrapper`` over gymnasium's ``SyncVectorEnv``, and
``SerialEnv`` of ``GymWrapper``) are checked for the layout, zero states at ``is_init`` and
final observations under ``"next"``. The gym-vector construction is seeded as
``VectorCollector`` is, so with the same weights and a deterministic policy both collect the
same rollouts; a step-by-step replay on fresh ``make_env`` copies is the naive reference.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase, TensorDictSequential
from torchrl.envs.utils import ExplorationType, set_exploration_type

from rppo_td.envs import CARTPOLE_NOVEL_ID, make_cartpole_novel, make_env, make_vector_env
from rppo_td.modules import RecurrentActor, RecurrentActorCritic, RecurrentCritic
from rppo_td.train._torchrl_collector import TorchRLCollector
from rppo_td.train._vector_collector import VectorCollector
from rppo_td.transforms import GAE

REPO = Path(__file__).resolve().parents[2]

# CartPoleNoVel with a 10-step time limit: rollouts hold truncations and terminations
SHORT_ID = "rppo_td_test/CartPoleNoVelShort-v1"
TIME_LIMIT = 10
if SHORT_ID not in gym.registry:
    gym.register(id=SHORT_ID, entry_point=make_cartpole_novel, max_episode_steps=TIME_LIMIT)

W, T = 3, 24
FLAGS = ("reward", "terminated", "truncated", "done")


class Deterministic(TensorDictModuleBase):
    """Runs ``module`` under ``DETERMINISTIC`` exploration (collectors set ``RANDOM``)."""

    def __init__(self, module: TensorDictModuleBase) -> None:
        super().__init__()
        self.module = module
        self.in_keys = module.in_keys
        self.out_keys = module.out_keys

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            return self.module(tensordict)


def make_net(recurrence: str = "lstm", **kwargs) -> RecurrentActorCritic:
    env = make_env(SHORT_ID)
    torch.manual_seed(0)
    return RecurrentActorCritic(
        env.observation_space, env.action_space, recurrence=recurrence, hidden_size=8, **kwargs
    )


def policy_of(net: RecurrentActorCritic) -> TensorDictSequential:
    return TensorDictSequential(RecurrentActor(net), RecurrentCritic(net))


def collect(net, policy, *, batching="vector", rollouts=1, seed=0):
    device = next(net.parameters()).device
    collector = TorchRLCollector(
        SHORT_ID,
        net,
        policy,
        num_workers=W,
        rollout_steps=T,
        seed=seed,
        device=device,
        batching=batching,
    )
    try:
        return [collector.rollout() for _ in range(rollouts)], collector
    finally:
        collector.shutdown()


def expected_keys(net: RecurrentActorCritic) -> set:
    obs = list(net.observation_keys)
    return {
        *obs,
        "action",
        "action_log_prob",
        "state_value",
        "is_init",
        *net.state_keys,
        *[("next", k) for k in obs],
        *[("next", k) for k in net.state_keys],
        *[("next", k) for k in FLAGS],
    }


@pytest.fixture(scope="module", params=["vector", "serial"])
def collected(request):
    """``(net, two consecutive rollouts, the finished episodes)`` of one construction."""
    net = make_net(shared_critic=False)
    rollouts, collector = collect(net, policy_of(net), batching=request.param, rollouts=2)
    returns, lengths, _ = collector.episodes.pop()
    return net, rollouts, (returns, lengths)


def check_layout(net: RecurrentActorCritic, td: TensorDictBase) -> None:
    assert td.batch_size == (W, T)
    assert set(td.keys(include_nested=True, leaves_only=True)) == expected_keys(net)
    assert ("next", "state_value") not in td.keys(include_nested=True)
    for key in ("is_init", *[("next", k) for k in FLAGS]):
        assert td[key].shape == (W, T, 1), key
    for key in ("is_init", ("next", "terminated"), ("next", "truncated"), ("next", "done")):
        assert td[key].dtype == torch.bool, key
    assert td["state_value"].shape == (W, T, 1)
    assert td["action"].shape == td["action_log_prob"].shape == (W, T)
    for key in net.state_keys:
        assert td[key].shape == td["next", key].shape == (W, T, *net.state_shape)
    done = td["next", "done"]
    assert torch.equal(done, td["next", "terminated"] | td["next", "truncated"])
    assert torch.equal(td["is_init"][:, 1:], done[:, :-1])


def test_layout(collected):
    net, rollouts, (returns, lengths) = collected
    for td in rollouts:
        check_layout(net, td)
    # every env starts an episode at the first step; one starts after each done
    assert rollouts[0]["is_init"][:, 0].all()
    assert torch.equal(rollouts[1]["is_init"][:, 0], rollouts[0]["next", "done"][:, -1])
    # the episodes counted are the rollouts' dones
    dones = sum(int(td["next", "done"].sum()) for td in rollouts)
    assert len(returns) == len(lengths) == dones
    assert all(1 <= n <= TIME_LIMIT for n in lengths)


@pytest.mark.parametrize("batching", ["vector", "serial"])
def test_layout_without_recurrence(batching):
    net = make_net("none")
    (td,), _ = collect(net, policy_of(net), batching=batching)
    assert not net.state_keys
    check_layout(net, td)


def test_states_zero_at_is_init_and_carried_otherwise(collected):
    net, rollouts, _ = collected
    for td in rollouts:
        init = td["is_init"].squeeze(-1)
        assert init.any() and (~init).any()
        for key in net.state_keys:
            state = td[key]
            assert not state[init].any(), key
            # within an episode the entering state is the previous step's state after it
            carried = ~init[:, 1:]
            torch.testing.assert_close(state[:, 1:][carried], td["next", key][:, :-1][carried])
            assert state[:, 1:][carried].abs().sum() > 0


def test_next_observation_is_the_final_one_and_flags_stay_apart(collected):
    _, rollouts, _ = collected
    td = torch.cat(rollouts, dim=1)
    obs, following = td["observation"], td["next", "observation"]
    done = td["next", "done"].squeeze(-1)
    # inside an episode the next observation is the following step's
    inside = ~done[:, :-1]
    torch.testing.assert_close(following[:, :-1][inside], obs[:, 1:][inside])
    # at an episode end it is the final one, not the reset that follows
    ended = done[:, :-1]
    assert ended.any()
    assert (following[:, :-1][ended] != obs[:, 1:][ended]).any(dim=-1).all()
    # truncations (the time limit) are kept apart from terminations
    terminated = td["next", "terminated"].squeeze(-1)
    truncated = td["next", "truncated"].squeeze(-1)
    assert truncated.any() and terminated.any()
    assert not (terminated & truncated).any()


def replay(td: TensorDictBase, seed: int) -> None:
    """The naive reference: steps fresh ``make_env`` copies (env ``i`` from ``seed + i``)."""
    for i in range(td.shape[0]):
        env = make_env(SHORT_ID)
        obs, _ = env.reset(seed=seed + i)
        for t in range(td.shape[1]):
            torch.testing.assert_close(td["observation"][i, t], torch.as_tensor(obs))
            obs, reward, term, trunc, _ = env.step(int(td["action"][i, t]))
            torch.testing.assert_close(td["next", "observation"][i, t], torch.as_tensor(obs))
            assert float(td["next", "reward"][i, t]) == reward
            assert bool(td["next", "terminated"][i, t]) == term
            assert bool(td["next", "truncated"][i, t]) == trunc
            if term or trunc:
                obs, _ = env.reset()


def test_gym_vector_path_matches_vector_collector_and_the_replay():
    net = make_net(shared_critic=False)
    policy = Deterministic(policy_of(net))
    ours, _ = collect(net, policy, batching="vector", rollouts=2, seed=3)
    vector = VectorCollector(
        make_vector_env(SHORT_ID, W), policy, leaves=net.leaves, frames_per_batch=W * T, seed=3
    )
    try:
        theirs = [vector.rollout() for _ in range(2)]
    finally:
        vector.shutdown()
    assert torch.cat([td["next", "truncated"] for td in ours], 1).any()
    assert torch.cat([td["next", "terminated"] for td in ours], 1).any()
    for a, b in zip(ours, theirs, strict=True):
        for key in expected_keys(net):
            torch.testing.assert_close(a[key], b[key], msg=f"{key}: {{}}")
    replay(torch.cat(ours, dim=1), seed=3)
    # set_seed restarts the envs as a fresh collector seeded the same way starts them
    collector = TorchRLCollector(SHORT_ID, net, policy, num_workers=W, rollout_steps=T, seed=0)
    try:
        collector.rollout()
        collector.set_seed(3)
        again = collector.rollout()
    finally:
        collector.shutdown()
    for key in expected_keys(net):
        torch.testing.assert_close(again[key], ours[0][key], msg=f"{key}: {{}}")


def test_gae_with_the_recurrent_critic_runs_on_it():
    net = make_net(shared_critic=False)
    (td,), _ = collect(net, policy_of(net))
    before = td.clone()
    out = GAE(gamma=0.99, lmbda=0.95, value_network=RecurrentCritic(net))(td)
    for key in ("advantage", "value_target"):
        assert out[key].shape == (W, T, 1)
        assert torch.isfinite(out[key]).all()
    # ("next", "state_value") is V(next obs) from the critic's state after each step
    with torch.no_grad():
        following = td["next"].select(*net.observation_keys, *net.critic_state_keys)
        following["is_init"] = torch.zeros(W, T, 1, dtype=torch.bool)
        expected = RecurrentCritic(net)(following)["state_value"]
    torch.testing.assert_close(out["next", "state_value"], expected)
    for key in before.keys(include_nested=True, leaves_only=True):
        torch.testing.assert_close(out[key], before[key])


def test_state_dict_is_empty_and_a_resume_warns_once(caplog):
    net = make_net()
    collector = TorchRLCollector(
        SHORT_ID, net, policy_of(net), num_workers=2, rollout_steps=4, seed=0
    )
    try:
        assert dict(collector.state_dict()) == {}
        with caplog.at_level(logging.WARNING, logger="rppo_td.train._torchrl_collector"):
            collector.load_state_dict({})
            collector.load_state_dict({})
        warnings = [r for r in caplog.records if "does not checkpoint env state" in r.message]
        assert len(warnings) == 1
        assert collector.rollout().batch_size == (2, 4)
    finally:
        collector.shutdown()


def test_shutdown_leaves_no_hang():
    script = textwrap.dedent(
        f"""
        from tensordict.nn import TensorDictSequential
        from rppo_td.modules import RecurrentActor, RecurrentCritic
        from rppo_td.train import TrainConfig
        from rppo_td.train._setup import build_agent
        from rppo_td.train._torchrl_collector import TorchRLCollector

        net = build_agent(TrainConfig(hidden_size=8))
        policy = TensorDictSequential(RecurrentActor(net), RecurrentCritic(net))
        for batching in ("vector", "serial"):
            c = TorchRLCollector("{CARTPOLE_NOVEL_ID}", net, policy, num_workers=2,
                                 rollout_steps=4, seed=0, batching=batching)
            c.rollout()
            c.shutdown()
        print("done")
        """
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("done")


@pytest.mark.gpu
def test_rollouts_are_built_on_the_device():
    net = make_net(shared_critic=False).to("cuda")
    (td,), _ = collect(net, policy_of(net))
    assert td.device is None or td.device.type == "cuda"
    for key in expected_keys(net):
        assert td[key].device.type == "cuda", key
    out = GAE(gamma=0.99, lmbda=0.95, value_network=RecurrentCritic(net))(td)
    assert out["advantage"].device.type == "cuda"


class _UnclippedBox(gym.Env):
    """Box actions in [-0.1, 0.1] that the env does not clip: it records what it gets."""

    seen: list[float] = []  # noqa: RUF012 (one list for the test)

    def __init__(self):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float32)
        self.action_space = gym.spaces.Box(-0.1, 0.1, (1,), dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        _UnclippedBox.seen.append(float(np.asarray(action).reshape(-1)[0]))
        self.t += 1
        return np.zeros(2, np.float32), 0.0, False, self.t >= 10, {}


@pytest.mark.parametrize("batching", ["vector", "serial"])
def test_box_actions_reach_the_env_clipped_and_are_stored_as_sampled(batching):
    # the vector collector clipped them; this collector sent the Gaussian samples (+-2)
    env_id = "rppo_td_test/UnclippedBox-v0"
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=_UnclippedBox)
    space = _UnclippedBox()
    net = RecurrentActorCritic(space.observation_space, space.action_space, hidden_size=4)
    policy = TensorDictSequential(RecurrentActor(net), RecurrentCritic(net))
    _UnclippedBox.seen.clear()
    collector = TorchRLCollector(
        env_id, net, policy, num_workers=2, rollout_steps=20, seed=0, batching=batching
    )
    try:
        rollout = collector.rollout()
    finally:
        collector.shutdown()
    seen = np.array(_UnclippedBox.seen)
    low, high = np.float32(-0.1), np.float32(0.1)  # the space's float32 bounds
    assert len(seen) == 40 and seen.min() >= low and seen.max() <= high
    stored = rollout["action"]
    assert bool((stored.abs() > 0.1).any())  # the samples, whose log-probs the loss compares


class _Image(gym.Env):
    """Images of the step count (7 after a reset), 5 steps an episode."""

    observation_space = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.full((8, 8, 3), 7, np.uint8), {}

    def step(self, action):
        self.t += 1
        return np.full((8, 8, 3), self.t, np.uint8), 1.0, False, self.t >= 5, {}


@pytest.mark.parametrize("batching", ["vector", "serial"])
def test_image_envs_reach_the_net_as_observation_either_batching(batching):
    # GymWrapper names one env's uint8 image "pixels": the serial batching failed in the net
    from rppo_td.train._torchrl_collector import make_torchrl_env

    if "rppo_td_test/StepCountImage-v0" not in gym.registry:
        gym.register("rppo_td_test/StepCountImage-v0", entry_point=_Image)
    net = RecurrentActorCritic(_Image.observation_space, _Image.action_space, hidden_size=8)
    env = make_torchrl_env("rppo_td_test/StepCountImage-v0", net, num_workers=2, batching=batching)
    try:
        td = env.rollout(6, RecurrentActor(net), break_when_any_done=False)
    finally:
        env.close()
    assert "pixels" not in td.keys(include_nested=True)
    assert td["observation"].shape == (2, 6, 8, 8, 3)
    assert td["observation"][:, :3, 0, 0, 0].tolist() == [[7, 1, 2]] * 2


def test_a_space_other_than_box_is_refused_in_one_line_naming_the_envs_own_space():
    # MiniGrid's symbolic view (a MultiDiscrete) printed its array over two lines, and an env
    # observing Discrete(4, start=10) was named with the agent's Discrete(4)
    from rppo_td.train._torchrl_collector import make_torchrl_env

    gym.register("probe/DiscreteStart-v0", entry_point=_DiscreteStartEnv)
    net = RecurrentActorCritic(gym.spaces.Box(-1, 1, (1,)), gym.spaces.Discrete(2), hidden_size=4)
    with pytest.raises(ValueError) as refused:
        make_torchrl_env("probe/DiscreteStart-v0", net, num_workers=1)
    message = str(refused.value)
    assert "\n" not in message
    assert (
        "probe/DiscreteStart-v0 observes Discrete(4, start=10); use --collector vector" in message
    )


class _DiscreteStartEnv(gym.Env):
    observation_space = gym.spaces.Discrete(4, start=10)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 10, {}

    def step(self, action):
        return 11, 0.0, True, False, {}


PENDULUM_5 = "rppo_td_test/PendulumFiveSteps-v1"
if PENDULUM_5 not in gym.registry:
    gym.register(
        id=PENDULUM_5,
        entry_point="gymnasium.envs.classic_control.pendulum:PendulumEnv",
        max_episode_steps=5,
    )


def _ended_in_order(done: torch.Tensor) -> list[int]:
    """The lengths of the episodes ending in ``done`` ``[W, T]``, by step then worker."""
    lengths, start = [], [0] * done.shape[0]
    for t in range(done.shape[1]):
        for w in range(done.shape[0]):
            if done[w, t]:
                lengths.append(t + 1 - start[w])
                start[w] = t + 1
    return lengths


def test_episode_statistics_restart_with_a_new_seed_and_sum_the_rewards():
    # after set_seed the episodes ended before it were still reported and the running
    # returns and lengths carried on; CartPole pays 1 a step, so a return taken from one
    # step's reward only still equalled the length: Pendulum's rewards vary
    net = make_net(shared_critic=False)
    collector = TorchRLCollector(
        SHORT_ID, net, policy_of(net), num_workers=3, rollout_steps=12, seed=0
    )
    try:
        collector.rollout()
        collector.rollout()  # episodes ended, others running, when the seed changes
        collector.set_seed(3)
        assert collector.episodes.pop() == ([], [], [])
        td = collector.rollout()
        returns, lengths, _ = collector.episodes.pop()
    finally:
        collector.shutdown()
    expected = _ended_in_order(td["next", "done"].squeeze(-1))
    assert lengths == expected and returns == [float(n) for n in expected]

    torch.manual_seed(0)
    env = make_env(PENDULUM_5)
    net = RecurrentActorCritic(env.observation_space, env.action_space, hidden_size=8)
    collector = TorchRLCollector(
        PENDULUM_5, net, policy_of(net), num_workers=2, rollout_steps=10, seed=0
    )
    try:
        td = collector.rollout()
        returns, lengths, _ = collector.episodes.pop()
    finally:
        collector.shutdown()
    reward = td["next", "reward"].squeeze(-1).double()
    sums = [float(reward[w, t - 4 : t + 1].sum()) for t in (4, 9) for w in range(2)]
    assert lengths == [5, 5, 5, 5]
    np.testing.assert_allclose(returns, sums, rtol=1e-9)
