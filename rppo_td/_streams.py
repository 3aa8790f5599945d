"""Standard streams a command can always write: ``rppo-train ... 2>&-``, ``| head -1``.

``guard_std_streams`` is called first by ``rppo-train`` and ``rppo-eval`` (and their ``-m``
modules): a closed standard descriptor points at devnull, and stderr becomes a
``QuietStream``, which drops its writes once its file fails.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, TextIO

__all__ = ["QuietStream", "guard_std_streams"]


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
