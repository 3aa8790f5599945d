"""reward_scale: the update learns from scaled rewards; logged returns stay the env's."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict

from rppo_td.modules import RecurrentActor, RecurrentActorCritic, RecurrentCritic
from rppo_td.train import TrainConfig
from rppo_td.train._ppo import PPOSettings, PPOUpdate


def _update(scale: float) -> PPOUpdate:
    torch.manual_seed(0)
    net = RecurrentActorCritic(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2), hidden_size=4)
    settings = PPOSettings(
        gamma=0.9, lmbda=0.95, sequence_length=4, epochs=1, num_minibatches=1,
        value_coef=0.5, entropy_coef=0.0, max_grad_norm=0.5, normalize_advantage=False,
        reward_scale=scale,
    )  # fmt: skip
    optimizer = torch.optim.Adam(net.parameters())
    return PPOUpdate(
        RecurrentActor(net), RecurrentCritic(net), optimizer,
        settings=settings, generator=torch.Generator().manual_seed(0),
    )  # fmt: skip


def _rollout() -> TensorDict:
    w, t = 2, 6
    flags = torch.zeros(w, t, 1, dtype=torch.bool)
    is_init = torch.zeros(w, t, 1, dtype=torch.bool)
    is_init[:, 0] = True
    net = RecurrentActorCritic(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2), hidden_size=4)
    # the stored states a collector keeps (GAE refuses a rollout without them)
    states = {key: torch.zeros(w, t, *net.state_shape) for key in net.state_keys}
    return TensorDict(
        {
            **states,
            "observation": torch.randn(w, t, 2),
            "is_init": is_init,
            "next": {
                **{key: state.clone() for key, state in states.items()},
                "observation": torch.randn(w, t, 2),
                "is_init": torch.zeros_like(flags),
                "reward": torch.randn(w, t, 1),
                "terminated": flags,
                "truncated": flags.clone(),
                "done": flags.clone(),
            },
        },
        batch_size=[w, t],
    )


def test_scaled_rewards_scale_the_returns_the_critic_learns():
    rollout = _rollout()
    plain = _update(1.0).prepare(rollout.clone())
    scaled = _update(0.1).prepare(rollout.clone())
    silent = rollout.clone()
    silent["next", "reward"] = torch.zeros_like(silent["next", "reward"])
    unrewarded = _update(1.0).prepare(silent)
    torch.testing.assert_close(scaled["next", "reward"], 0.1 * rollout["next", "reward"])
    torch.testing.assert_close(scaled["state_value"], plain["state_value"])  # the same critic
    # GAE is linear in the rewards: A(0.1 r) - A(0) = 0.1 * (A(r) - A(0))
    torch.testing.assert_close(
        scaled["advantage"] - unrewarded["advantage"],
        0.1 * (plain["advantage"] - unrewarded["advantage"]),
    )
    torch.testing.assert_close(scaled["value_target"], scaled["advantage"] + scaled["state_value"])


def test_reward_scale_must_be_positive():
    with pytest.raises(ValueError, match="reward_scale must be"):
        TrainConfig(reward_scale=0.0)


def test_the_novelty_bonus_is_scaled_with_the_reward():
    # scaled before the bonus was added, the bonus escaped reward_scale (0.01: 100x stronger
    # against the reward than set)
    from rppo_td import EpisodicNoveltyBonus

    rollout = _rollout()  # float observations: every next observation is new
    update = _update(0.1)
    update.novelty = EpisodicNoveltyBonus(1.0)
    out = update.prepare(rollout.clone())
    assert out["next", "novel"].all()
    torch.testing.assert_close(out["next", "reward"], 0.1 * (rollout["next", "reward"] + 1.0))
