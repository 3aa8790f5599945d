"""Building the pieces of a run from its config: spaces, agent, optimizer, seeding."""

from __future__ import annotations

import logging
import random

import gymnasium as gym
import numpy as np
import torch

from rppo_td.envs import make_env
from rppo_td.modules import RecurrentActorCritic, image_shaped, observation_leaves
from rppo_td.train._config import TrainConfig

__all__ = ["build_agent", "env_spaces", "seed_everything"]

log = logging.getLogger(__name__)


def env_spaces(env_id: str) -> tuple[gym.Space, gym.Space]:
    """``(observation_space, action_space)`` of one env."""
    env = make_env(env_id)
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def build_agent(config: TrainConfig) -> RecurrentActorCritic:
    """The actor-critic for ``config.env``'s spaces, on CPU.

    Logs a warning for each float ``Box`` observation of three dimensions shaped like an image
    (``[H, W, C]`` or ``[C, H, W]``, ``C`` of 1, 3 or 4): only ``uint8`` boxes go through the
    CNN, so it reaches the MLP flattened, which the user may not expect.
    """
    observation_space, action_space = env_spaces(config.env)
    for key, space in observation_leaves(observation_space):
        shape = tuple(getattr(space, "shape", None) or ())
        if image_shaped(space) and np.issubdtype(space.dtype, np.floating):
            log.warning(
                "observation %r is a float Box %s: the MLP reads it flattened (%d inputs); "
                "only uint8 Box images [H, W, C] or [C, H, W] go through the CNN",
                key,
                list(shape),
                int(np.prod(shape)),
            )
    return RecurrentActorCritic(
        observation_space,
        action_space,
        recurrence=config.recurrence,
        hidden_size=config.hidden_size,
        num_layers=config.num_layers,
        head_layers=config.head_layers,
        forget_bias=config.forget_bias,
        encoder_skip=config.encoder_skip,
        shared_critic=config.shared_critic,
        normalize_observations=config.normalize_observations,
        center_observations=config.center_observations,
        image_layout=config.image_layout,
    )


def seed_everything(seed: int) -> torch.Generator:
    """Seeds torch, numpy and python; returns the sampler's generator (seeded from ``seed``)."""
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)
    return torch.Generator().manual_seed(seed + 1)
