"""Runs the adversarial pass and prints the outcome table.

    python -m tests.adversarial.run_pass [--only PREFIX] [--jobs N] [--json out.json]
                                         [--markdown out.md] [--list]

Every case is classified as correct / clear error / silent wrong / traceback / data lost /
code run (see ``tests/adversarial/core.py``). In-process library cases run one after another
(each under a time limit); subprocess cases run ``--jobs`` at a time. The code is imported and
run as it is on disk when the pass starts, so the table measures the tree at run time.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import importlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path

from tests.adversarial import core
from tests.adversarial.core import OUTCOMES, SKIPPED, TRACEBACK, Case, Result, short

MODULES = [
    "tests.adversarial.cases_functional",
    "tests.adversarial.cases_transforms",
    "tests.adversarial.cases_cli",
    "tests.adversarial.cases_checkpoint",
    "tests.adversarial.cases_rundir",
]
CATEGORY_ORDER = [
    "A. functional",
    "A. transforms",
    "A. samplers",
    "B. train config",
    "B. eval config",
    "C. checkpoints",
    "D. run directories",
    "D. interruptions",
    "D. faulty envs",
]


class CaseTimeout(Exception):
    """An in-process case ran past its limit."""


def collect() -> tuple[list[Case], list[str]]:
    cases: list[Case] = []
    problems: list[str] = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
            cases.extend(module.all_cases())
        except Exception as err:
            problems.append(f"{name}: building its cases failed: {type(err).__name__}: {err}")
    seen: set[str] = set()
    for c in cases:
        if c.id in seen:
            problems.append(f"duplicate case id {c.id}")
        seen.add(c.id)
    return cases, problems


def _run_one(case: Case) -> Result:
    tmp = Path(tempfile.mkdtemp(prefix="rppo_adv_"))
    start = time.perf_counter()
    try:
        result = case.fn(tmp)
    except core.FixtureError as err:
        result = Result(SKIPPED, str(err))
    except CaseTimeout:
        result = Result(TRACEBACK, f"in-process case ran past {case.timeout:.0f}s (hung)")
    except Exception as err:
        tb = traceback.extract_tb(err.__traceback__)
        where = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else "?"
        result = Result(TRACEBACK, f"{type(err).__name__} at {where}: {short(str(err), 110)}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result.seconds = time.perf_counter() - start
    if result.outcome not in (*OUTCOMES, SKIPPED):
        result = Result(TRACEBACK, f"harness: unknown outcome {result.outcome!r}")
    return result


def run_proc_case(case: Case) -> Result:
    """A subprocess case; rerun once (then skipped) when the machine, not the code, failed."""
    result = _run_one(case)
    for attempt in range(2):
        if not any(t in result.reason for t in core.ENVIRONMENT_TROUBLE):
            return result
        if attempt == 1:
            return Result(SKIPPED, f"environment trouble twice: {result.reason}")
        time.sleep(10)
        result = _run_one(case)
    return result


def _alarm(_signum, _frame):
    raise CaseTimeout


def run_lib(case: Case) -> Result:
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, case.timeout)
    try:
        return _run_one(case)
    except CaseTimeout:  # fired between the case and the cleanup
        return Result(TRACEBACK, f"in-process case ran past {case.timeout:.0f}s (hung)")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def table(cases: list[Case], results: dict[str, Result]) -> str:
    cats = [c for c in CATEGORY_ORDER if any(k.category == c for k in cases)]
    cats += sorted({k.category for k in cases} - set(cats))
    skipped_any = any(r.outcome == SKIPPED for r in results.values())
    cols = ["tried", *OUTCOMES, *([SKIPPED] if skipped_any else []), "long usage (>3 lines)"]
    lines = ["| category | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    totals = dict.fromkeys(cols, 0)
    for cat in cats:
        mine = [results[k.id] for k in cases if k.category == cat and k.id in results]
        counts = {
            "tried": len(mine),
            **{o: sum(r.outcome == o for r in mine) for o in (*OUTCOMES, SKIPPED)},
            "long usage (>3 lines)": sum(r.long_usage for r in mine),
        }
        for c in cols:
            totals[c] += counts[c]
        lines.append(f"| {cat} | " + " | ".join(str(counts[c]) for c in cols) + " |")
    lines.append("| **total** | " + " | ".join(f"**{totals[c]}**" for c in cols) + " |")
    return "\n".join(lines)


def failures(cases: list[Case], results: dict[str, Result]) -> str:
    out = []
    for c in cases:
        r = results.get(c.id)
        if r is None or r.outcome in core.GOOD:
            continue
        out.append(f"- `{c.id}` **{r.outcome}**: {r.reason}")
    return "\n".join(out) if out else "(none)"


def long_usage_note(cases: list[Case], results: dict[str, Result]) -> str:
    ids = [c.id for c in cases if c.id in results and results[c.id].long_usage]
    if not ids:
        return ""
    return (
        f"{len(ids)} clear errors print a usage/error block longer than 3 lines "
        f"(e.g. {', '.join('`' + i + '`' for i in ids[:3])})."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.adversarial.run_pass", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        help="run the cases whose id starts with PREFIX (repeat or comma-separate)",
    )
    parser.add_argument("--jobs", type=int, default=2, help="parallel subprocess cases (2)")
    parser.add_argument("--json", help="write every case's outcome to this JSON file")
    parser.add_argument("--markdown", help="write the report to this markdown file")
    parser.add_argument("--list", action="store_true", help="list the case ids and exit")
    parser.add_argument("--quiet", action="store_true", help="no per-case progress lines")
    parser.add_argument(
        "--no-fork",
        action="store_true",
        help="run every command as a fresh `python -m` subprocess instead of "
        "forking it from a server that imported torch/torchrl once (slower)",
    )
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be >= 1")
    warnings.simplefilter("ignore")
    os.environ.setdefault("RL_LOGGING_LEVEL", "WARNING")
    try:
        import torch
        import torchrl  # noqa: F401 (its logger, silenced below)

        torch.set_num_threads(1)
    except Exception:
        pass
    logging.getLogger("torchrl").setLevel(logging.WARNING)

    all_cases, problems = collect()
    prefixes = [p for chunk in args.only for p in chunk.split(",") if p]
    cases = [c for c in all_cases if not prefixes or any(c.id.startswith(p) for p in prefixes)]
    if args.list:
        for c in cases:
            print(f"{c.id}\t{c.category}\t{c.kind}")
        return 0
    for p in problems:
        print(f"harness problem: {p}", file=sys.stderr)

    started = time.perf_counter()
    results: dict[str, Result] = {}
    lock = threading.Lock()
    done = [0]

    def record(case: Case, result: Result) -> None:
        with lock:
            results[case.id] = result
            done[0] += 1
            if not args.quiet:
                reason = f" - {short(result.reason, 100)}" if result.reason else ""
                print(
                    f"[{done[0]}/{len(cases)}] {case.id}: {result.outcome} "
                    f"({result.seconds:.1f}s){reason}",
                    file=sys.stderr,
                    flush=True,
                )

    lib = [c for c in cases if c.kind == "lib"]
    proc = [c for c in cases if c.kind != "lib"]
    forked = bool(proc) and not args.no_fork and core.start_fork_server()
    if proc and not args.no_fork and not forked:
        print("fork server did not start: plain subprocesses", file=sys.stderr)
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = {pool.submit(run_proc_case, c): c for c in proc}
            for c in lib:
                record(c, run_lib(c))
            for fut in concurrent.futures.as_completed(futures):
                record(futures[fut], fut.result())
    finally:
        core.cleanup_fixtures()
        core.stop_fork_server()
    elapsed = time.perf_counter() - started

    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    report = [
        f"Adversarial pass, {stamp}: {len(cases)} cases in {elapsed:.0f} s "
        f"(--jobs {args.jobs}{', --only ' + ','.join(prefixes) if prefixes else ''}, "
        f"{'forked commands' if forked else 'plain subprocesses'}).",
        "",
        table(cases, results),
        "",
    ]
    note = long_usage_note(cases, results)
    if note:
        report += [note, ""]
    report += ["Cases not in {correct, clear error}:", "", failures(cases, results)]
    if problems:
        report += ["", "Harness problems:", *[f"- {p}" for p in problems]]
    text = "\n".join(report)
    print(text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "date": stamp,
                    "seconds": elapsed,
                    "cases": [
                        {
                            "id": c.id,
                            "category": c.category,
                            "outcome": results[c.id].outcome,
                            "reason": results[c.id].reason,
                            "long_usage": results[c.id].long_usage,
                            "seconds": round(results[c.id].seconds, 3),
                        }
                        for c in cases
                        if c.id in results
                    ],
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
