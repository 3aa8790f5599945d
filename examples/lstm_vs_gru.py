"""LSTM vs GRU (vs no memory) on the built-in partially observable CartPole.

Trains the library's agent three times with the same settings and seed, changing only the
recurrent core: ``lstm``, ``gru``, and ``none`` (the same encoder and heads without memory, the
control). ``rppo_td/CartPoleNoVel-v1`` hides the cart and pole velocities, so only an agent with
memory can infer them; 500 is the maximum return.

    python examples/lstm_vs_gru.py                  # the default budget (100k steps) per core
    RPPO_TD_TINY=1 python examples/lstm_vs_gru.py   # a few updates per core, for CI

Each run writes its metrics.csv, learning_curve.png, checkpoint.pt and summary.json under
``runs/lstm_vs_gru/<core>``.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, field

from rppo_td.envs import CARTPOLE_NOVEL_ID
from rppo_td.train import TrainConfig, train


@dataclass
class Config:
    """The comparison; ``RPPO_TD_TINY=1`` shrinks the budget for CI."""

    cores: tuple[str, ...] = ("lstm", "gru", "none")
    """Recurrent cores to compare (``none`` is the memory-less control)."""
    total_steps: int = 100_000
    """Env steps per run (all workers together)."""
    seed: int = 0
    """The seed every run shares."""
    overrides: dict[str, object] = field(default_factory=dict)
    """Any other ``TrainConfig`` fields, the same for every core."""
    output: str = "runs/lstm_vs_gru"
    """Parent directory of the runs' outputs."""


def make_config() -> Config:
    """The default config, or a tiny one when ``RPPO_TD_TINY`` is set."""
    if os.environ.get("RPPO_TD_TINY"):
        return Config(
            total_steps=256,
            overrides={
                "num_workers": 4,
                "rollout_steps": 32,
                "hidden_size": 8,
                "epochs": 1,
                "eval_episodes": 2,
            },
        )
    return Config()


def main(cfg: Config) -> None:
    """Trains one agent per core and prints a comparison table."""
    rows = []
    for core in cfg.cores:
        config = TrainConfig(
            env=CARTPOLE_NOVEL_ID,
            recurrence=core,
            total_steps=cfg.total_steps,
            seed=cfg.seed,
            output=os.path.join(cfg.output, core),
            progress=False,
            **cfg.overrides,
        )
        if not rows:
            print(
                f"{config.env}: rollouts [W, T] = [{config.num_workers}, "
                f"{config.rollout_steps}], sequences of at most L = {config.sequence_length}, "
                f"{config.num_updates} updates of {config.steps_per_update} steps per core"
            )
        start = time.perf_counter()
        summary = train(config)
        assert summary is not None  # None only when stopped by a signal
        rows.append((core, summary, time.perf_counter() - start))
        print(f"  {core}: done, outputs in {config.output_dir()}")

    # ---- the table ------------------------------------------------------------------------------
    print(f"\n{'core':6s} {'eval return':>16s} {'train s':>8s} {'steps/s':>8s} {'total s':>8s}")
    for core, summary, total in rows:
        print(
            f"{core:6s} {summary['eval_return_mean']:8.1f} ± {summary['eval_return_std']:5.1f} "
            f"{summary['wall_time_s']:8.1f} {summary['fps']:8.0f} {total:8.1f}"
        )
    print("eval return: deterministic episodes at the end of training (max 500); train s: the")
    print("collection and updates only; total s: with setup and evaluation.")


if __name__ == "__main__":
    # --help, and no option taken silently: the budget is set by RPPO_TD_TINY only
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    main(make_config())
