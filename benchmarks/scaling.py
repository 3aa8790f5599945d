"""Multi-process collection: env steps/s for 0/1/2 env processes, and where the time goes.

Candidates, timed interleaved in one run (``_common.time_interleaved``, medians), each one
whole ``[W, T]`` rollout of the trainer's ``VectorCollector`` and LSTM agent
(``build_agent(TrainConfig())``):

- ``rollout N=0``: in-process ``SyncVectorEnv`` of the same checked envs
  (``make_vector_env(env, W, arrays=False)``: for the default task ``make_vector_env`` would
  otherwise step ``CartPoleNoVelVectorEnv``'s arrays, about five times faster, and the process
  overhead fitted below would hold that difference too).
- ``rollout N=1`` / ``N=2``: ``make_vector_env(env, W, processes=N)``: TorchRL's
  ``ParallelEnv`` of ``N`` workers, each stepping ``W / N`` checked envs.

and the parts of the cost model, timed in the same loop:

- ``env N``: ``T`` steps of the same vector env with fixed actions, no policy; ``env arrays``
  the same for ``make_vector_env``'s default (the trainer's env; for the default task its
  arrays, else the same as ``env N=0``).
- ``async W procs``: gymnasium's ``AsyncVectorEnv`` (one process per env, ``SAME_STEP``),
  the other library candidate, env stepping only.
- ``policy``: ``T`` forwards of ``RecurrentPolicy`` on a ``[W]`` batch.
- ``update``: one PPO update (``PPOUpdate``) of a rollout, the trainer's settings.

Cost model per update: ``t(N) = t_policy + t_update + t_ipc + t_env(0) / N`` with ``t_ipc``
the per-rollout cost of crossing processes, fitted as ``t_env(1) - t_env(0)`` (one worker
does the in-process work plus the round trips). Predicted steps/s for ``N`` free cores is
``W * T / t(N)``; on this machine (2 cores shared by the trainer and its workers) the measured
``N=2`` figure is below the prediction.

Then ``torchrun`` runs of 1 and 2 learner ranks (``learner_ranks``): env steps per second of
the whole run, each rank with its own ``W`` envs. On 2 cores two ranks share the cores, so this
shows the cost of the all-reduces rather than a speed-up.

    python benchmarks/scaling.py [--workers 16] [--steps 32] [--repeats 9] [--output NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from _common import (
    at_least,
    format_seconds,
    print_table,
    results_name,
    time_interleaved,
    write_json,
)

from rppo_td.envs import make_env, make_vector_env, resolve_env_id
from rppo_td.modules import RecurrentPolicy
from rppo_td.train import TrainConfig, Trainer
from rppo_td.train._vector_collector import VectorCollector


def _stepper(env: gym.vector.VectorEnv, steps: int):
    env.reset(seed=0)
    actions = np.stack([env.single_action_space.sample() for _ in range(env.num_envs)])

    def run() -> None:
        for _ in range(steps):
            env.step(actions)

    return run


def learner_ranks(workers: int, steps: int, updates: int) -> dict[int, dict[str, float]]:
    """Env steps per second of ``torchrun`` runs of 1 and 2 learner ranks (gloo, this machine).

    Each rank has its own ``workers`` envs; ``total_steps`` gives every run ``updates`` updates.
    The figure is the run's ``summary.json`` ``fps``: env steps of all ranks over the training
    time (collection and updates; start-up and evaluation excluded).
    """
    out: dict[int, dict[str, float]] = {}
    for ranks in (1, 2):
        with tempfile.TemporaryDirectory() as tmp:
            total = workers * steps * ranks * updates
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            command += ["--nproc-per-node", str(ranks), "-m", "rppo_td.train"]
            command += ["--num-workers", str(workers), "--rollout-steps", str(steps)]
            command += ["--total-steps", str(total), "--eval-episodes", "0", "--no-progress"]
            command += ["--output", f"{tmp}/run"]
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            subprocess.run(command, check=True, capture_output=True, env=env, timeout=900)
            summary = json.loads(Path(tmp, "run", "summary.json").read_text())
            out[ranks] = {"fps": summary["fps"], "wall_time_s": summary["wall_time_s"]}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=at_least(1), default=16)
    parser.add_argument("--steps", type=at_least(1), default=32)
    parser.add_argument("--repeats", type=at_least(1), default=9)
    parser.add_argument("--output", type=results_name, default="scaling")
    parser.add_argument(
        "--rank-updates", type=at_least(1), default=20, help="updates per torchrun run"
    )
    args = parser.parse_args()
    if args.workers % 2:
        parser.error(
            f"--workers must be even (2 env processes share them equally), got {args.workers}"
        )
    w, t = args.workers, args.steps
    with tempfile.TemporaryDirectory() as tmp:
        config = TrainConfig(
            num_workers=w, rollout_steps=t, total_steps=w * t * 10, output=tmp, overwrite=True
        )
        trainer = Trainer(config)
        torch.set_num_threads(config.threads)
        net, name = trainer.agent, resolve_env_id(config.env)
        envs = {n: make_vector_env(name, w, processes=n, arrays=False) for n in (0, 1, 2)}
        trainers_env = make_vector_env(name, w)
        collectors = {
            n: VectorCollector(
                make_vector_env(name, w, processes=n, arrays=False),
                RecurrentPolicy(net),
                leaves=net.leaves,
                frames_per_batch=w * t,
                seed=0,
            )
            for n in (0, 1, 2)
        }
        async_env = gym.vector.AsyncVectorEnv(
            [lambda: make_env(name)] * w, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )
        rollout = collectors[0].rollout()
        policy = RecurrentPolicy(net)
        carry = rollout[:, 0].exclude("next")

        def forward() -> None:
            with torch.no_grad():
                for _ in range(t):
                    policy(carry.clone(False))

        def update() -> None:
            trainer.ppo(rollout, clip_epsilon=0.2)

        candidates = {f"rollout N={n}": collectors[n].rollout for n in (0, 1, 2)}
        candidates |= {f"env N={n}": _stepper(envs[n], t) for n in (0, 1, 2)}
        candidates["env arrays"] = _stepper(trainers_env, t)
        candidates[f"async {w} procs"] = _stepper(async_env, t)
        candidates["policy"] = forward
        candidates["update"] = update
        load_before = os.getloadavg()
        times = time_interleaved(candidates, repeats=args.repeats)
        load_after = os.getloadavg()
        for collector in collectors.values():
            collector.shutdown()
        for env in (*envs.values(), trainers_env):
            env.close()
        async_env.close()
        trainer.release()
    med = {k: v["median"] for k, v in times.items()}
    frames = w * t
    t_ipc = max(med["env N=1"] - med["env N=0"], 0.0)
    fixed = med["policy"] + med["update"]
    predicted = {
        n: frames / (fixed + t_ipc + med["env N=0"] / n) if n else frames / (fixed + med["env N=0"])
        for n in (0, 1, 2, 4, 8, 16)
    }
    measured = {n: frames / (med[f"rollout N={n}"] + med["update"]) for n in (0, 1, 2)}
    rows = [
        [name, format_seconds(s), f"{frames / s:,.0f}", f"{med['rollout N=0'] / s:.2f}"]
        for name, s in med.items()
    ]
    print(f"W={w} T={t}, {os.cpu_count()} cores, load {load_before} -> {load_after}")
    print_table(["candidate", "median", "steps/s", "rollout N=0 / this"], rows)
    print("train steps/s (rollout + update):", {n: round(v) for n, v in measured.items()})
    print("predicted on N free cores:", {n: round(v) for n, v in predicted.items()})
    ranks = learner_ranks(w, t, args.rank_updates)
    print(
        "learner ranks (torchrun, gloo; each rank its own envs): "
        + ", ".join(f"{r}: {v['fps']:,.0f} steps/s" for r, v in ranks.items())
    )
    path = write_json(
        args.output,
        {
            "workers": w,
            "steps": t,
            "repeats": args.repeats,
            "load": [load_before, load_after],
            "times": times,
            "cost_model_s": {
                "env_in_process": med["env N=0"],
                "ipc_per_rollout": t_ipc,
                "policy": med["policy"],
                "update": med["update"],
            },
            "measured_train_steps_per_s": measured,
            "predicted_train_steps_per_s": predicted,
            "learner_ranks_steps_per_s": {r: v["fps"] for r, v in ranks.items()},
        },
    )
    print(path)


if __name__ == "__main__":
    main()
