"""Side by side: sb3-contrib RecurrentPPO (rl-zoo's tuned settings) vs `rppo-train`.

Both train on rppo_td/CartPoleNoVel-v1 for the same env steps and seed, on this machine, one
after the other, each in its own process; both are then evaluated deterministically over 20
episodes. Prints both wall-clocks, returns and the ratio, and writes
benchmarks/results/peer_sb3-<UTC time>.json.

Needs the optional extra: pip install -e '.[bench]' (sb3-contrib; it keeps the installed torch).

rl-zoo's hyperparameters for RecurrentPPO on CartPoleNoVel-v1 (hyperparams/ppo_lstm.yml):
8 envs, n_steps 32, batch_size 256, n_epochs 20, gamma 0.98, gae_lambda 0.8, ent_coef 0,
learning_rate lin_1e-3, clip_range lin_0.2, MlpLstmPolicy with lstm_hidden_size 64,
enable_critic_lstm, ReLU, net_arch pi=[64] vf=[64], ortho_init False; 1e5 steps.

    python benchmarks/peer_sb3.py [--seed 0] [--total-steps 100000] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from _common import MAX_SEED, at_least, results_name, write_json

from rppo_td.train import SUMMARY_KEYS


def sb3_child(seed: int, total_steps: int, episodes: int, threads: int) -> None:
    """Runs in a child process: trains and evaluates sb3-contrib, prints one JSON line."""
    import numpy as np
    import torch
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    from rppo_td.envs import register_envs

    register_envs()

    if threads > 0:
        torch.set_num_threads(threads)

    env_id = "rppo_td/CartPoleNoVel-v1"

    def linear(start: float):
        return lambda progress_remaining: progress_remaining * start

    env = make_vec_env(env_id, n_envs=8, seed=seed)
    model = RecurrentPPO(
        "MlpLstmPolicy",
        env,
        n_steps=32,
        batch_size=256,
        n_epochs=20,
        gamma=0.98,
        gae_lambda=0.8,
        ent_coef=0.0,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        policy_kwargs={
            "ortho_init": False,
            "activation_fn": torch.nn.ReLU,
            "lstm_hidden_size": 64,
            "enable_critic_lstm": True,
            "net_arch": {"pi": [64], "vf": [64]},
        },
        seed=seed,
        verbose=0,
    )
    # the training alone, as rppo-train's wall_time_s (its updates; building the envs and the
    # model is outside both figures and inside the whole-process ones)
    start = time.perf_counter()
    model.learn(total_timesteps=total_steps)
    train_wall = time.perf_counter() - start
    eval_env = make_vec_env(env_id, n_envs=1, seed=seed + 10_000)
    returns, _ = evaluate_policy(
        model, eval_env, n_eval_episodes=episodes, deterministic=True, return_episode_rewards=True
    )
    print(
        json.dumps(
            {
                "eval_return_mean": float(np.mean(returns)),
                "eval_return_std": float(np.std(returns)),
                "eval_episodes": episodes,
                "env_steps": int(model.num_timesteps),
                "wall_time_s": train_wall,
                "fps": model.num_timesteps / train_wall,
                "torch_threads": torch.get_num_threads(),
            }
        )
    )


def timed(
    cmd: list[str], env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    return proc, time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=at_least(0, MAX_SEED), default=0)
    # one update of the default run (128 workers x 8 steps) at least
    parser.add_argument("--total-steps", type=at_least(1024), default=None, help="default 100,000")
    parser.add_argument("--episodes", type=at_least(1), default=None, help="default 20")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 2,048 steps, 2 evaluation episodes, unless given (peer_sb3_quick)",
    )
    parser.add_argument(
        "--output",
        type=results_name,
        default=None,
        help="results name (default peer_sb3-<UTC time>)",
    )
    parser.add_argument(
        "--threads",
        type=at_least(0),
        default=1,
        help="torch threads for both trainers (default 1, rppo-train's default; 0 keeps "
        "torch's default, 2 on a 2-core machine, which is much slower there when anything "
        "else runs)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.total_steps is None:  # a flag given wins over --quick
        args.total_steps = 2048 if args.quick else 100_000
    if args.episodes is None:
        args.episodes = 2 if args.quick else 20
    if args.child:
        sb3_child(args.seed, args.total_steps, args.episodes, args.threads)
        return 0
    try:
        import sb3_contrib  # noqa: F401
    except ImportError:
        # not a success: a script or CI loop reading the status must not take it for one
        print(
            "peer_sb3.py: error: sb3-contrib is not installed: pip install -e '.[bench]'",
            file=sys.stderr,
        )
        return 2

    # both runs' files (sb3's logger directory, rppo-train's output) go, however it ends
    scratch = Path(tempfile.mkdtemp(prefix="rppo_peer_"))
    try:
        return _compare(args, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _compare(args: argparse.Namespace, scratch: Path) -> int:
    """Trains sb3-contrib then rppo-train in child processes; prints and writes the ratios."""
    rows = {}
    load = {"before": os.getloadavg()[0]}
    proc, wall = timed(
        [
            sys.executable,
            __file__,
            "--child",
            "--seed",
            str(args.seed),
            "--total-steps",
            str(args.total_steps),
            "--episodes",
            str(args.episodes),
            "--threads",
            str(args.threads),
        ],
        env={**os.environ, "SB3_LOGDIR": str(scratch / "sb3")},
    )
    if proc.returncode != 0:
        print(proc.stderr[-3000:])
        return 1
    rows["sb3-contrib RecurrentPPO"] = {
        **json.loads(proc.stdout.strip().splitlines()[-1]),
        "process_wall_s": wall,
    }
    load["between"] = os.getloadavg()[0]
    out = scratch / "rppo"
    proc, wall = timed(
        [
            sys.executable,
            "-m",
            "rppo_td.train",
            "--seed",
            str(args.seed),
            "--total-steps",
            str(args.total_steps),
            "--output",
            str(out),
            "--no-progress",
            "--log-level",
            "WARNING",
            "--eval-episodes",
            str(args.episodes),
            "--threads",
            str(args.threads),
        ]
    )
    if proc.returncode != 0:
        print(proc.stderr[-3000:])
        return 1
    summary = json.loads((out / "summary.json").read_text())
    rows["rppo-train"] = {k: summary[k] for k in SUMMARY_KEYS}
    rows["rppo-train"]["process_wall_s"] = wall
    load["after"] = os.getloadavg()[0]

    print(
        f"rppo_td/CartPoleNoVel-v1, seed {args.seed}, {args.total_steps} steps, "
        f"{os.cpu_count()} CPUs, load(1m) {load}"
    )
    print(f"{'':>26} {'eval':>8} {'std':>6} {'train_s':>8} {'proc_s':>8} {'fps':>7}")
    for name, r in rows.items():
        print(
            f"{name:>26} {r['eval_return_mean']:>8.1f} {r['eval_return_std']:>6.1f} "
            f"{r['wall_time_s']:>8.1f} {r['process_wall_s']:>8.1f} {r['fps']:>7.0f}"
        )
    a, b = rows["sb3-contrib RecurrentPPO"], rows["rppo-train"]
    # the two round the budget differently (sb3-contrib up to whole rollouts of 8 x 32 steps,
    # rppo-train down to whole updates), so the time per env step is compared as well
    ratio = {
        "train_wall": a["wall_time_s"] / b["wall_time_s"],
        "process_wall": a["process_wall_s"] / b["process_wall_s"],
        "train_wall_per_step": (a["wall_time_s"] / a["env_steps"])
        / (b["wall_time_s"] / b["env_steps"]),
    }
    print(
        f"speed-up of rppo-train over sb3-contrib: {ratio['train_wall']:.2f}x (training), "
        f"{ratio['process_wall']:.2f}x (whole process), {ratio['train_wall_per_step']:.2f}x "
        f"(training time per env step: {a['env_steps']} and {b['env_steps']} steps)"
    )
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = write_json(
        args.output or ("peer_sb3_quick" if args.quick else f"peer_sb3-{stamp}"),
        {
            "when_utc": stamp,
            "seed": args.seed,
            "threads": args.threads,
            "load": load,
            "rows": rows,
            "ratio": ratio,
        },
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
