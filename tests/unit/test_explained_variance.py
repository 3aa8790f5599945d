"""The logged explained_variance: the rollout's, as stable-baselines3 logs it, or nothing."""

from __future__ import annotations

import csv

import numpy as np
import torch
from tensordict import TensorDict

from rppo_td.train import TrainConfig, Trainer
from rppo_td.train._ppo import rollout_explained_variance


def _rollout(target: torch.Tensor, value: torch.Tensor) -> TensorDict:
    return TensorDict({"value_target": target, "state_value": value}, batch_size=target.shape[:2])


def test_against_the_formula_and_undefined_for_constant_targets():
    g = torch.Generator().manual_seed(0)
    target, value = torch.randn(4, 9, 1, generator=g), torch.randn(4, 9, 1, generator=g)
    y, p = target.double().numpy().ravel(), value.double().numpy().ravel()
    expected = 1 - np.var(y - p) / np.var(y)  # stable-baselines3's explained_variance
    assert abs(rollout_explained_variance(_rollout(target, value)) - expected) < 1e-12
    assert rollout_explained_variance(_rollout(target, target)) == 1.0
    # targets that do not vary: undefined (the loss's eps-guarded figure gave -4e5 here)
    ones = torch.ones(4, 9, 1)
    assert rollout_explained_variance(_rollout(ones, value)) is None
    assert rollout_explained_variance(_rollout(ones * 1e6, value)) is None


def test_one_step_minibatches_and_constant_targets_log_no_made_up_figure(tmp_path):
    # one-step minibatches logged 1.0 at every update; gamma 0 on a task paying 1 a step
    # (all targets 1) logged -18158 ... -442112
    def run(name, **settings):
        config = TrainConfig(
            total_steps=128, num_workers=4, rollout_steps=8, eval_episodes=0, progress=False,
            hidden_size=8, output=str(tmp_path / name), **settings,
        )  # fmt: skip
        Trainer(config).run()
        with (tmp_path / name / "metrics.csv").open() as f:
            return [row["explained_variance"] for row in csv.DictReader(f)]

    single = run("single", sequence_length=1, num_minibatches=32)
    assert len(single) == 4 and all(value and float(value) != 1.0 for value in single)
    # the rollout's figure does not depend on how it is cut into minibatches
    assert run("whole")[0] == single[0]
    assert run("gamma0", gamma=0.0) == [""] * 4
