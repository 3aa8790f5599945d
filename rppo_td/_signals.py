"""Signals for the commands: ``terminate_as_interrupt``, ``signals_deferred``, ``interrupts_kept``.

SIGTERM as a Ctrl-C, SIGINT/SIGTERM held while the commands load their modules, and a Ctrl-C
that Python dropped raised again.

Imports nothing but the standard library: the console scripts use it before they load torch.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["interrupts_kept", "signals_deferred", "terminate_as_interrupt"]


@contextlib.contextmanager
def interrupts_kept() -> Iterator[None]:
    """Inside the block, a ``KeyboardInterrupt`` that Python dropped is raised again.

    A signal handler raises its ``KeyboardInterrupt`` in whatever code runs when the signal
    lands. If that is a weakref callback or a ``__del__`` (the garbage collector runs them at
    any allocation), Python prints "Exception ignored in ..." and drops the exception. A
    ``kill -INT`` during ``rppo-train``'s final evaluation was lost so: the run went on and
    exited 0. Inside this block such an interrupt is delivered again as a SIGINT
    (``_thread.interrupt_main``) from a timer thread 10 ms later, once the main thread has left
    the callback, and nothing is printed for it; the block's end waits for those timers, so
    an interrupt dropped just before it is raised there. Other unraisable exceptions go to the
    earlier hook.
    """
    previous = sys.unraisablehook
    timers: list[threading.Timer] = []

    def hook(unraisable: Any) -> None:
        dropped = unraisable.exc_type is not None and issubclass(
            unraisable.exc_type, KeyboardInterrupt
        )
        if not (dropped and callable(signal.getsignal(signal.SIGINT))):
            previous(unraisable)
            return
        # not from here: the SIGINT handler would run in this hook, and raise in it again
        timer = threading.Timer(0.01, _thread.interrupt_main, (signal.SIGINT,))
        timer.daemon = True
        timers.append(timer)
        timer.start()

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = previous
        for timer in timers:
            timer.join()


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Inside the block, SIGTERM raises ``KeyboardInterrupt`` as a Ctrl-C does.

    A command's start-up (loading torch, building env processes, creating the run's
    directory) and its final steps then end as on a Ctrl-C: one line, status 130, worker
    processes stopped and the half-made directory removed, where the default action would kill
    the process mid-spawn (its workers' tracebacks, leaked semaphores, an empty run directory).
    The trainer's own handler replaces this one while it trains. A handler someone else set
    (an embedding program's), or a call outside the main thread, is left as it is.

    SIGINT too, where the command started with it ignored (a shell starts ``cmd &`` so):
    the trainer stops on it while it trains, so a ``kill -INT`` during the final evaluation or
    start-up is not dropped either. Each disposition is restored on exit. An interrupt that
    lands in a weakref callback or ``__del__`` is raised again (``interrupts_kept``).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    restore: dict[int, Any] = {}
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:

        def interrupt(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        restore[signal.SIGTERM] = signal.signal(signal.SIGTERM, interrupt)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        restore[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with interrupts_kept():
            yield
    finally:
        for signum, handler in restore.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def signals_deferred(prog: str) -> Iterator[None]:
    """Holds SIGINT and SIGTERM until the block ends, then raises ``KeyboardInterrupt``.

    For loading torch, TorchRL and numpy: a ``KeyboardInterrupt`` raised inside an import
    can leave a module half-imported in ``sys.modules`` (numpy without ``logical_or``), make a
    C++ extension abort the process, or be taken by a library's handler for another error, so
    the command went on broken or died with a traceback. Held, the signal stops the command
    once the imports are whole (a second or two later). A second signal while held ends the
    process at once (nothing has been done yet). Outside the main thread nothing is held.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        if held:  # asked twice: stop now, as the user means
            sys.stderr.write(f"{prog}: interrupted during start-up; nothing done\n")
            os._exit(130)
        held.append(signum)

    previous = {
        signum: signal.signal(signum, hold)
        for signum in (signal.SIGINT, signal.SIGTERM)
        if signal.getsignal(signum) is not signal.SIG_IGN
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if held:
        raise KeyboardInterrupt
