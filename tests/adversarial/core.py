"""Outcomes, cases and the classification helpers shared by every case module."""

from __future__ import annotations

import contextlib
import csv
import functools
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

CORRECT = "correct"
CLEAR = "clear error"
SILENT = "silent wrong"
TRACEBACK = "traceback"
LOST = "data lost"
CODE = "code run"
SKIPPED = "skipped"
OUTCOMES = (CORRECT, CLEAR, SILENT, TRACEBACK, LOST, CODE)
GOOD = (CORRECT, CLEAR)

# library errors that count as a clear refusal (when their message names the culprit)
LIBRARY_ERRORS: tuple[type[BaseException], ...] = (ValueError, KeyError, TypeError)

Words = Sequence["str | tuple[str, ...]"]


@dataclass
class Result:
    """What one case came to."""

    outcome: str
    reason: str = ""
    long_usage: bool = False
    seconds: float = 0.0


@dataclass
class Case:
    """One adversarial input and how to judge what the code does with it.

    ``fn`` takes a fresh temporary directory (removed afterwards) and returns a ``Result``.
    ``kind`` is ``"lib"`` (in-process, run sequentially) or ``"proc"`` (subprocesses, run in
    parallel).
    """

    id: str
    category: str
    fn: Callable[[Path], Result]
    kind: str = "lib"
    timeout: float = 30.0
    meta: dict[str, Any] = field(default_factory=dict)


# what a machine out of processes/threads looks like (not the code's fault): rerun, then skip
ENVIRONMENT_TROUBLE = (
    "can't start new thread",
    "Resource temporarily unavailable",
    "BlockingIOError",
    "fork server did not answer",
)


def short(text: str, limit: int = 160) -> str:
    """One line of at most ``limit`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def missing_words(message: str, words: Words) -> list[str]:
    """The entries of ``words`` absent from ``message`` (case-insensitive; a tuple: any one)."""
    low = message.lower()
    out = []
    for w in words:
        options = (w,) if isinstance(w, str) else tuple(w)
        if not any(o.lower() in low for o in options):
            out.append("|".join(options))
    return out


def error_message(err: BaseException) -> str:
    """``str(err)``, without the repr quotes a ``KeyError`` adds."""
    if isinstance(err, KeyError) and err.args:
        return str(err.args[0])
    return str(err)


def describe(value: Any) -> str:
    """A short description of a returned value."""
    try:
        import torch

        if isinstance(value, torch.Tensor):
            return f"tensor {list(value.shape)} {value.dtype}"
        if isinstance(value, tuple | list):
            return "(" + ", ".join(describe(v) for v in value[:4]) + ")"
        batch = getattr(value, "batch_size", None)
        if batch is not None:
            return f"{type(value).__name__} batch {list(batch)}"
    except Exception:
        pass
    return short(repr(value), 80)


# ---------------------------------------------------------------- library case helpers


def lib_error(
    fn: Callable[[], Any],
    words: Words,
    *,
    accept: Callable[[Any], str | None] | None = None,
    allow: tuple[type[BaseException], ...] = (),
) -> Result:
    """A bad input: a ``ValueError``/``KeyError``/``TypeError`` naming ``words`` is clear.

    ``accept``, when given, judges a returned value instead of counting any return as silent:
    it returns None when the value is right (then the case is ``correct``) or a reason.
    """
    try:
        value = fn()
    except (*LIBRARY_ERRORS, *allow) as err:
        if not _through_library(err):
            where = traceback.extract_tb(err.__traceback__)[-1]
            return Result(
                TRACEBACK,
                f"harness: {type(err).__name__} raised outside rppo_td "
                f"({Path(where.filename).name}:{where.lineno}): {short(error_message(err), 80)}",
            )
        message = error_message(err)
        missing = missing_words(message, words)
        if not missing:
            return Result(CLEAR)
        return Result(
            TRACEBACK, f"{type(err).__name__} not naming {missing}: {short(message, 110)}"
        )
    except Exception as err:
        return Result(TRACEBACK, f"{type(err).__name__}: {short(error_message(err), 120)}")
    if accept is not None:
        try:
            why = accept(value)
        except Exception as err:  # a bug of the harness: never blame the code for it
            return Result(SKIPPED, f"harness: result check raised {type(err).__name__}: {err}")
        if why is None:
            return Result(CORRECT)
        return Result(SILENT, f"accepted: {why}")
    return Result(SILENT, f"accepted, returned {describe(value)}")


def _through_library(err: BaseException) -> bool:
    """True when the exception was raised in (or below) a call into rppo_td or torchrl."""
    frames = traceback.extract_tb(err.__traceback__)
    return any(
        f"{os.sep}rppo_td{os.sep}" in f.filename or f"{os.sep}torchrl{os.sep}" in f.filename
        for f in frames
    )


def lib_ok(fn: Callable[[], Any], check: Callable[[Any], str | None]) -> Result:
    """A valid input: ``check`` returns None when the result is right, else a reason."""
    try:
        value = fn()
    except Exception as err:
        return Result(
            TRACEBACK,
            f"valid input refused: {type(err).__name__}: {short(error_message(err), 110)}",
        )
    try:
        why = check(value)
    except Exception as err:  # a bug of the harness: never blame the code for it
        return Result(SKIPPED, f"harness: result check raised {type(err).__name__}: {err}")
    return Result(CORRECT) if why is None else Result(SILENT, why)


def lib_either(fn: Callable[[], Any], words: Words, check: Callable[[Any], str | None]) -> Result:
    """An edge input where refusing (clearly) and computing the right result are both fine."""
    return lib_error(fn, words, accept=check)


# ---------------------------------------------------------------- subprocesses

MEMORY_LIMIT = 8 << 30  # address space per subprocess: huge sizes fail instead of OOM-killing


def _limits(fsize: int = 0) -> None:
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    if fsize:  # a full disk: writes past fsize bytes fail with EFBIG (Python ignores SIGXFSZ)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a subprocess: the repo importable, one thread, no colours."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONWARNINGS"] = "ignore"
    env["NO_COLOR"] = "1"
    env.pop("ADV_RAISE_AT", None)
    if extra:
        env.update(extra)
    return env


@dataclass
class Proc:
    """A finished subprocess."""

    rc: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float


TRAIN = [sys.executable, "-m", "rppo_td.train"]
EVAL = [sys.executable, "-m", "rppo_td.evaluate"]

# a tiny run: 4 updates of 2 workers x 8 steps, seconds
TINY = [
    "--total-steps", "64", "--num-workers", "2", "--rollout-steps", "8",
    "--sequence-length", "4", "--hidden-size", "8", "--epochs", "1", "--eval-episodes", "1",
    "--no-progress",
]  # fmt: skip


class ForkedProcess:
    """A child of the fork server, with the bits of ``subprocess.Popen`` the cases use."""

    def __init__(self, client: ForkClient, rid: int, pid: int) -> None:
        self._client = client
        self._rid = rid
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._client.status(self._rid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(f"forked pid {self.pid}", timeout or 0)
            self._client.wait_any(0.05)
        assert self.returncode is not None
        return self.returncode


class ForkClient:
    """Talks to ``tests.adversarial.forkserver`` (one per pass)."""

    MODULES = ("rppo_td.train", "rppo_td.evaluate")

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.adversarial.forkserver"],
            cwd=str(REPO),
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._cond = threading.Condition()
        self._pids: dict[int, int] = {}
        self._rcs: dict[int, int] = {}
        self._errors: set[int] = set()
        self._next = 0
        self.alive = False
        first = self._proc.stdout.readline()  # type: ignore[union-attr]
        if b"ready" in first:
            self.alive = True
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self._proc.stdout:  # type: ignore[union-attr]
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            with self._cond:
                if "pid" in msg:
                    self._pids[msg["id"]] = msg["pid"]
                if "rc" in msg:
                    self._rcs[msg["id"]] = msg["rc"]
                if "error" in msg:
                    self._errors.add(msg["id"])
                self._cond.notify_all()
        with self._cond:
            self.alive = False
            self._cond.notify_all()

    def start(
        self, module: str, args: list[str], *, cwd: Path, env: dict[str, str], out: Path, err: Path
    ) -> ForkedProcess:
        """Forks ``python -m module args``; returns once the child exists."""
        with self._cond:
            rid = self._next
            self._next += 1
            req = {
                "id": rid,
                "module": module,
                "args": list(args),
                "cwd": str(cwd),
                "env": env,
                "stdout": str(out),
                "stderr": str(err),
                "limit": MEMORY_LIMIT,
            }
            self._proc.stdin.write((json.dumps(req) + "\n").encode())  # type: ignore[union-attr]
            self._proc.stdin.flush()  # type: ignore[union-attr]
            end = time.monotonic() + 60
            while rid not in self._pids:
                if not self.alive or rid in self._errors or time.monotonic() > end:
                    raise RuntimeError("fork server did not answer")
                self._cond.wait(0.5)
            return ForkedProcess(self, rid, self._pids[rid])

    def status(self, rid: int) -> int | None:
        with self._cond:
            if rid in self._rcs:
                return self._rcs[rid]
            return None if self.alive else -9

    def wait_any(self, seconds: float) -> None:
        with self._cond:
            self._cond.wait(seconds)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._proc.stdin.close()  # type: ignore[union-attr]
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            kill_group(self._proc)


FORK: ForkClient | None = None


def start_fork_server() -> bool:
    """Starts the fork server; False (plain subprocesses then) when it does not come up."""
    global FORK
    try:
        FORK = ForkClient()
    except Exception:
        FORK = None
    if FORK is not None and not FORK.alive:
        FORK = None
    return FORK is not None


def stop_fork_server() -> None:
    """Ends the fork server (after its children)."""
    global FORK
    if FORK is not None:
        FORK.close()
        FORK = None


def _forkable(argv: Sequence[str]) -> str | None:
    if FORK is None or not FORK.alive or len(argv) < 3:
        return None
    if argv[0] == sys.executable and argv[1] == "-m" and argv[2] in ForkClient.MODULES:
        return argv[2]
    return None


def _start(argv: Sequence[str], cwd: Path, env: dict[str, str] | None, out: Path, err: Path):
    """A running command (forked, or a subprocess) writing to ``out`` and ``err``."""
    module = _forkable(argv)
    if module is not None and FORK is not None:
        with contextlib.suppress(RuntimeError):
            return FORK.start(module, list(argv[3:]), cwd=cwd, env=child_env(env), out=out, err=err)
    for attempt in range(6):  # EAGAIN: the machine is out of processes for a moment
        try:
            return _popen(argv, cwd, env, out, err)
        except BlockingIOError:
            if attempt == 5:
                raise
            time.sleep(2.0 * (attempt + 1))
    raise AssertionError("unreachable")


def _popen(argv: Sequence[str], cwd: Path, env: dict[str, str] | None, out: Path, err: Path):
    with out.open("w") as fo, err.open("w") as fe:
        return subprocess.Popen(
            list(argv),
            cwd=str(cwd),
            env=child_env(env),
            stdout=fo,
            stderr=fe,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=functools.partial(_limits, int((env or {}).get("ADV_FSIZE", 0))),
        )


def run_proc(
    argv: Sequence[str],
    *,
    cwd: Path,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
) -> Proc:
    """Runs ``argv`` in its own session with a memory limit; kills the group on timeout."""
    start = time.perf_counter()
    io_dir = Path(tempfile.mkdtemp(prefix="rppo_adv_io_"))
    try:
        p = _start(argv, cwd, env, io_dir / "out", io_dir / "err")
        try:
            p.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            kill_group(p)
            p.wait(timeout=60)
            timed_out = True
        out = (io_dir / "out").read_text(errors="replace")
        err = (io_dir / "err").read_text(errors="replace")
    finally:
        shutil.rmtree(io_dir, ignore_errors=True)
    return Proc(p.returncode, out, err, timed_out, time.perf_counter() - start)


def spawn(argv: Sequence[str], *, cwd: Path, env: dict[str, str] | None = None):
    """Starts ``argv`` (for signal cases); stdout/stderr go to files in ``cwd``."""
    stamp = time.monotonic_ns()
    err_path = cwd / f"stderr.{stamp}.txt"
    p = _start(argv, cwd, env, cwd / f"stdout.{stamp}.txt", err_path)
    p._adv_err = err_path  # type: ignore[union-attr]
    return p


def finish(p, timeout: float = 120.0) -> Proc:
    """Waits for a ``spawn``ed process; returns its ``Proc`` (stdout not kept)."""
    start = time.perf_counter()
    try:
        p.wait(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill_group(p)
        p.wait(timeout=60)
        timed_out = True
    err = p._adv_err.read_text(errors="replace")
    return Proc(p.returncode, "", err, timed_out, time.perf_counter() - start)


def kill_group(p) -> None:
    """SIGKILL to the process group of ``p`` (its own session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)


def stderr_lines(text: str) -> list[str]:
    """Non-empty stderr lines."""
    return [line for line in text.splitlines() if line.strip()]


_LOG_LINE = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")


def usage_block(text: str) -> list[str]:
    """The lines from the first ``usage:`` line on, or the trailing non-log lines."""
    lines = stderr_lines(text)
    for i, line in enumerate(lines):
        if line.lower().startswith("usage:"):
            return lines[i:]
    tail: list[str] = []
    for line in reversed(lines):
        if _LOG_LINE.match(line):
            break
        tail.append(line)
    return list(reversed(tail))


def cli_error(
    proc: Proc,
    words: Words,
    *,
    codes: Iterable[int] = (2,),
    what: str = "",
) -> Result:
    """A refused command: exit ``codes``, no traceback, last stderr line naming ``words``."""
    codes = tuple(codes)
    lines = stderr_lines(proc.stderr)
    last = lines[-1] if lines else ""
    if proc.timed_out:
        return Result(TRACEBACK, f"timed out after {proc.seconds:.0f}s (hung instead of refusing)")
    if "Traceback (most recent call last)" in proc.stderr:
        return Result(TRACEBACK, f"exit {proc.rc}, Python traceback: {short(last, 120)}")
    if proc.rc == 0:
        return Result(SILENT, f"exit 0{(' ' + what) if what else ''}: accepted")
    if proc.rc is not None and proc.rc < 0:
        return Result(TRACEBACK, f"killed by signal {-proc.rc}: {short(last, 100)}")
    if proc.rc not in codes:
        return Result(TRACEBACK, f"exit {proc.rc} (expected {codes}): {short(last, 110)}")
    missing = missing_words(last, words)
    if missing:
        return Result(TRACEBACK, f"exit {proc.rc}, last line not naming {missing}: {short(last)}")
    long_usage = len(usage_block(proc.stderr)) > 3
    return Result(CLEAR, long_usage=long_usage)


def cli_crash_reason(proc: Proc) -> str:
    """Why a command that should have succeeded did not (one line)."""
    lines = stderr_lines(proc.stderr)
    last = lines[-1] if lines else ""
    if proc.timed_out:
        return f"timed out after {proc.seconds:.0f}s"
    tb = "traceback, " if "Traceback (most recent call last)" in proc.stderr else ""
    return f"exit {proc.rc}, {tb}{short(last, 120)}"


# ---------------------------------------------------------------- run directories


def tree_digest(directory: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``directory``."""
    out = {}
    if not directory.exists():
        return out
    for p in sorted(directory.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(directory))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def digest_diff(before: dict[str, str], after: dict[str, str]) -> str | None:
    """None when equal, else which files changed, appeared or vanished."""
    changed = sorted(k for k in before if k in after and before[k] != after[k])
    gone = sorted(set(before) - set(after))
    new = sorted(set(after) - set(before))
    if not (changed or gone or new):
        return None
    parts = []
    if changed:
        parts.append(f"changed {changed}")
    if gone:
        parts.append(f"removed {gone}")
    if new:
        parts.append(f"new {new}")
    return "; ".join(parts)


def read_rows(path: Path) -> list[dict[str, str]] | None:
    """The rows of a metrics.csv, or None when it is missing."""
    if not path.is_file():
        return None
    with path.open(newline="", errors="replace") as f:
        return list(csv.DictReader(f))


VOLATILE = {"wall_time_s", "fps", "collect_s", "learn_s", "collect_fps"}


def tmp_files(directory: Path) -> list[str]:
    """Leftover temporary files (``*.tmp``, ``*.tmp.*``, ``*~``) under ``directory``."""
    return sorted(
        str(p.relative_to(directory))
        for p in directory.rglob("*")
        if p.is_file() and (".tmp" in p.name or p.name.endswith("~"))
    )


def compare_metrics(rows: list[dict[str, str]] | None, ref: list[dict[str, str]]) -> str | None:
    """None when ``rows`` equals ``ref`` (updates once each, same values but wall time/fps)."""
    if rows is None:
        return "metrics.csv missing"
    updates = [r.get("update", "") for r in rows]
    expected = [r["update"] for r in ref]
    if updates != expected:
        dup = sorted({u for u in updates if updates.count(u) > 1}, key=lambda s: (len(s), s))
        miss = [u for u in expected if u not in updates]
        extra = [u for u in updates if u not in expected]
        bits = []
        if dup:
            bits.append(f"duplicated updates {dup[:6]}")
        if miss:
            bits.append(f"missing updates {miss[:6]}")
        if extra:
            bits.append(f"unexpected rows {extra[:4]}")
        if not bits:
            bits.append("rows out of order")
        return "metrics.csv: " + ", ".join(bits) + f" ({len(rows)} rows, want {len(ref)})"
    for got, want in zip(rows, ref, strict=True):
        for key, value in want.items():
            if key in VOLATILE:
                continue
            if got.get(key) != value:
                return (
                    f"metrics.csv update {want['update']}: {key} = {got.get(key)!r}, "
                    f"uninterrupted run has {value!r}"
                )
    return None


def read_json(path: Path) -> dict | None:
    """``json.load`` or None."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------- fixtures


class Fixtures:
    """Lazily built, shared, read-only inputs (a real checkpoint, reference runs)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._values: dict[str, Any] = {}

    def get(self, name: str, build: Callable[[Path], Any]) -> Any:
        """``build(directory)`` once per name (thread-safe); exceptions are cached too."""
        with self._lock:
            lock = self._locks.setdefault(name, threading.Lock())
        with lock:
            if name not in self._values:
                directory = self.root / re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
                directory.mkdir(parents=True, exist_ok=True)
                try:
                    self._values[name] = ("ok", build(directory))
                except Exception as err:
                    self._values[name] = ("error", f"{type(err).__name__}: {short(str(err))}")
            status, value = self._values[name]
        if status == "error":
            raise FixtureError(f"fixture {name} failed: {value}")
        return value


class FixtureError(RuntimeError):
    """A shared input could not be built; the case is skipped."""


FIXTURES: Fixtures | None = None


def fixtures() -> Fixtures:
    """The session's fixtures (created by the runner)."""
    global FIXTURES
    if FIXTURES is None:
        FIXTURES = Fixtures(Path(tempfile.mkdtemp(prefix="rppo_adv_fix_")))
    return FIXTURES


def cleanup_fixtures() -> None:
    """Removes the fixtures' directory."""
    global FIXTURES
    if FIXTURES is not None:
        shutil.rmtree(FIXTURES.root, ignore_errors=True)
        FIXTURES = None


_HELP: dict[str, str] = {}


def train_help() -> str:
    """``rppo-train --help`` of the code as it is now (cached)."""
    if "train" not in _HELP:
        with tempfile.TemporaryDirectory() as d:
            _HELP["train"] = run_proc([*TRAIN, "--help"], cwd=Path(d), timeout=120).stdout
    return _HELP["train"]


def overwrite_flag() -> str | None:
    """The trainer's flag that allows reusing a run directory, if it has one."""
    text = train_help()
    for name in ("--overwrite", "--force", "--clobber", "--fresh", "--replace"):
        if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text):
            return name
    match = re.search(r"--[a-z-]*overwrite[a-z-]*", text)
    return match.group(0) if match else None
