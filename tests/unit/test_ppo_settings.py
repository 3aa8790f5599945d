"""PPOUpdate's settings reach the step: the gradient clip and advantage normalisation."""

from __future__ import annotations

import torch

from rppo_td.modules import RecurrentActor, RecurrentCritic
from rppo_td.train._ppo import PPOSettings, PPOUpdate
from tests.unit.test_target_kl import _net, _rollout


def _ppo(*, max_grad_norm: float, normalize_advantage: bool, lr: float) -> PPOUpdate:
    net = _net()
    settings = PPOSettings(
        gamma=0.9, lmbda=0.95, sequence_length=4, epochs=1, num_minibatches=1, value_coef=0.5,
        entropy_coef=0.0, max_grad_norm=max_grad_norm, normalize_advantage=normalize_advantage,
    )  # fmt: skip
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    return PPOUpdate(
        RecurrentActor(net), RecurrentCritic(net), optimizer,
        settings=settings, generator=torch.Generator().manual_seed(0),
    )  # fmt: skip


def test_the_gradient_clip_bounds_the_step():
    # one SGD step of rate 1: its length is the clipped gradient's norm (a mutant skipping the
    # clip moved the parameters by 0.78 and every test passed)
    ppo = _ppo(max_grad_norm=1e-3, normalize_advantage=False, lr=1.0)
    before = [p.detach().clone() for p in ppo.parameters]
    means = ppo(_rollout(), clip_epsilon=0.2)
    moved = torch.cat(
        [(p.detach() - b).flatten() for p, b in zip(ppo.parameters, before, strict=True)]
    )
    assert means["grad_norm"] > 1e-3  # the unclipped norm, logged
    assert 0 < moved.norm() <= 1e-3 * (1 + 1e-4)


def test_normalize_advantage_reaches_the_loss():
    # the same rollout with advantages far from mean 0 and deviation 1: the objective differs
    rollout = _rollout()
    rollout["next", "reward"] = rollout["next", "reward"] * 10 + 5
    losses = [
        _ppo(max_grad_norm=1e9, normalize_advantage=flag, lr=0.1)(
            rollout.clone(), clip_epsilon=0.2
        )["loss_objective"]
        for flag in (False, True)
    ]
    assert losses[0] != losses[1]
