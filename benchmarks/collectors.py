"""Collection speed: TorchRL's Collector vs the gymnasium SyncVectorEnv loop; torch threads.

Both collectors write the same [W, T] TensorDict for the same LSTM agent on
rppo_td/CartPoleNoVel-v1. Also times one PPO update (default settings) with 1 and 2 torch
threads. Prints steps/s and ms per update; numbers depend on machine load (printed).

    python benchmarks/collectors.py [--workers 8] [--steps 32] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from rppo_td.train import TrainConfig, Trainer
from rppo_td.train._torchrl_collector import TorchRLCollector


def collect_fps(collector, workers: int, steps: int, repeats: int) -> float:
    collector.rollout()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        collector.rollout()
    return repeats * workers * steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=TrainConfig().num_workers)
    parser.add_argument("--steps", type=int, default=TrainConfig().rollout_steps)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(
        f"{os.cpu_count()} CPUs, load(1m) {os.getloadavg()[0]:.2f}; W={args.workers}, "
        f"T={args.steps}"
    )
    for threads in (1, 2):
        torch.set_num_threads(threads)
        config = TrainConfig(
            num_workers=args.workers,
            rollout_steps=args.steps,
            output=f"/tmp/rppo_collectors_{threads}",
            progress=False,
            threads=threads,
        )
        trainer = Trainer(config)
        vector = collect_fps(trainer.collector, args.workers, args.steps, args.repeats)
        torchrl = collect_fps(
            TorchRLCollector(
                config.env, trainer.agent, num_envs=args.workers, rollout_steps=args.steps, seed=0
            ),
            args.workers,
            args.steps,
            args.repeats,
        )
        rollout = trainer.collector.rollout()
        trainer.ppo(rollout.clone(), clip_epsilon=0.2)
        start = time.perf_counter()
        for _ in range(args.repeats):
            trainer.ppo(rollout.clone(), clip_epsilon=0.2)
        update_ms = (time.perf_counter() - start) / args.repeats * 1000
        print(
            f"threads={threads}: vector {vector:7.0f} steps/s | torchrl {torchrl:7.0f} steps/s "
            f"| ratio {vector / torchrl:4.1f}x | PPO update {update_ms:6.1f} ms "
            f"({config.epochs} epochs x {config.num_minibatches} minibatch)"
        )
    print(f"load(1m) after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
