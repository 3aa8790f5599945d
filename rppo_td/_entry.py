"""The console scripts' entry points: ``rppo-train`` and ``rppo-eval``.

They import the trainer (torch, TorchRL, gymnasium: a second or more) with SIGINT and
SIGTERM held (``signals_deferred``), so that a Ctrl-C or a SIGTERM while it loads is one line
and exit status 130 once the imports are whole, not a traceback from inside an import, an
abort, or a half-imported numpy (or, for SIGTERM, a silent death).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any, TextIO

from rppo_td._signals import signals_deferred, terminate_as_interrupt

__all__ = ["evaluate", "guard_std_streams", "train"]


class QuietStream:
    """stderr whose writes never fail: once its file fails, what follows goes to devnull.

    A reader gone (``rppo-train ... 2>&1 | head -1``) or a file descriptor closed made the
    progress bar's or a log line's write raise, which ended the run (and the error line about
    it raised again). The run's output is its files; stderr only tells about them.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except (OSError, ValueError):
            self._drop()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError):
            self._drop()

    def isatty(self) -> bool:
        try:
            return self._stream.isatty()
        except (OSError, ValueError):
            return False

    def _drop(self) -> None:
        # the file descriptor too, so that the interpreter's last flush, C libraries and
        # processes started later write to devnull rather than fail again
        with contextlib.suppress(OSError, ValueError):
            _to_devnull(self._stream.fileno())
        self._stream = open(os.devnull, "w")  # noqa: SIM115 (lives as long as the process)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_std_streams() -> None:
    """Points closed standard file descriptors at devnull and makes stderr a ``QuietStream``.

    With ``2>&-`` the next file opened would get descriptor 2, and whatever writes to
    stderr from C (torch's warnings) would write into it: a run's own file, say.
    """
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            _to_devnull(fd)
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (lives as long as the process)
    if not isinstance(sys.stderr, QuietStream):
        sys.stderr = QuietStream(sys.stderr)  # type: ignore[assignment]


def _to_devnull(fd: int) -> None:
    """Points file descriptor ``fd`` at devnull."""
    devnull = os.open(os.devnull, os.O_RDWR)
    if devnull != fd:
        os.dup2(devnull, fd)
        os.close(devnull)


def train() -> None:
    """``rppo-train``: ``rppo_td.train.cli``."""
    guard_std_streams()
    try:
        with terminate_as_interrupt(), signals_deferred("rppo-train"):
            from rppo_td.train import cli
    except KeyboardInterrupt:
        _interrupted("rppo-train")
    cli()


def evaluate() -> None:
    """``rppo-eval``: ``rppo_td.train.evaluate_main``."""
    guard_std_streams()
    try:
        with terminate_as_interrupt(), signals_deferred("rppo-eval"):
            from rppo_td.train import evaluate_main
    except KeyboardInterrupt:
        _interrupted("rppo-eval")
    sys.exit(evaluate_main())


def _interrupted(prog: str) -> None:
    # a second Ctrl-C while this one is reported would end in a traceback (as cli() does)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print(f"{prog}: interrupted during start-up; nothing done", file=sys.stderr)  # noqa: T201
    sys.exit(130)
