"""Learning benchmark: does the default `rppo-train` solve rppo_td/CartPoleNoVel-v1?

Runs the default command (`rppo-train`, nothing but --seed/--output) for 5 seeds and the
`--recurrence none` control, each as its own process, one after another, and prints a table:
deterministic evaluation return over 20 episodes, the trainer's wall-clock (collection +
updates), the whole process's wall-clock (imports, env setup, final evaluation included), and
env steps per second. Results go to benchmarks/results/learning-<UTC time>.json.

Targets (issue 3): eval return >= 475 for >= 4 of 5 seeds within 100k env steps; wall-clock
<= 60 s per run on a 2-core CPU; control < 200. This script reports; it never fails on them
(exit status 1 only if a run crashed). Timing depends on what else runs on the machine: the
load average before and after each run is printed with it.

    python benchmarks/learning.py                 # 5 seeds + 2 control seeds
    python benchmarks/learning.py --seeds 0 1 --control-seeds 0 --total-steps 50000
    python benchmarks/learning.py --quick         # seed 0 and one control, 2,048 steps each
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from _common import at_least, check_seeds, results_name, run_trainer, train_refusal, write_json

from rppo_td.train import SUMMARY_KEYS

TARGET_RETURN, TARGET_SEEDS, TARGET_WALL, CONTROL_MAX = 475.0, 4, 60.0, 200.0


def run_one(recurrence: str | None, seed: int, total_steps: int | None, workdir: Path) -> dict:
    out = workdir / f"{recurrence or 'default'}-s{seed}"
    shutil.rmtree(out, ignore_errors=True)
    args = ["--seed", str(seed), "--no-progress", "--log-level", "WARNING"]
    if recurrence is not None:
        args += ["--recurrence", recurrence]
    if total_steps is not None:
        args += ["--total-steps", str(total_steps)]
    load_before = os.getloadavg()[0]
    run, summary = run_trainer(args, out)
    row = {
        "recurrence": recurrence or "lstm (default)",
        "seed": seed,
        **run,
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }
    if summary is None:
        return row
    row.update({k: summary[k] for k in SUMMARY_KEYS})
    row["eval_returns"] = summary.get("eval_returns", [])
    return row


def fmt(row: dict) -> str:
    if "error" in row:
        # the trainer's last line on stderr says why (a setting refused, an env that failed)
        lines = row["error"].strip().splitlines()
        why = f": {lines[-1]}" if lines else ""
        return f"{row['recurrence']:>16} {row['seed']:>4}  FAILED (exit {row['returncode']}){why}"
    return (
        f"{row['recurrence']:>16} {row['seed']:>4} {row['eval_return_mean']:>8.1f} "
        f"{row['eval_return_std']:>6.1f} {row['env_steps']:>8} {row['wall_time_s']:>8.1f} "
        f"{row['process_wall_s']:>8.1f} {row['fps']:>7.0f} "
        f"{row['load_before']:>5.2f}/{row['load_after']:.2f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0-4")
    parser.add_argument("--control-seeds", type=int, nargs="*", default=None, help="default 0 1")
    parser.add_argument(
        "--total-steps",
        type=at_least(1),
        default=None,
        help="override (default: the trainer's default, 100k)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: seed 0, control seed 0, 2,048 steps, unless given (learning_quick)",
    )
    parser.add_argument(
        "--output",
        type=results_name,
        default=None,
        help="results name (default learning-<UTC time>-<pid>)",
    )
    args = parser.parse_args()
    check_seeds(parser, "--seeds", args.seeds)
    check_seeds(parser, "--control-seeds", args.control_seeds)
    if args.seeds is None:  # a flag given wins over --quick
        args.seeds = [0] if args.quick else [0, 1, 2, 3, 4]
    if args.control_seeds is None:
        args.control_seeds = [0] if args.quick else [0, 1]
    if args.quick and args.total_steps is None:
        args.total_steps = 2048
    if args.total_steps is not None:
        # rppo-train's own check, before any run (below one update, every run would fail)
        refused = train_refusal(["--total-steps", str(args.total_steps)])
        if refused:
            parser.error(f"--total-steps: rppo-train refuses it: {refused}")

    workdir = Path(tempfile.mkdtemp(prefix="rppo_learning_"))
    header = (
        f"{'recurrence':>16} {'seed':>4} {'eval':>8} {'std':>6} {'steps':>8} "
        f"{'train_s':>8} {'proc_s':>8} {'fps':>7} load(1m) before/after"
    )
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"python {platform.python_version()}; runs in {workdir}"
    )
    print(header)
    rows = []
    for recurrence, seeds in ((None, args.seeds), ("none", args.control_seeds)):
        for seed in seeds:
            row = run_one(recurrence, seed, args.total_steps, workdir)
            rows.append(row)
            print(fmt(row), flush=True)

    main_rows = [r for r in rows if r["recurrence"] != "none" and "error" not in r]
    control = [r for r in rows if r["recurrence"] == "none" and "error" not in r]
    solved = sum(r["eval_return_mean"] >= TARGET_RETURN for r in main_rows)
    verdict = {
        "seeds_solved": solved,
        "seeds_run": len(main_rows),
        "return_target_met": solved >= min(TARGET_SEEDS, len(main_rows)) and bool(main_rows),
        "max_train_wall_s": max((r["wall_time_s"] for r in main_rows), default=None),
        "max_process_wall_s": max((r["process_wall_s"] for r in main_rows), default=None),
        "mean_fps": (sum(r["fps"] for r in main_rows) / len(main_rows)) if main_rows else None,
        "control_max_return": max((r["eval_return_mean"] for r in control), default=None),
    }
    verdict["wall_target_met"] = (
        verdict["max_process_wall_s"] is not None and verdict["max_process_wall_s"] <= TARGET_WALL
    )
    verdict["control_target_met"] = (
        verdict["control_max_return"] is not None and verdict["control_max_return"] < CONTROL_MAX
    )
    print()
    print(
        f"solved (eval >= {TARGET_RETURN:.0f}): {solved}/{len(main_rows)} seeds "
        f"(target >= {TARGET_SEEDS}/5): {'met' if verdict['return_target_met'] else 'NOT met'}"
    )
    if main_rows:
        print(
            f"wall-clock per run: trainer <= {verdict['max_train_wall_s']:.1f} s, whole process "
            f"<= {verdict['max_process_wall_s']:.1f} s (target <= {TARGET_WALL:.0f} s, i.e. "
            f"ratio {verdict['max_process_wall_s'] / TARGET_WALL:.2f}): "
            f"{'met' if verdict['wall_target_met'] else 'NOT met'}; mean fps "
            f"{verdict['mean_fps']:.0f}"
        )
    if control:
        print(
            f"control (--recurrence none) best eval {verdict['control_max_return']:.1f} "
            f"(target < {CONTROL_MAX:.0f}): "
            f"{'met' if verdict['control_target_met'] else 'NOT met'}"
        )

    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    default = "learning_quick" if args.quick else f"learning-{stamp}-{os.getpid()}"
    path = write_json(
        args.output or default,
        {
            "when_utc": stamp,
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "rows": rows,
            "verdict": verdict,
        },
    )
    print(f"wrote {path}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
