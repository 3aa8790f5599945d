"""What a run writes: metrics.csv, TensorBoard events, learning_curve.png, summary.json."""

from __future__ import annotations

import csv
import json
import logging
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from rppo_td.train._checkpoint import ENV_STATE_PREFIX, env_state_files

try:
    import fcntl
except ImportError:  # not on Windows: runs there are not locked
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "SUMMARY_KEYS",
    "METRIC_FIELDS",
    "MetricsLog",
    "fcntl_available",
    "json_text",
    "print_result",
    "lock_run_directory",
    "plot_learning_curve",
    "prepare_run_directory",
    "time_split",
    "write_json_atomic",
]

log = logging.getLogger(__name__)

METRIC_FIELDS = (
    "update",
    "env_steps",
    "wall_time_s",
    "fps",
    "collect_s",
    "learn_s",
    "collect_fps",
    "episode_return_mean",
    "episode_length_mean",
    "episodes",
    "loss_objective",
    "loss_critic",
    "loss_entropy",
    "loss_total",
    "entropy",
    "clip_fraction",
    "kl_approx",
    "kl_k3",  # the KL estimate --target-kl compares (never negative)
    "ESS",
    "explained_variance",
    "grad_norm",
    "learning_rate",
    "clip_epsilon",
    "epochs",
    "skipped_steps",  # gradient steps not taken: their loss or gradient was not finite
    "novelty_bonus",  # novelty_bonus runs only: the bonus of this update's rollout
    "novel_fraction",  # ... and the share of its steps that earned it
)

# the fields summary.json, rppo-train's final output and rppo-eval's output have in common
SUMMARY_KEYS = (
    "eval_return_mean",
    "eval_return_std",
    "eval_episodes",
    "env_steps",
    "wall_time_s",
    "fps",
)


def time_split(collect_s: float, learn_s: float) -> str:
    """How one update's seconds divide between collection and learning, for the progress bar.

    Example:
        >>> time_split(0.25, 0.75)
        'collect 25% learn 75%'
    """
    share = collect_s / max(collect_s + learn_s, 1e-12)
    return f"collect {share:.0%} learn {1 - share:.0%}"


class MetricsLog:
    """Writes one row per update to ``metrics.csv`` and the same scalars to TensorBoard.

    A fresh run starts both. A resumed run first drops what was logged after its checkpoint
    (a run killed between checkpoints logged updates it will now redo): ``metrics.csv`` keeps
    the rows up to the checkpoint's update, and TensorBoard starts a new events file that
    purges the scalars after the checkpoint's step (``SummaryWriter(purge_step=...)``), so
    every update appears exactly once in both.

    Args:
        directory: the run's output directory.
        resume_from: ``(update, env_steps)`` of the checkpoint a resumed run starts from, or
            None for a fresh run.
        tensorboard: also write TensorBoard events.
    """

    def __init__(
        self,
        directory: Path,
        *,
        resume_from: tuple[int, int] | None = None,
        tensorboard: bool = True,
    ) -> None:
        self.path = directory / "metrics.csv"
        purge_step = None
        resuming = resume_from is not None and self.path.exists()
        if resume_from is not None and resuming:
            update, steps = resume_from
            _truncate_rows(self.path, update)
            purge_step = steps + 1
        elif resume_from is not None and resume_from[0] > 0:
            log.warning(
                "metrics.csv is missing: the rows of updates 1-%d are lost; a new one starts "
                "at update %d",
                resume_from[0],
                resume_from[0] + 1,
            )
        # TensorBoard's writer first: where it fails, no metrics.csv is left to make the
        # directory look like a run
        self._tb = _tensorboard(directory, purge_step) if tensorboard else None
        try:
            self._file = self.path.open("a" if resuming else "w", newline="")
        except BaseException:
            if self._tb is not None:
                self._tb.close()
            raise
        self._csv = csv.DictWriter(self._file, fieldnames=METRIC_FIELDS)
        if not resuming:
            self._csv.writeheader()
            self._file.flush()

    def write(self, row: dict[str, Any]) -> None:
        """Writes one update's row (missing fields are left empty)."""
        self._csv.writerow({k: row.get(k, "") for k in METRIC_FIELDS})
        self._file.flush()
        if self._tb is not None:
            step = int(row["env_steps"])
            for key in METRIC_FIELDS[2:]:
                value = row.get(key)
                if isinstance(value, int | float) and value == value:  # skip NaN
                    self._tb.add_scalar(f"train/{key}", value, step)
            self._tb.flush()

    def close(self) -> None:
        """Flushes and closes both writers."""
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def _tensorboard(directory: Path, purge_step: int | None) -> Any:
    """TensorBoard's ``SummaryWriter`` for ``directory``, or None (a warning) where it fails.

    It encodes the path as UTF-8, which a name of other bytes is not (a Latin-1 file name, or
    any non-ASCII one under an ASCII locale).
    """
    try:
        str(directory.absolute()).encode("utf-8")
    except UnicodeEncodeError:
        log.warning(
            "TensorBoard's events are not written: the output directory %r is not a UTF-8 "
            "path, which TensorBoard needs (metrics.csv holds every figure)",
            str(directory),
        )
        return None
    from torch.utils.tensorboard import SummaryWriter

    return SummaryWriter(log_dir=str(directory), purge_step=purge_step)


def _truncate_rows(path: Path, last_update: int) -> None:
    """Rewrites ``metrics.csv`` (atomically) with the rows of updates ``<= last_update``.

    A file of an earlier version's columns is rewritten under today's header too (a column
    it lacks is left empty in its rows), so that the rows a resumed run appends line up.
    """
    refused = (
        f"{str(path)!r} cannot be read as the run's CSV log ({{}}); move it away to resume "
        "without the earlier rows, or repair it"
    )
    try:
        # utf-8-sig: a spreadsheet's "CSV UTF-8" starts the file with a byte-order mark,
        # which would be read into the first column's name
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            header = tuple(reader.fieldnames or ())
    except (UnicodeDecodeError, csv.Error) as err:
        raise ValueError(refused.format(err)) from None
    if rows and "update" not in header:
        # another delimiter (a spreadsheet's semicolons) or another file: every row would be
        # dropped as malformed, and the file rewritten without them
        raise ValueError(refused.format(f"its header has no 'update' column: {header[:3]}"))
    for r in rows:  # a spreadsheet may write an update 6 as 6.0
        update = r.get("update")
        if isinstance(update, str) and update.endswith(".0") and update[:-2].isdigit():
            r["update"] = update[:-2]
    # a row cut short (a power cut before the file reached the disk) has None for the fields
    # it lacks; one too long has a None key
    whole = [
        r
        for r in rows
        if (r.get("update") or "").isdigit() and None not in r and None not in r.values()
    ]
    if rows and not whole:
        raise ValueError(refused.format(f"none of its {len(rows)} rows names an update"))
    kept = [r for r in whole if int(r["update"]) <= last_update]
    _warn_missing_updates([int(r["update"]) for r in kept], last_update)
    # rewritten whole even where nothing changes: the file may be a hard link of another
    # run's (a copy by cp -al or rsync --link-dest), which the rows appended next would reach
    if len(whole) < len(rows):
        log.warning("metrics.csv: dropping %d malformed rows", len(rows) - len(whole))
    extra = [name for name in header if name not in METRIC_FIELDS]
    if extra:  # a column a user added (a note, say) is not in the rows written from now on
        log.warning("metrics.csv: dropping the columns the run does not write: %s", extra)
    if len(kept) < len(whole):
        log.info(
            "metrics.csv: dropping %d rows logged after the checkpoint", len(whole) - len(kept)
        )
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=METRIC_FIELDS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(kept)
    os.replace(tmp, path)


def _warn_missing_updates(updates: list[int], last_update: int) -> None:
    """Warns naming the updates ``1..last_update`` whose rows ``metrics.csv`` lacks."""
    missing = sorted(set(range(1, last_update + 1)) - set(updates))
    if not missing:
        return
    spans, start = [], missing[0]
    for prev, here in zip(missing, [*missing[1:], 0], strict=True):
        if here != prev + 1:  # 0 ends the last span (updates count from 1)
            spans.append(str(start) if start == prev else f"{start}-{prev}")
            start = here
    log.warning(
        "metrics.csv lacks the rows of updates %s (of 1-%d, before the checkpoint): they are "
        "lost; the run goes on from the checkpoint",
        ", ".join(spans),
        last_update,
    )


# the files a run writes; a fresh run refuses a directory holding the first four kinds
RUN_FILES = ("checkpoint.pt", "summary.json", "metrics.csv", "events.out.tfevents.*", "envs-*.pkl")
OTHER_OUTPUTS = ("learning_curve.png",)


class DirectoryLock:
    """An exclusive ``flock`` on a directory itself, held until ``close()``.

    Locking the directory's own descriptor writes no file into it, and the system drops the
    lock when its holder exits, however it exits, so a killed run never leaves a stale lock.
    """

    #: the directories this process holds locked (resolved), to say who holds a refused one
    held: ClassVar[set[Path]] = set()

    def __init__(self, directory: Path) -> None:
        self._path: Path | None = None
        self._fd: int | None = os.open(directory, os.O_RDONLY)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self.close()
            if directory.resolve() in DirectoryLock.held:
                raise ValueError(
                    f"output directory {str(directory)!r} is held by another Trainer of this "
                    "process, built but not run or released (a notebook cell run again?): "
                    "call its release(), or delete it, first"
                ) from None
            raise ValueError(
                f"output directory {str(directory)!r} is in use by another rppo-train run; "
                "wait for it to end, or choose another --output"
            ) from None
        self._path = directory.resolve()
        DirectoryLock.held.add(self._path)

    def close(self) -> None:
        """Releases the lock (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._path is not None:
            DirectoryLock.held.discard(self._path)
            self._path = None

    def __del__(self) -> None:
        self.close()


def fcntl_available() -> bool:
    """Whether run directories can be locked here (POSIX ``flock``)."""
    return fcntl is not None


def lock_run_directory(directory: Path) -> DirectoryLock | None:
    """Takes ``directory``'s lock for this process (``DirectoryLock``).

    Without ``fcntl`` (Windows) nothing is locked and None is returned.

    Raises:
        ValueError: another process (or another run in this one) uses the directory.
    """
    return DirectoryLock(directory) if fcntl is not None else None


def prepare_run_directory(
    directory: Path,
    *,
    resuming: bool,
    overwrite: bool = False,
    keep: str | None = None,
    lock: bool = True,
) -> DirectoryLock | None:
    """Creates and locks the output directory, and protects a run already in it.

    A fresh run into a directory holding a run's files is refused unless ``overwrite``,
    which deletes those files (and no others). Leftover ``*.tmp`` files of an interrupted
    write are removed, and so are env-state files other than ``keep`` (the one the
    checkpoint being resumed names).

    Returns:
        The directory's lock (``lock_run_directory``), held until it is closed; None with
        ``lock=False`` (the caller holds it already).

    Raises:
        ValueError: the directory cannot be created or written, is in use by another run, or
            holds a run while neither ``resuming`` nor ``overwrite``.
    """
    where = repr(str(directory))
    taken = next((p for p in (directory, *directory.parents) if path_exists(p)), None)
    if taken is not None and not taken.is_dir():  # mkdir's "File exists" named no file
        raise ValueError(
            f"output directory {where} cannot be created: {str(taken)!r} is a file, not a "
            "directory; give --output another path"
        )
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as err:
        raise ValueError(
            f"output directory {where} cannot be created or written ({err.strerror or err})"
        ) from None
    handle = lock_run_directory(directory) if lock else None
    try:
        _protect(directory, resuming=resuming, overwrite=overwrite, keep=keep)
    except BaseException:
        if handle is not None:
            handle.close()
        raise
    return handle


def path_exists(path: Path) -> bool:
    """``path.exists()``, False where the path cannot be looked up at all.

    A name over 255 bytes makes ``exists`` raise ``ENAMETOOLONG``: making the directory then
    names the failure (status 2).
    """
    try:
        return path.exists()
    except OSError:
        return False


def _protect(directory: Path, *, resuming: bool, overwrite: bool, keep: str | None) -> None:
    where = repr(str(directory))
    found = sorted({p.name for pattern in RUN_FILES for p in _run_outputs(directory, pattern)})
    if found and not resuming:
        if not overwrite:
            shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
            raise ValueError(
                f"output directory {where} already holds a run ({shown}); continue it with "
                f"--resume {directory!s}, replace it with --overwrite, or choose another "
                "--output"
            )
        for pattern in (*RUN_FILES, *OTHER_OUTPUTS):
            for path in _run_outputs(directory, pattern):
                path.unlink()
        log.warning("--overwrite: deleted the previous run's files in %s", directory)
    for pattern in (*RUN_FILES, *OTHER_OUTPUTS):
        for path in _run_outputs(directory, pattern + ".tmp"):
            path.unlink(missing_ok=True)
    if resuming:
        for path in env_state_files(directory):
            if path.name != keep:
                path.unlink()


def _run_outputs(directory: Path, pattern: str) -> list[Path]:
    """The files in ``directory`` that ``pattern`` names; env copies by their exact form."""
    if pattern.startswith(ENV_STATE_PREFIX):  # "envs-*.pkl" or "envs-*.pkl.tmp"
        return env_state_files(directory, ".tmp" if pattern.endswith(".tmp") else "")
    return list(directory.glob(pattern))


def read_metrics(path: Path) -> list[dict[str, str]]:
    """The rows of a ``metrics.csv``."""
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def plot_learning_curve(directory: Path, *, title: str = "") -> Path | None:
    """Plots mean episode return against env steps from ``metrics.csv`` to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in read_metrics(directory / "metrics.csv") if r["episode_return_mean"]]
    out = directory / "learning_curve.png"
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([int(r["env_steps"]) for r in rows], [float(r["episode_return_mean"]) for r in rows])
    ax.set_xlabel("env steps")
    ax.set_ylabel("mean episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    # written beside it, then renamed: the old file may be a hard link of another run's
    # (cp -al), which writing in place would change, and a reader never sees half a PNG
    tmp = out.with_name(out.name + ".tmp")
    try:
        fig.savefig(tmp, dpi=100, format="png")
        os.replace(tmp, out)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return out


def print_result(text: str) -> None:
    """Prints a command's result to stdout; a reader that has gone (``| head``) is no error.

    stdout is then pointed at ``os.devnull``, so that the interpreter's last flush does not
    fail on the closed pipe again (Python's advice for ``BrokenPipeError``).
    """
    try:
        print(text, flush=True)  # noqa: T201 (the command's output)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def json_text(data: Any) -> str:
    """``data`` as indented, strict JSON, with ``null`` for each NaN or infinite float.

    ``eval_return_mean`` of a run with ``eval_episodes=0`` is NaN; Python's ``json`` would
    write it as ``NaN``, which strict JSON parsers refuse.

    Example:
        >>> print(json_text({"a": float("nan"), "b": [1.5, float("inf")]}))
        {
          "a": null,
          "b": [
            1.5,
            null
          ]
        }
    """
    return json.dumps(_finite(data), indent=2, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Writes ``data`` as ``json_text`` via a temporary file and ``os.replace``."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json_text(data) + "\n")
    os.replace(tmp, path)
