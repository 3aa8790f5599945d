"""The console scripts' entry points: ``rppo-train`` and ``rppo-eval``.

They import the trainer (torch, TorchRL, gymnasium: a second or more) with SIGINT and
SIGTERM held (``signals_deferred``), so that a Ctrl-C or a SIGTERM while it loads is one line
and exit status 130 once the imports are whole, not a traceback from inside an import, an
abort, or a half-imported numpy (or, for SIGTERM, a silent death).
"""

from __future__ import annotations

import signal
import sys

from rppo_td._signals import signals_deferred, terminate_as_interrupt
from rppo_td._streams import guard_std_streams

__all__ = ["evaluate", "train"]


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
