"""Solve rates over many seeds: how often does a setting of `rppo-train` reach the target?

One seed's return is one draw, and it does not carry over between machines (the same code forks
in the last bits of its arithmetic on another CPU, docs/results.md); the rate over many seeds
does. This script runs each setting (the trainer's flags) for every seed, `--jobs` runs at once
(each a process with one torch thread), and prints the number solved (deterministic evaluation
return >= `--target`) with a 95% Wilson interval, the returns, and the trainer's wall-clock.
Results go to benchmarks/results/robustness-<UTC time>.json.

    python benchmarks/robustness.py --seeds 0-29                        # the defaults, 30 seeds
    python benchmarks/robustness.py --quick                             # a smoke run
    python benchmarks/robustness.py --seeds 0-9 --jobs 2 \\
        --setting "defaults=" \\
        --setting "refreshed=--start-state refreshed --burn-in 4"

Wall-clock figures of runs made `--jobs` at a time are not those of a run alone: compare them
between settings of one invocation only. This script reports; it never fails on a rate (exit
status 1 only if a run crashed).
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import shutil
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

from _common import (
    MAX_SEED,
    finite_float,
    print_table,
    results_name,
    run_trainer,
    train_refusal,
    wilson,
    write_json,
)

QUIET = ["--overwrite", "--no-progress", "--log-level", "WARNING", "--threads", "1"]


def parse_seeds(text: list[str]) -> list[int]:
    """``["0-3", "7"]`` -> ``[0, 1, 2, 3, 7]``; a range is inclusive of both ends."""
    seeds: list[int] = []
    for part in text:
        low, sep, high = part.partition("-")
        try:
            first, last = int(low), int(high) if sep else int(low)
        except ValueError:
            raise SystemExit(f"--seeds: {part!r} is not a seed or a range such as 0-29") from None
        if first < 0 or last < first or last > MAX_SEED:
            raise SystemExit(f"--seeds: {part!r} must be N or A-B with 0 <= A <= B <= {MAX_SEED}")
        seeds.extend(range(first, last + 1))
    if len(set(seeds)) != len(seeds):
        raise SystemExit(f"--seeds: a seed is given twice in {' '.join(text)}")
    return seeds


def quick_flags(flags: list[str]) -> list[str]:
    """``--quick``'s budget, ``--total-steps 2048 --eval-episodes 2``, less what ``flags`` set."""
    given = {flag.partition("=")[0] for flag in flags if flag.startswith("--")}
    quick = {"--total-steps": "2048", "--eval-episodes": "2"}
    return [item for flag, value in quick.items() if flag not in given for item in (flag, value)]


def parse_setting(text: str) -> tuple[str, list[str]]:
    """``"name=--flag value ..."`` -> ``("name", ["--flag", "value"])``."""
    name, sep, flags = text.partition("=")
    if not sep or not name.strip():
        raise SystemExit(f"--setting must be NAME=FLAGS (FLAGS may be empty), got {text!r}")
    return name.strip(), shlex.split(flags)


def check_setting(name: str, flags: list[str]) -> None:
    """Exits before any run when ``rppo-train`` would refuse the setting's flags (naming
    them and its own one-line message), instead of every seed failing on it."""
    set_here = ("--seed", "--threads", "--log-level", "--progress", "--no-progress")
    for flag in (*set_here, "--overwrite", "--no-overwrite"):  # a later flag would win
        if any(f == flag or f.startswith(flag + "=") for f in flags):
            raise SystemExit(f"--setting {name!r}: {flag} is set by this script; drop it")
    message = train_refusal([*flags, "--seed", "0", *QUIET])
    if message is not None:
        raise SystemExit(f"--setting {name!r}: rppo-train refuses its flags {flags}: {message}")


def run_one(flags: list[str], seed: int, out: Path) -> dict:
    run, summary = run_trainer([*flags, "--seed", str(seed), *QUIET], out)
    row = {"seed": seed, **run}
    if summary is not None:
        for key in (
            "eval_return_mean",
            "env_steps",
            "wall_time_s",
            "collect_time_s",
            "learn_time_s",
        ):
            row[key] = summary[key]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", nargs="+", default=["0-29"], help="seeds and ranges (0-29)")
    parser.add_argument(
        "--setting",
        action="append",
        default=None,
        help='NAME=FLAGS, repeatable (default: "defaults=", the trainer as it is)',
    )
    parser.add_argument("--jobs", type=int, default=2, help="runs at once (default 2)")
    parser.add_argument("--target", type=finite_float, default=475.0, help="solved: eval >= this")
    parser.add_argument("--keep", action="store_true", help="keep the run directories")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="seeds 0-1 of each setting on 2,048 steps, 2 evaluation episodes (a smoke run)",
    )
    parser.add_argument(
        "--output",
        type=results_name,
        default=None,
        help="results name (default robustness-<UTC time>)",
    )
    args = parser.parse_args()
    if args.jobs < 1:
        raise SystemExit(f"--jobs must be >= 1, got {args.jobs}")
    seeds = parse_seeds(args.seeds)
    settings = [parse_setting(text) for text in (args.setting or ["defaults="])]
    if args.quick:
        seeds = seeds[:2]
        # only the settings a setting does not give itself
        settings = [(name, [*flags, *quick_flags(flags)]) for name, flags in settings]
    names = [name for name, _ in settings]
    if len(set(names)) != len(names):
        raise SystemExit(f"--setting: two settings share a name in {names}")
    for name, flags in settings:
        check_setting(name, flags)

    workdir = Path(tempfile.mkdtemp(prefix="rppo_robustness_"))
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
        f"{len(settings)} settings x {len(seeds)} seeds, {args.jobs} at once; runs in {workdir}"
    )
    results = []
    for name, flags in settings:
        with ThreadPoolExecutor(args.jobs) as pool:
            rows = list(
                pool.map(lambda s: run_one(flags, s, workdir / f"{name}-s{s}"), seeds)  # noqa: B023
            )
        done = [r for r in rows if "error" not in r]
        solved = sum(r["eval_return_mean"] >= args.target for r in done)
        low, high = wilson(solved, len(done))
        walls = [r["wall_time_s"] for r in done]
        result = {
            "setting": name,
            "flags": flags,
            "solved": solved,
            "runs": len(done),
            "crashed": len(rows) - len(done),
            "wilson_95": [low, high],
            "median_wall_time_s": statistics.median(walls) if walls else None,
            "rows": rows,
        }
        results.append(result)
        returns = " ".join(
            f"{r['eval_return_mean']:.0f}" if "error" not in r else "crash" for r in rows
        )
        print(f"{name} ({' '.join(flags) or 'the defaults'}): {solved}/{len(done)}; {returns}")
        for r in rows:
            if "error" in r:
                print(f"  seed {r['seed']} crashed (exit {r['returncode']}): {r['error'][-400:]}")

    print()
    print_table(
        ["setting", "solved", "95% interval", "median train s"],
        [
            [
                r["setting"],
                f"{r['solved']}/{r['runs']}",
                f"{r['wilson_95'][0]:.2f}-{r['wilson_95'][1]:.2f}",
                f"{r['median_wall_time_s']:.1f}" if r["median_wall_time_s"] else "-",
            ]
            for r in results
        ],
    )
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = write_json(
        args.output or ("robustness_quick" if args.quick else f"robustness-{stamp}"),
        {
            "when_utc": stamp,
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "processor": platform.processor(),
            "seeds": seeds,
            "jobs": args.jobs,
            "target": args.target,
            "results": results,
        },
    )
    print(f"wrote {path}")
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if any(r["crashed"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
