"""Train the library's recurrent PPO agent on your own gymnasium environment.

The environment below, ``RecallCue``, needs memory: a cue (-1 or +1) is shown at the first step
only; after ``delay`` blank steps the agent is asked which cue it saw, and is paid +1 for the
right answer and -1 for the wrong one. A policy without memory can do no better than guessing
(expected return 0); an LSTM can reach 1.

    python examples/custom_env.py                  # LSTM, then the memory-less control
    RPPO_TD_TINY=1 python examples/custom_env.py   # a few updates each, for CI

From the command line, put the class in a module that registers it when imported, and pass
``module:EnvId``:  ``rppo-train --env my_envs:RecallCue-v0``.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from rppo_td.train import TrainConfig, train

ENV_ID = "rppo_td_examples/RecallCue-v0"


# ---- the environment ----------------------------------------------------------------------------
class RecallCue(gym.Env):
    """Remember a cue across ``delay`` blank steps, then report it.

    Observation ``[cue, query]`` (float32, shape ``(2,)``): ``[c, 0]`` at the first step with
    ``c`` in ``{-1, +1}``, ``[0, 0]`` while waiting, ``[0, 1]`` when asked. Action ``Discrete(2)``:
    ignored while waiting; at the query, 1 means "+1" and 0 means "-1". The episode terminates
    after the query (``delay + 2`` steps in all).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, delay: int = 4) -> None:
        self.delay = delay
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._cue = 1.0
        self._t = 0  # actions taken so far in this episode

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Draws a cue and shows it."""
        super().reset(seed=seed)
        self._cue = float(self.np_random.choice([-1.0, 1.0]))
        self._t = 0
        return np.array([self._cue, 0.0], dtype=np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Blank steps, then the query, then the answer is scored and the episode ends."""
        self._t += 1
        if self._t <= self.delay:  # waiting: nothing to see, nothing to earn
            return np.zeros(2, dtype=np.float32), 0.0, False, False, {}
        if self._t == self.delay + 1:  # ask
            return np.array([0.0, 1.0], dtype=np.float32), 0.0, False, False, {}
        correct = (int(action) == 1) == (self._cue > 0)
        return np.zeros(2, dtype=np.float32), 1.0 if correct else -1.0, True, False, {}


gym.register(id=ENV_ID, entry_point=RecallCue, kwargs={"delay": 4})


# ---- the experiment -----------------------------------------------------------------------------
@dataclass
class Config:
    """What to train; ``RPPO_TD_TINY=1`` shrinks the budget for CI."""

    total_steps: int = 40_000
    """Env steps per run (all workers together)."""
    num_workers: int = 8
    """W: environments stepped side by side."""
    rollout_steps: int = 32
    """T: steps per environment per update."""
    sequence_length: int = 8
    """L: BPTT length; longer than an episode (6 steps) so each episode is one sequence."""
    hidden_size: int = 32
    """Width of the encoder, the recurrent core and the heads."""
    seed: int = 0
    """Seed of the run."""
    output: str = "runs/custom_env"
    """Parent directory of the runs' outputs."""


def make_config() -> Config:
    """The default config, or a tiny one when ``RPPO_TD_TINY`` is set."""
    if os.environ.get("RPPO_TD_TINY"):
        return Config(
            total_steps=256,
            num_workers=4,
            rollout_steps=32,
            hidden_size=8,
        )
    return Config()


def main(cfg: Config) -> None:
    """Trains the LSTM agent and the memory-less control, and prints both evaluations."""
    env = gym.make(ENV_ID)
    obs, _ = env.reset(seed=cfg.seed)
    print(f"{ENV_ID}: observation {env.observation_space.shape}, actions {env.action_space}")
    print(f"first observation {obs}  (cue, query)")
    env.close()
    print(
        f"rollouts [W, T] = [{cfg.num_workers}, {cfg.rollout_steps}], sequences of at most "
        f"L = {cfg.sequence_length} steps, {cfg.total_steps} env steps per run"
    )

    results = {}
    for recurrence in ("lstm", "none"):
        config = TrainConfig(
            env=ENV_ID,
            recurrence=recurrence,
            total_steps=cfg.total_steps,
            num_workers=cfg.num_workers,
            rollout_steps=cfg.rollout_steps,
            sequence_length=cfg.sequence_length,
            hidden_size=cfg.hidden_size,
            gamma=0.99,
            entropy_coef=0.01,
            eval_episodes=50,
            seed=cfg.seed,
            output=os.path.join(cfg.output, recurrence),
            progress=False,
        )
        summary = train(config)
        assert summary is not None  # None only when stopped by a signal
        results[recurrence] = summary
        print(
            f"{recurrence:5s} eval return {summary['eval_return_mean']:+.2f} "
            f"± {summary['eval_return_std']:.2f} over {summary['eval_episodes']} episodes, "
            f"{summary['wall_time_s']:.1f} s, outputs in {config.output_dir()}"
        )
    print("A memory-less policy can only guess the cue: its expected return is 0; the best is 1.")


if __name__ == "__main__":
    # --help, and no option taken silently: the budget is set by RPPO_TD_TINY only
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    main(make_config())
