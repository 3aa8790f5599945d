"""The trainer's setup: every agent setting reaches the agent; one seed seeds every generator."""

from __future__ import annotations

import random

import numpy as np
import torch

from rppo_td.modules import RecurrentActorCritic
from rppo_td.modules._normalizer import ObservationNormalizer
from rppo_td.train import TrainConfig
from rppo_td.train._setup import build_agent, env_spaces, seed_everything

AGENT = {
    "recurrence": "lstm",
    "hidden_size": 8,
    "num_layers": 2,
    "head_layers": 2,
    "forget_bias": 3.0,
    "encoder_skip": True,
    "shared_critic": True,
    "normalize_observations": True,
    "center_observations": True,
}


def test_every_agent_setting_reaches_the_agent():
    # any one of them dropped on the way trained the default instead, with no word
    config = TrainConfig(**AGENT)
    torch.manual_seed(0)
    built = build_agent(config)
    torch.manual_seed(0)
    direct = RecurrentActorCritic(*env_spaces(config.env), **AGENT)
    ours, theirs = built.state_dict(), direct.state_dict()
    assert list(ours) == list(theirs)
    for key, value in ours.items():
        torch.testing.assert_close(value, theirs[key], msg=key)
    assert built.encoder_skip and built.shared_critic
    (normalizer,) = [m for m in built.modules() if isinstance(m, ObservationNormalizer)]
    assert normalizer.center is True  # not in the state dict


def test_one_seed_seeds_torch_numpy_and_python():
    # an env drawing from numpy's or Python's global generator ran otherwise on every run
    def draws(seed: int) -> tuple[list[float], ...]:
        generator = seed_everything(seed)
        return (
            torch.rand(3).tolist(),
            np.random.rand(3).tolist(),
            [random.random() for _ in range(3)],
            torch.rand(3, generator=generator).tolist(),
        )

    first, other = draws(123), draws(124)
    assert draws(123) == first
    assert all(a != b for a, b in zip(first, other, strict=True))
