"""D. Run directories, interruptions (signals, crashes) and faulty envs, with real subprocesses."""

from __future__ import annotations

import os
import random
import shutil
import signal
import time
from pathlib import Path

from tests.adversarial.core import (
    CLEAR,
    CORRECT,
    EVAL,
    LOST,
    SILENT,
    SKIPPED,
    TRACEBACK,
    TRAIN,
    Case,
    Proc,
    Result,
    cli_crash_reason,
    cli_error,
    compare_metrics,
    digest_diff,
    finish,
    fixtures,
    overwrite_flag,
    read_json,
    read_rows,
    run_proc,
    short,
    spawn,
    stderr_lines,
    tmp_files,
    tree_digest,
)

CAT_DIR = "D. run directories"
CAT_SIG = "D. interruptions"
CAT_ENV = "D. faulty envs"

ENVS = "tests.adversarial.envs"

# 120 updates of 2 workers x 8 steps; checkpoints every 7 updates
FAULT = [
    "--total-steps", "1920", "--num-workers", "2", "--rollout-steps", "8",
    "--sequence-length", "4", "--hidden-size", "8", "--epochs", "1", "--eval-episodes", "1",
    "--no-progress", "--checkpoint-every", "7", "--seed", "3",
]  # fmt: skip
UPDATES = 120


def _settings(env: str | None) -> list[str]:
    return [*FAULT, *(["--env", env] if env else [])]


def reference(env: str | None = None) -> dict:
    """The uninterrupted run of ``FAULT`` settings (on ``env``): rows, summary, directory."""

    def build(directory: Path) -> dict:
        out = directory / "run"
        proc = run_proc([*TRAIN, *_settings(env), "--output", str(out)], cwd=directory, timeout=300)
        if proc.rc != 0:
            raise RuntimeError("reference run failed: " + cli_crash_reason(proc))
        return {
            "rows": read_rows(out / "metrics.csv"),
            "summary": read_json(out / "summary.json"),
            "dir": out,
        }

    return fixtures().get(f"reference-{env or 'default'}", build)


def _rows_now(run: Path) -> int:
    try:
        with (run / "metrics.csv").open("rb") as f:
            return max(0, f.read().count(b"\n") - 1)
    except OSError:
        return 0


def _wait_rows(p, run: Path, rows: int, limit: float = 150.0) -> bool:
    """Waits until metrics.csv holds ``rows`` rows (True) or the process ends (False)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if _rows_now(run) >= rows:
            return True
        if p.poll() is not None:
            return False
        time.sleep(0.003)
    return False


def _wait_tmp(p, run: Path, after_rows: int, limit: float = 150.0) -> bool:
    """Waits for a ``*.tmp`` file in ``run`` once ``after_rows`` rows exist."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if _rows_now(run) >= after_rows:
            try:
                if any(".tmp" in n for n in os.listdir(run)):
                    return True
            except OSError:
                pass
        if p.poll() is not None:
            return False
        time.sleep(0.0005)
    return False


def _recover(run: Path, tmp: Path, env: str | None, extra_env=None) -> tuple[Proc | None, str]:
    """Continues an interrupted run the way a user would: --resume, else a fresh start."""
    if (run / "checkpoint.pt").exists():
        proc = run_proc(
            [*TRAIN, "--resume", str(run), "--no-progress"], cwd=tmp, timeout=240, env=extra_env
        )
        return proc, "resume"
    fresh = [*TRAIN, *_settings(env), "--output", str(run)]
    proc = run_proc(fresh, cwd=tmp, timeout=240, env=extra_env)
    flag = overwrite_flag()
    if proc.rc == 2 and flag:
        proc = run_proc([*fresh, flag], cwd=tmp, timeout=240, env=extra_env)
        return proc, f"fresh start with {flag} (no checkpoint)"
    return proc, "fresh start (no checkpoint)"


def _eval_ok(run: Path, tmp: Path) -> str | None:
    proc = run_proc([*EVAL, "--checkpoint", str(run), "--episodes", "1"], cwd=tmp, timeout=120)
    if proc.rc != 0:
        return "checkpoint not loadable by rppo-eval: " + cli_crash_reason(proc)
    return None


def _judge_final(run: Path, tmp: Path, ref: dict) -> str | None:
    """None when the finished run equals the uninterrupted one and nothing is left over."""
    why = compare_metrics(read_rows(run / "metrics.csv"), ref["rows"])
    if why:
        return why
    left = tmp_files(run)
    if left:
        return f"temporary files left: {left}"
    summary = read_json(run / "summary.json")
    if summary is None:
        return "summary.json missing after the resumed run"
    want = ref["summary"] or {}
    for key in ("eval_return_mean", "env_steps", "updates"):
        if key in want and summary.get(key) != want.get(key):
            return f"summary.json {key} = {summary.get(key)!r}, uninterrupted run {want[key]!r}"
    return _eval_ok(run, tmp)


def _first_process_note(proc: Proc, sig: int | None) -> str | None:
    """A traceback in the interrupted process's stderr (SIGKILL excepted), one line."""
    if sig == signal.SIGKILL:
        return None
    if "Traceback (most recent call last)" in proc.stderr:
        lines = stderr_lines(proc.stderr)
        return f"interrupted process printed a traceback: {short(lines[-1] if lines else '')}"
    if proc.rc == 0 and sig in (signal.SIGINT, signal.SIGTERM):
        return None  # finished before the signal could matter
    return None


def signal_case(cid: str, plan: list[tuple[str, int, float, list[int]]], env: str | None = None):
    """``plan``: per process, (trigger 'rows'|'tmp', rows, extra delay s, signals to send)."""

    def fn(tmp: Path) -> Result:
        ref = reference(env)
        run = tmp / "run"
        notes = []
        for i, (trigger, rows, delay, sigs) in enumerate(plan):
            if i == 0:
                argv = [*TRAIN, *_settings(env), "--output", str(run)]
            elif (run / "checkpoint.pt").exists():
                argv = [*TRAIN, "--resume", str(run), "--no-progress"]
            else:
                break
            p = spawn(argv, cwd=tmp)
            hit = (_wait_tmp if trigger == "tmp" else _wait_rows)(p, run, rows)
            if hit:
                if delay:
                    time.sleep(delay)
                for k, sig in enumerate(sigs):
                    if k:
                        time.sleep(0.03)
                    try:
                        os.kill(p.pid, sig)
                    except ProcessLookupError:
                        break
            else:
                notes.append(f"process {i} ended before the trigger ({trigger} {rows})")
            proc = finish(p, timeout=180)
            if proc.timed_out:
                return Result(TRACEBACK, f"process {i} hung after signal(s) {sigs}")
            note = _first_process_note(proc, sigs[-1] if sigs else None)
            if note:
                notes.append(note)
            fine = (0, 130, 143, 2, 1, *(-s for s in sigs))
            if sigs and sigs[-1] != signal.SIGKILL and proc.rc not in fine and hit:
                notes.append(f"interrupted process exited {proc.rc}")
        proc, how = _recover(run, tmp, env)
        if proc is None or proc.rc != 0:
            return Result(
                LOST,
                f"cannot finish the run after the interruption ({how}): "
                + (cli_crash_reason(proc) if proc else "no process"),
            )
        why = _judge_final(run, tmp, ref)
        if why:
            return Result(LOST, f"after {how}: {why}")
        tb = [n for n in notes if "traceback" in n or "exited" in n]
        if tb:
            return Result(TRACEBACK, tb[0])
        return Result(CORRECT, "; ".join(notes))

    return Case(f"D.sig.{cid}", CAT_SIG, fn, kind="proc", timeout=600)


def disk_full_case(cid: str, fsize: int, must_fail: bool) -> Case:
    """Every file write past ``fsize`` bytes fails (EFBIG), as on a full disk; then resume."""

    def fn(tmp: Path) -> Result:
        ref = reference()
        run = tmp / "run"
        argv = [*TRAIN, *FAULT, "--output", str(run)]
        proc = run_proc(argv, cwd=tmp, timeout=240, env={"ADV_FSIZE": str(fsize)})
        first = None
        if proc.rc == 0 and must_fail:
            first = Result(SILENT, "exit 0 although a checkpoint could not be written")
        elif proc.rc != 0:
            words = [("space", "disk", "too large", "efbig", "write", "checkpoint", str(run))]
            first = cli_error(proc, words, codes=(1, 2))
        left = tmp_files(run) if run.exists() else []
        if left:
            return Result(LOST, f"temporary files left after the failed write: {left}")
        if (run / "checkpoint.pt").exists():
            why = _eval_ok(run, tmp)
            if why:
                return Result(LOST, f"after the failed write: {why}")
        proc2, how = _recover(run, tmp, None)
        if proc2 is None or proc2.rc != 0:
            return Result(
                LOST,
                f"cannot finish after the full disk ({how}): "
                + (cli_crash_reason(proc2) if proc2 else ""),
            )
        why = _judge_final(run, tmp, ref)
        if why:
            return Result(LOST, f"after {how}: {why}")
        return first if first is not None else Result(CORRECT)

    return Case(f"D.sig.{cid}", CAT_SIG, fn, kind="proc", timeout=600)


def signal_cases() -> list[Case]:
    rnd = random.Random(8)
    cases = []
    for i in range(4):
        cases.append(
            signal_case(
                f"sigint.{i}", [("rows", rnd.randint(3, 110), rnd.random() * 0.02, [signal.SIGINT])]
            )
        )
    for i in range(4):
        cases.append(
            signal_case(
                f"sigterm.{i}",
                [("rows", rnd.randint(3, 110), rnd.random() * 0.02, [signal.SIGTERM])],
            )
        )
    for i in range(6):
        rows = [2, 9, 15, 50, 84, 113][i]
        cases.append(
            signal_case(
                f"sigkill.{i}.at.update.{rows}",
                [("rows", rows, rnd.random() * 0.01, [signal.SIGKILL])],
            )
        )
    for i in range(3):
        cases.append(
            signal_case(
                f"double.sigint.{i}",
                [
                    (
                        "rows",
                        rnd.randint(5, 100),
                        rnd.random() * 0.01,
                        [signal.SIGINT, signal.SIGINT],
                    )
                ],
            )
        )
    cases.append(
        signal_case("sigkill.during.checkpoint.write.0", [("tmp", 1, 0.0, [signal.SIGKILL])])
    )
    cases.append(
        signal_case("sigkill.during.checkpoint.write.1", [("tmp", 40, 0.0, [signal.SIGKILL])])
    )
    cases.append(signal_case("sigint.after.last.update", [("rows", UPDATES, 0.0, [signal.SIGINT])]))
    cases.append(
        signal_case("sigterm.after.last.update", [("rows", UPDATES, 0.05, [signal.SIGTERM])])
    )
    cases.append(
        signal_case(
            "chain.sigkill.then.sigkill.during.resume",
            [("rows", 30, 0.0, [signal.SIGKILL]), ("rows", 60, 0.0, [signal.SIGKILL])],
        )
    )
    cases.append(
        signal_case(
            "chain.sigterm.then.sigint.during.resume",
            [("rows", 20, 0.0, [signal.SIGTERM]), ("rows", 75, 0.0, [signal.SIGINT])],
        )
    )
    cases.append(
        signal_case("sigkill.after.last.update", [("rows", UPDATES, 0.0, [signal.SIGKILL])])
    )
    cases.append(disk_full_case("disk.full.at.first.checkpoint", 40_000, True))
    cases.append(disk_full_case("disk.full.late.events.file", 100_000, False))
    cases.append(disk_full_case("disk.full.from.start", 2_000, True))
    cases.append(
        signal_case(
            "sigint.on.faulty.env.module",
            [("rows", 40, 0.0, [signal.SIGINT])],
            env=f"{ENVS}:adv/Toy-v0",
        )
    )
    return cases


# ---------------------------------------------------------------- run directories


def _stopped_run(directory: Path) -> Path:
    """A FAULT run stopped by SIGINT after about 50 updates (checkpoint at the stop)."""
    run = directory / "run"
    p = spawn([*TRAIN, *FAULT, "--output", str(run)], cwd=directory)
    _wait_rows(p, run, 50)
    os.kill(p.pid, signal.SIGINT)
    proc = finish(p, timeout=180)
    if not (run / "checkpoint.pt").exists():
        raise RuntimeError("no checkpoint after SIGINT: " + cli_crash_reason(proc))
    return run


def stopped_run() -> Path:
    return fixtures().get("stopped_run", _stopped_run)


def _copy_stopped(tmp: Path) -> Path:
    run = tmp / "run"
    shutil.copytree(stopped_run(), run)
    return run


def _finished(tmp: Path) -> Path:
    from tests.adversarial.cases_checkpoint import real_run_dir

    run = tmp / "run"
    shutil.copytree(real_run_dir(), run)
    return run


def _tiny():
    from tests.adversarial.core import TINY

    return TINY


def rundir_cases() -> list[Case]:
    cases = []

    def add(cid, fn):
        cases.append(Case(f"D.dir.{cid}", CAT_DIR, fn, kind="proc", timeout=400))

    def refuse_existing(extra: list[str]):
        def fn(tmp: Path) -> Result:
            run = _finished(tmp)
            before = tree_digest(run)
            proc = run_proc([*TRAIN, *_tiny(), *extra, "--output", str(run)], cwd=tmp)
            diff = digest_diff(before, tree_digest(run))
            if diff:
                return Result(LOST, f"fresh run into an existing run (exit {proc.rc}): {diff}")
            return cli_error(
                proc, [("resume", "overwrite", "exists", "already"), (str(run), "output")]
            )

        return fn

    add("fresh.into.existing.run", refuse_existing([]))
    add("fresh.into.existing.run.other.settings", refuse_existing(["--hidden-size", "16"]))
    add("fresh.into.stopped.run", lambda tmp: _refuse_stopped(tmp))

    def overwrite(tmp: Path) -> Result:
        flag = overwrite_flag()
        if not flag:
            return Result(SKIPPED, "no overwrite flag in rppo-train --help")
        run = _finished(tmp)
        ref = read_rows(run / "metrics.csv")
        (run / "notes.txt").write_text("mine\n")
        proc = run_proc([*TRAIN, *_tiny(), flag, "--output", str(run)], cwd=tmp)
        if proc.rc != 0:
            return Result(TRACEBACK, f"{flag} run failed: " + cli_crash_reason(proc))
        why = compare_metrics(read_rows(run / "metrics.csv"), ref)
        if why:
            return Result(LOST, f"after {flag}: {why}")
        events = sorted(p.name for p in run.glob("events.out.tfevents.*"))
        if len(events) > 1:
            return Result(LOST, f"after {flag} the old TensorBoard events remain: {events}")
        return Result(CORRECT)

    add("overwrite.flag.replaces.run", overwrite)

    def unrelated(tmp: Path) -> Result:
        run = tmp / "run"
        run.mkdir()
        (run / "notes.txt").write_text("mine\n")
        proc = run_proc([*TRAIN, *_tiny(), "--output", str(run)], cwd=tmp)
        notes = run / "notes.txt"
        if not notes.exists() or notes.read_text() != "mine\n":
            return Result(LOST, "an unrelated file in the output directory was changed/removed")
        if proc.rc == 0:
            return Result(CORRECT)
        return cli_error(proc, [(str(run), "output")])

    add("fresh.into.dir.with.unrelated.file", unrelated)

    def empty_dir(tmp: Path) -> Result:
        run = tmp / "run"
        run.mkdir()
        proc = run_proc([*TRAIN, *_tiny(), "--output", str(run)], cwd=tmp)
        if proc.rc != 0:
            return Result(TRACEBACK, "empty existing dir refused: " + cli_crash_reason(proc))
        return Result(CORRECT)

    add("fresh.into.empty.existing.dir", empty_dir)

    def metrics_only(tmp: Path) -> Result:
        run = tmp / "run"
        run.mkdir()
        ref = reference()
        rows = ref["rows"][:3]
        with (run / "metrics.csv").open("w") as f:
            f.write(",".join(rows[0].keys()) + "\n")
            for r in rows:
                f.write(",".join(r.values()) + "\n")
        before = tree_digest(run)
        proc = run_proc([*TRAIN, *FAULT, "--output", str(run)], cwd=tmp, timeout=240)
        if proc.rc == 0:
            why = compare_metrics(read_rows(run / "metrics.csv"), ref["rows"])
            return (
                Result(LOST, f"fresh run over a crashed run's metrics.csv: {why}")
                if why
                else Result(CORRECT)
            )
        diff = digest_diff(before, tree_digest(run))
        if diff:
            return Result(LOST, f"refused, but changed the directory: {diff}")
        return cli_error(proc, [(str(run), "output", "metrics")])

    add("fresh.into.dir.with.crashed.metrics.no.checkpoint", metrics_only)

    def resume_changed(extra: list[str], words):
        def fn(tmp: Path) -> Result:
            run = _copy_stopped(tmp)
            before = tree_digest(run)
            proc = run_proc([*TRAIN, "--resume", str(run), *extra, "--no-progress"], cwd=tmp)
            diff = digest_diff(before, tree_digest(run))
            if diff and proc.rc != 0:
                return Result(LOST, f"refused resume changed the run directory: {diff}")
            if proc.rc == 0:
                return Result(SILENT, f"resumed with {extra} (changes the experiment)")
            return cli_error(proc, words)

        return fn

    add("resume.changed.hidden_size", resume_changed(["--hidden-size", "16"], ["hidden_size"]))
    add("resume.changed.env", resume_changed(["--env", "CartPole-v1"], ["env"]))
    add("resume.changed.gamma", resume_changed(["--gamma", "0.5"], ["gamma"]))

    def resume_ok(prepare, label):
        def fn(tmp: Path) -> Result:
            ref = reference()
            run = _copy_stopped(tmp)
            prepare(run)
            before = tree_digest(run)
            proc = run_proc([*TRAIN, "--resume", str(run), "--no-progress"], cwd=tmp, timeout=240)
            if proc.rc != 0:
                diff = digest_diff(before, tree_digest(run))
                if diff:
                    return Result(LOST, f"resume ({label}) failed and changed files: {diff}")
                res = cli_error(proc, [("metrics", "checkpoint", "tmp", str(run))])
                if res.outcome == CLEAR:
                    return res
                return Result(TRACEBACK, f"resume ({label}) failed: " + cli_crash_reason(proc))
            why = _judge_final(run, tmp, ref)
            return Result(LOST, f"{label}: {why}") if why else Result(CORRECT)

        return fn

    def torn(run: Path) -> None:
        # killed while appending the row after the checkpoint: half a line, no newline
        rows = reference()["rows"]
        n = _rows_now(run)
        with (run / "metrics.csv").open("a") as f:
            f.write(",".join(rows[n].values())[:30])

    def stale_tmp(run: Path) -> None:
        (run / "checkpoint.pt.tmp").write_bytes(b"half a checkpoint")
        (run / "summary.json.tmp").write_text("{")

    def extra_rows(run: Path) -> None:
        rows = reference()["rows"]
        n = _rows_now(run)
        with (run / "metrics.csv").open("a") as f:
            for r in rows[n : n + 3]:
                f.write(",".join(r.values()) + "\n")

    add("resume.after.torn.metrics.line", resume_ok(torn, "torn last metrics line"))
    add("resume.with.stale.tmp.files", resume_ok(stale_tmp, "stale .tmp files"))
    add(
        "resume.metrics.ahead.of.checkpoint",
        resume_ok(extra_rows, "metrics rows past the checkpoint"),
    )
    add("resume.plain.stopped.run", resume_ok(lambda run: None, "plain"))

    def resume_other_output(tmp: Path) -> Result:
        run = _copy_stopped(tmp)
        before = tree_digest(run)
        other = tmp / "elsewhere"
        proc = run_proc(
            [*TRAIN, "--resume", str(run), "--output", str(other), "--no-progress"],
            cwd=tmp,
            timeout=240,
        )
        diff = digest_diff(before, tree_digest(run))
        if diff:
            return Result(LOST, f"resume into another --output changed the source run: {diff}")
        if proc.rc != 0:
            return cli_error(proc, ["output"])
        rows = read_rows(other / "metrics.csv") or []
        want = reference()["rows"]
        if [r["update"] for r in rows] not in (
            [w["update"] for w in want],
            [w["update"] for w in want][_rows_now(run) :],
        ):
            return Result(
                LOST,
                f"new --output metrics hold updates {rows[0]['update'] if rows else '-'}"
                f"..{rows[-1]['update'] if rows else '-'} ({len(rows)} rows)",
            )
        return Result(CORRECT)

    add("resume.into.other.output", resume_other_output)
    return cases


def _refuse_stopped(tmp: Path) -> Result:
    run = _copy_stopped(tmp)
    before = tree_digest(run)
    proc = run_proc([*TRAIN, *FAULT, "--output", str(run)], cwd=tmp, timeout=240)
    diff = digest_diff(before, tree_digest(run))
    if diff:
        return Result(LOST, f"fresh run into a stopped run (exit {proc.rc}): {diff}")
    return cli_error(proc, [("resume", "overwrite", "exists", "already"), (str(run), "output")])


# ---------------------------------------------------------------- faulty envs

ENV_ARGS = [
    "--total-steps", "160", "--num-workers", "2", "--rollout-steps", "8",
    "--sequence-length", "4", "--hidden-size", "8", "--epochs", "1", "--eval-episodes", "2",
    "--no-progress", "--checkpoint-every", "3",
]  # fmt: skip

# name -> expectation: "refuse" (must fail clearly), "either" (run or refuse), "valid"
ENV_EXPECT = {
    "Toy": "valid",
    "NaNObs": "refuse",
    "InfReward": "refuse",
    "WrongShapeObs": "refuse",
    "WrongShapeLater": "refuse",
    "Float64Obs": "either",
    "StringObs": "refuse",
    "ArrayReward": "refuse",
    "ZeroDimReward": "valid",
    "NoneReward": "refuse",
    "OldAPI": "refuse",
    "MultiDiscreteStart": "either",
    "DiscreteStart": "either",
    "DiscreteObsStart": "either",
    "MultiDiscreteObsStart": "either",
    "BoxActionOffset": "either",
    "Unpicklable": "either",
}
TORCHRL_TOO = {
    "NaNObs",
    "ArrayReward",
    "MultiDiscreteStart",
    "DiscreteStart",
    "DiscreteObsStart",
    "Unpicklable",
    "Toy",
}


def env_case(name: str, expect: str, collector: str = "vector") -> Case:
    env_id = f"adv/{name}-v0"
    full = f"{ENVS}:{env_id}"

    def fn(tmp: Path) -> Result:
        markers = tmp / "markers"
        markers.mkdir()
        menv = {"ADV_MARKER_DIR": str(markers)}
        run = tmp / "run"
        argv = [*TRAIN, *ENV_ARGS, "--env", full, "--collector", collector, "--output", str(run)]
        proc = run_proc(argv, cwd=tmp, timeout=180, env=menv)
        invalid = sorted(markers.iterdir())
        if invalid:
            return Result(
                SILENT,
                f"sent an invalid action (exit {proc.rc}): {short(invalid[0].read_text(), 100)}",
            )
        left = tmp_files(run) if run.exists() else []
        if left:
            return Result(LOST, f"temporary files left: {left}")
        if proc.rc == 0 and not proc.timed_out:
            if expect == "refuse":
                return Result(SILENT, "exit 0: trained on it")
            why = _eval_ok(run, tmp) if (run / "checkpoint.pt").exists() else "no checkpoint"
            if sorted(markers.iterdir()):
                return Result(SILENT, "rppo-eval sent an invalid action")
            if why:
                return Result(LOST if "checkpoint" in why else TRACEBACK, why)
            if name == "Unpicklable":
                again = run_proc([*TRAIN, "--resume", str(run), "--no-progress"], cwd=tmp, env=menv)
                if again.rc != 0:
                    return Result(TRACEBACK, "resume failed: " + cli_crash_reason(again))
            return Result(CORRECT)
        if expect == "valid":
            return Result(TRACEBACK, "valid env refused: " + cli_crash_reason(proc))
        # naming the env, or (torchrl collector) the --collector setting that cannot take it
        words = [(env_id, name, *(["--collector"] if collector != "vector" else []))]
        return cli_error(proc, words, codes=(1, 2))

    suffix = "" if collector == "vector" else ".torchrl"
    return Case(f"D.env.{name}{suffix}", CAT_ENV, fn, kind="proc", timeout=300)


def raise_case(cid: str, at: int) -> Case:
    env = f"{ENVS}:adv/RaiseAt-v0"

    def fn(tmp: Path) -> Result:
        run = tmp / "run"
        argv = [*TRAIN, *_settings(env), "--output", str(run)]
        proc = run_proc(argv, cwd=tmp, timeout=240, env={"ADV_RAISE_AT": str(at)})
        if proc.rc == 0:
            return Result(SILENT, "exit 0 although the env raised")
        first = cli_error(proc, [("adv/RaiseAt-v0", "RaiseAt", "env")], codes=(1, 2))
        left = tmp_files(run) if run.exists() else []
        if left:
            return Result(LOST, f"temporary files left after the env error: {left}")
        if (run / "checkpoint.pt").exists():
            why = _eval_ok(run, tmp)
            if why:
                return Result(LOST, f"after the env error: {why}")
        elif at > 8 * 7 + 8:
            return Result(LOST, "no checkpoint kept although one was written before the error")
        proc2, how = _recover(run, tmp, env)
        if proc2 is None or proc2.rc != 0:
            return Result(
                LOST,
                f"cannot continue after the env error ({how}): "
                + (cli_crash_reason(proc2) if proc2 else ""),
            )
        why = _judge_final(run, tmp, reference(env))
        if why:
            return Result(LOST, f"after {how}: {why}")
        return first if first.outcome != CLEAR else Result(CLEAR)

    return Case(f"D.env.raise.{cid}", CAT_ENV, fn, kind="proc", timeout=600)


def env_cases() -> list[Case]:
    cases = [env_case(n, e) for n, e in ENV_EXPECT.items()]
    cases += [env_case(n, ENV_EXPECT[n], "torchrl") for n in sorted(TORCHRL_TOO)]
    cases += [raise_case("at.step.1", 1), raise_case("mid.run.step.420", 420)]
    return cases


def all_cases() -> list[Case]:
    return [*rundir_cases(), *signal_cases(), *env_cases()]
