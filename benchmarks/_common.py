"""Shared pieces of the benchmark scripts: shapes, a rollout factory, timing and JSON output.

Every script times its candidates *interleaved* (candidate A, B, C, then A, B, C again, ...)
after a warm-up, and reports the median of the repeats, so that a burst of load from another
process hits all candidates alike. Ratios are always taken between figures measured in the same
process. Nothing here asserts on a timing: the scripts print and save what they measure.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tensordict import TensorDict, TensorDictBase

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"

GAMMA = 0.99
LMBDA = 0.95


# --------------------------------------------------------------------------------------------
# Shapes
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RolloutShape:
    """One rollout configuration of the issue's table."""

    name: str
    workers: int
    time_steps: int
    sequence_length: int
    observation: str  # "vector" (float32 [4]) or "image" (uint8 [3, 84, 84])
    rnn: str  # "lstm" (h and c) or "gru" (h only)
    hidden: int
    num_minibatches: int = 4


PIPELINE_SHAPES = (
    RolloutShape("16x256 vec LSTM64", 16, 256, 8, "vector", "lstm", 64),
    RolloutShape("32x512 vec LSTM256", 32, 512, 8, "vector", "lstm", 256),
    RolloutShape("32x512 img LSTM256", 32, 512, 8, "image", "lstm", 256),
    RolloutShape("256x128 vec GRU128", 256, 128, 16, "vector", "gru", 128),
)
QUICK_SHAPES = (
    RolloutShape("4x32 vec LSTM8", 4, 32, 8, "vector", "lstm", 8, num_minibatches=2),
    RolloutShape("4x32 img GRU8", 4, 32, 4, "image", "gru", 8, num_minibatches=2),
)


# --------------------------------------------------------------------------------------------
# Rollout factory
# --------------------------------------------------------------------------------------------
def episode_flags(
    workers: int,
    time_steps: int,
    *,
    generator: torch.Generator,
    terminate_prob: float = 0.01,
    time_limit: int = 200,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random but realistic episode ends: ``(terminated, truncated)``, each ``[W, T]`` bool.

    Each worker is somewhere inside an episode when the rollout starts (its step counter is
    uniform in ``[0, time_limit)``); every step terminates with ``terminate_prob`` (mean
    episode about 1 / p steps), and an episode that reaches ``time_limit`` steps is truncated.
    """
    age = torch.randint(0, time_limit, (workers,), generator=generator)
    terminated = torch.rand(workers, time_steps, generator=generator) < terminate_prob
    truncated = torch.zeros(workers, time_steps, dtype=torch.bool)
    for t in range(time_steps):
        age += 1
        cut = (age >= time_limit) & ~terminated[:, t]
        truncated[:, t] = cut
        age[terminated[:, t] | cut] = 0
    return terminated, truncated


def make_rollout(
    shape: RolloutShape, *, seed: int = 0, device: str | torch.device = "cpu"
) -> TensorDict:
    """A ``[W, T]`` rollout with TorchRL's keys, shaped like a recurrent PPO collector's output.

    Keys: ``observation`` (``[W, T, 4]`` float32 or ``[W, T, 3, 84, 84]`` uint8), ``action``
    (``[W, T]`` int64), ``action_log_prob`` (``[W, T]``), ``state_value`` (``[W, T, 1]``),
    ``is_init`` (``[W, T, 1]`` bool), ``recurrent_state_h`` (and ``_c`` for an LSTM,
    ``[W, T, 1, H]``), and under ``next``: ``reward``, ``state_value``, ``done``,
    ``terminated``, ``truncated`` (``[W, T, 1]``).
    """
    g = torch.Generator().manual_seed(seed)
    w, t = shape.workers, shape.time_steps
    terminated, truncated = episode_flags(w, t, generator=g)
    done = terminated | truncated
    is_init = torch.zeros(w, t, dtype=torch.bool)
    is_init[:, 1:] = done[:, :-1]
    if shape.observation == "image":
        obs = torch.randint(0, 256, (w, t, 3, 84, 84), generator=g, dtype=torch.uint8)
    else:
        obs = torch.randn(w, t, 4, generator=g)
    data = {
        "observation": obs,
        "action": torch.randint(0, 2, (w, t), generator=g),
        "action_log_prob": -torch.rand(w, t, generator=g),
        "state_value": torch.randn(w, t, 1, generator=g),
        "is_init": is_init.unsqueeze(-1),
        "recurrent_state_h": torch.randn(w, t, 1, shape.hidden, generator=g),
        "next": {
            "reward": torch.randn(w, t, 1, generator=g),
            "state_value": torch.randn(w, t, 1, generator=g),
            "done": done.unsqueeze(-1),
            "terminated": terminated.unsqueeze(-1),
            "truncated": truncated.unsqueeze(-1),
        },
    }
    if shape.rnn == "lstm":
        data["recurrent_state_c"] = torch.randn(w, t, 1, shape.hidden, generator=g)
    return TensorDict(data, batch_size=[w, t]).to(device)


def nbytes(td: TensorDictBase) -> int:
    """Bytes held by the tensor leaves of ``td``."""
    return sum(
        v.numel() * v.element_size() for v in td.values(include_nested=True, leaves_only=True)
    )


# --------------------------------------------------------------------------------------------
# The loop reference (rppo_td.testing.reference, the test kit's oracle)
# --------------------------------------------------------------------------------------------
def load_reference():
    """``rppo_td.testing.reference``, or None without hypothesis (the ``test`` extra)."""
    try:
        from rppo_td.testing import reference
    except ImportError:
        return None
    return reference


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------
def synchronize(device: str | torch.device) -> None:
    """Waits for queued kernels on a CUDA device; nothing on the CPU."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


Candidate = Callable[[], object]


def time_interleaved(
    candidates: dict[str, Candidate],
    *,
    repeats: int,
    warmup: int = 1,
    device: str | torch.device = "cpu",
    max_seconds: float | None = None,
) -> dict[str, dict[str, float]]:
    """Times each candidate ``repeats`` times, interleaved, and returns seconds per candidate.

    Each repeat runs the candidates in a new shuffled order (seeded), so that none always runs
    right after the same other one. The garbage collector is run once before and kept off
    during the repeats (a collection between repeats makes the next call pay for it: glibc
    hands freed pages back and the next allocation faults them in again). A candidate is a
    zero-argument callable doing the whole measured work (any per-call setup that should not
    count must be done beforehand).
    Returns ``{name: {"median", "min", "repeats"}}``. A candidate whose warm-up call took
    longer than ``max_seconds`` (the loop reference at large shapes) is timed once more, after
    its warm-up and with the collector off as the others, and that single time is reported:
    the cold first call, paying for first-touched memory, would flatter the other candidates.
    """
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    slow: set[str] = set()
    for name, fn in candidates.items():
        for _ in range(warmup):
            start = time.perf_counter()
            fn()
            synchronize(device)
            if max_seconds is not None and time.perf_counter() - start > max_seconds:
                slow.add(name)
                break
    gc_was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    # each repeat in its own order: a candidate that always ran right after the same one
    # would pay, every time, for the caches and freed memory that one leaves behind
    order = random.Random(0)
    names = list(candidates)
    try:
        for name in sorted(slow):  # one warm call each
            synchronize(device)
            start = time.perf_counter()
            candidates[name]()
            synchronize(device)
            samples[name].append(time.perf_counter() - start)
        for _ in range(repeats):
            order.shuffle(names)
            for name in names:
                fn = candidates[name]
                if name in slow:
                    continue
                synchronize(device)
                start = time.perf_counter()
                fn()
                synchronize(device)
                samples[name].append(time.perf_counter() - start)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {
        name: {
            "median": statistics.median(times),
            "min": min(times),
            "repeats": len(times),
        }
        for name, times in samples.items()
    }


def first_minibatch(trainer, *, episode_ends: bool = True) -> TensorDictBase:
    """The first ``[B, Lp]`` minibatch of a ``rppo_td.train.Trainer``'s first update.

    With ``episode_ends=False`` the rollout's done flags and ``is_init`` are cleared before the
    update prepares it, so each worker's ``T`` steps make the fewest sequences,
    ``ceil(T / L)``, as in a late update of a solved run (the first rollout's random episodes
    are short).
    """
    ppo = trainer.ppo
    rollout = next(trainer._batches)
    if not episode_ends:
        for key in rollout.keys(True, True):
            name = key[-1] if isinstance(key, tuple) else key
            if name in ("done", "terminated", "truncated", "is_init"):
                rollout.set(key, torch.zeros_like(rollout.get(key)))
    rollout = ppo.prepare(rollout).select(*ppo.keys)
    return next(iter(ppo.sampler(ppo.padder(rollout))))


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------
def environment() -> dict[str, object]:
    """What the figures were measured on."""
    import tensordict
    import torchrl

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "tensordict": tensordict.__version__,
        "torchrl": torchrl.__version__,
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "cpu": cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else ``platform.processor()``.

    Recorded with each run: the same seed takes another path on another CPU model (the
    floating-point results differ in the last bits and the runs fork), so a run of one
    machine never stands in for, or replaces, the same seed's run of another.
    """
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run_trainer(args: list[str], out: Path) -> tuple[dict[str, object], dict | None]:
    """Runs ``python -m rppo_td.train ARGS --output OUT`` as its own process.

    Returns the run's row (``command``, ``returncode``, ``process_wall_s``, and ``error``, the
    end of its stderr, where it failed or wrote no ``summary.json``) and its summary (None
    where it failed).
    """
    cmd = [sys.executable, "-m", "rppo_td.train", *args, "--output", str(out)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    row: dict[str, object] = {
        "command": " ".join(cmd[1:]),
        "returncode": proc.returncode,
        "process_wall_s": time.perf_counter() - start,
    }
    summary = out / "summary.json"
    if proc.returncode != 0 or not summary.exists():
        row["error"] = proc.stderr[-2000:]
        return row, None
    return row, json.loads(summary.read_text())


def train_refusal(argv: list[str]) -> str | None:
    """``rppo-train``'s one-line refusal of ``argv`` (without its ``prog: error:``), or None.

    Checked with its own parser, before any run: a setting it refuses would otherwise fail
    every run made with it, one after the other.
    """
    from rppo_td.train._cli import config_from_args

    with contextlib.redirect_stderr(io.StringIO()) as said:
        try:
            config_from_args(argv)
        except SystemExit as refused:
            if refused.code:
                return said.getvalue().strip().removeprefix("rppo-train: error: ")
    return None


# rppo-train's --seed bound (numpy's generators take 32-bit seeds)
MAX_SEED = 2**32 - 1


def check_seeds(parser: argparse.ArgumentParser, flag: str, seeds: list[int] | None) -> None:
    """Refuses (``parser.error``, naming ``flag``) seeds out of rppo-train's range or repeated.

    A seed of -1 failed its run after the others, and a repeated one trained twice.
    """
    given = seeds or []
    if any(not 0 <= seed <= MAX_SEED for seed in given) or len(set(given)) < len(given):
        parser.error(f"{flag} must be distinct integers in [0, {MAX_SEED}], got {given}")


def at_least(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse type: an int >= ``low`` (and <= ``high`` when given): ``--repeats 0`` is
    refused by its flag's name before any work, not a ``StatisticsError`` after it."""
    expected = f"an int >= {low}" if high is None else f"an int in [{low}, {high}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
        return value

    return parse


def finite_float(text: str) -> float:
    """An argparse type: a finite float (NaN and infinities refused by the flag's name)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite float > 0 (a negative budget or rate is refused by name)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {value}")
    return value


def results_name(text: str) -> str:
    """``--output``'s ``type``: a results name whose folder can be written, checked up front.

    The name is ``benchmarks/results/<name>.json`` (it may hold folders, or be an absolute
    path); its folder is made and a file created and removed in it now, so that a bad name
    ends the script before its work, not after it with the results lost.
    """
    name = text.removesuffix(".json")
    path = RESULTS / f"{name}.json"
    if not name or name.endswith(("/", "\\")) or not Path(name).name:
        raise argparse.ArgumentTypeError(
            f"must name a file (benchmarks/results/NAME.json, NAME may hold folders), got {text!r}"
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".probe-"):
            pass
    except (FileExistsError, NotADirectoryError):
        raise argparse.ArgumentTypeError(
            f"{text!r}: {path.parent} is not a folder (a file is in its place)"
        ) from None
    except OSError as err:
        raise argparse.ArgumentTypeError(
            f"{text!r}: cannot write in {path.parent} ({err.strerror or err})"
        ) from None
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: {path} is a folder")
    return name


def write_json(name: str, payload: dict[str, object]) -> Path:
    """Writes ``benchmarks/results/<name>.json`` and returns its path.

    A result already there is never overwritten (the docs cite it by name): the new run
    goes to ``<name>-<UTC time>.json`` beside it (``-2``, ``-3``, ... after it where runs
    finish in the same second; each file is created exclusively). Quick runs
    (``<name>_quick``), ignored by git, are overwritten.
    """
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = name.removesuffix(".json")
    text = json.dumps({"environment": environment(), **payload}, indent=2) + "\n"
    path = RESULTS / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)  # a name may hold folders: sub/name
    if name.endswith("_quick"):
        path.write_text(text)
        return path
    # created exclusively: two runs finishing in the same second get two files
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    candidates = [path, RESULTS / f"{name}-{stamp}.json"]
    candidates += (RESULTS / f"{name}-{stamp}-{i}.json" for i in range(2, 1000))
    for path in candidates:
        try:
            f = path.open("x")
        except FileExistsError:
            continue
        try:
            with f:
                f.write(text)
        except BaseException:
            path.unlink(missing_ok=True)  # no half file under a name the docs may cite
            raise
        return path
    raise FileExistsError(f"write_json: no free name for {name!r} under {RESULTS}")


def format_seconds(seconds: float | None) -> str:
    """``1.23 ms`` style, or ``-`` for a missing figure."""
    if seconds is None:
        return "-"
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} us"


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    """Prints a Markdown table (so it can be pasted into docs/benchmarks.md as is).

    A ``|`` inside a cell (``max |error|``) is escaped, so it does not split the cell.
    """
    headers = [h.replace("|", "\\|") for h in headers]
    rows = [[c.replace("|", "\\|") for c in row] for row in rows]
    if not rows:
        raise ValueError("print_table: no rows to print")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for row in rows:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |")


def shape_dict(shape: RolloutShape) -> dict[str, object]:
    """The shape as JSON."""
    return asdict(shape)


def wilson(solved: int, runs: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a rate ``solved / runs``."""
    if runs == 0:
        return 0.0, 1.0
    p = solved / runs
    centre = (p + z * z / (2 * runs)) / (1 + z * z / runs)
    half = z * math.sqrt(p * (1 - p) / runs + z * z / (4 * runs * runs)) / (1 + z * z / runs)
    return max(0.0, centre - half), min(1.0, centre + half)
