"""SIGTERM as a Ctrl-C for the commands: ``terminate_as_interrupt``.

Imports nothing but the standard library: the console scripts use it before they load torch.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["terminate_as_interrupt"]


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Inside the block, SIGTERM raises ``KeyboardInterrupt`` as a Ctrl-C does.

    A command's start-up (loading torch, building env processes, creating the run's
    directory) and its final steps then end as on a Ctrl-C: one line, status 130, worker
    processes stopped and the half-made directory removed, where the default action would kill
    the process mid-spawn (its workers' tracebacks, leaked semaphores, an empty run directory).
    The trainer's own handler replaces this one while it trains. A handler someone else set
    (an embedding program's), or a call outside the main thread, is left as it is.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
