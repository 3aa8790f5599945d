"""``rppo-train`` and ``rppo-eval``: recurrent PPO on a gymnasium env, on the rppo_td pipeline.

``python -m rppo_td.train --help`` lists every setting; ``evaluate_main`` is ``rppo-eval``
(``python -m rppo_td.evaluate``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading

from rppo_td._signals import terminate_as_interrupt
from rppo_td._validation import first_line
from rppo_td.train._cli import build_parser, config_from_args, list_presets
from rppo_td.train._config import TrainConfig
from rppo_td.train._distributed import Ranks, RanksRefused, wait_for_ranks
from rppo_td.train._evaluate import evaluate_agent, load_agent
from rppo_td.train._evaluate import main as evaluate_main
from rppo_td.train._loop import Trainer, train
from rppo_td.train._outputs import SUMMARY_KEYS, json_text, print_result

__all__ = [
    "cli",
    "SUMMARY_KEYS",
    "TrainConfig",
    "Trainer",
    "build_parser",
    "evaluate_agent",
    "evaluate_main",
    "list_presets",
    "load_agent",
    "main",
    "train",
]


def main(argv: list[str] | None = None) -> int:
    """Console entry point; returns the exit status.

    0: the run finished. 2: bad settings, a bad checkpoint or output directory (one line on
    stderr, nothing trained). 1: the run failed (an env fault, a refused input or a full disk
    during training; the last checkpoint is kept). 130: stopped by a signal, a checkpoint saved, or
    aborted by a second Ctrl-C, the last checkpoint kept.

    A flag or value the parser refuses (an unknown flag, ``--total-steps 0``, an unknown env
    id) ends as argparse does: its line on stderr and ``SystemExit(2)``, also when ``main`` is
    called from Python; ``argv`` is a list of strings, as on the command line. ``log_level``
    configures logging here (``logging.basicConfig``, so only in a process that has none
    yet); ``train()`` and ``Trainer`` leave logging to the caller.
    """
    try:
        with terminate_as_interrupt():  # SIGTERM outside training: as a Ctrl-C
            return _main(argv)
    except KeyboardInterrupt:  # a Ctrl-C between the run's own guards
        print("rppo-train: interrupted", file=sys.stderr)  # noqa: T201
        return 130


def cli() -> None:
    """The ``rppo-train`` command: ``main()``, then exit without a traceback on a late Ctrl-C."""
    status = main()
    # the run is over: a Ctrl-C during interpreter shutdown (joining writer threads) must not
    # print a traceback over the run's last lines
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(status)


def _missing_package(err: BaseException) -> bool:
    """Whether ``err`` was raised from an ``ImportError`` (a missing package), at any depth.

    Only explicit causes (``raise ... from``) count, as the env wrappers raise them; an
    error met while handling an ``ImportError`` is not one.
    """
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ImportError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__
    return False


def _main(argv: list[str] | None) -> int:
    """``main`` without the outer interrupt guard."""
    from rppo_td.envs import EnvBuildError, EnvError

    config, given = config_from_args(argv)
    logging.basicConfig(level=config.log_level, format="%(levelname)s %(name)s: %(message)s")
    # a writer thread's failure (TensorBoard's, on a full disk) is one log line, not a trace;
    # the main thread then fails on its own write and stops the run
    threading.excepthook = _thread_error
    try:
        trainer = Trainer(config, given=given)
    except KeyboardInterrupt:
        print("rppo-train: interrupted during start-up; nothing trained", file=sys.stderr)  # noqa: T201
        return 130
    except (ValueError, KeyError, EnvError) as err:
        _error(err)
        if isinstance(err, RanksRefused):  # every rank has said why before any exits
            with contextlib.suppress(RuntimeError):  # a rank killed meanwhile: nothing to wait for
                wait_for_ranks()
        # an env that fails while running is a failure (1); one that cannot be built (its
        # entry point or constructor fails, or its optional package, an extra to install, is
        # missing) is a setting that cannot run, as an unknown env id is (2)
        built = isinstance(err, EnvBuildError) or _missing_package(err)
        return 1 if isinstance(err, EnvError) and not built else 2
    except OSError as err:  # a full disk, say, while reading or writing the run's files
        _error(f"cannot read or write the run's files: {err}")
        return 1
    except RuntimeError as err:
        if int(os.environ.get("WORLD_SIZE", "1")) < 2 or not _peer_lost(err):
            raise
        # another rank failed to start (its env could not be built, say) and this one's
        # first collective broke off
        return _lost_other_ranks(
            os.environ.get("RANK", "?"), " while starting", err, "nothing trained"
        )
    try:
        summary = trainer.run()
        trainer.leave_group()
    except KeyboardInterrupt:
        if trainer.summary_written:
            _error(
                "interrupted after the run finished: its summary.json is written, in "
                f"{str(trainer.directory)!r}"
            )
        elif trainer.counters["update"] == trainer.num_updates:
            _error(
                "interrupted during the final evaluation; the checkpoint of the last update "
                f"is kept: --resume {trainer.directory} evaluates it"
            )
        return 130
    except (ValueError, KeyError, EnvError) as err:
        # torchrun's ranks share one stderr: say whose env or input failed
        _error(err, trainer.ranks if trainer.ranks.distributed else None)
        return 1
    except OSError as err:  # the run's log names the checkpoint that is kept
        _error(f"cannot write the run's files in {str(trainer.directory)!r}: {err}")
        return 1
    except RuntimeError as err:
        if not (trainer.ranks.distributed and _peer_lost(err)):
            raise
        # another rank stopped (its env failed, say) and this one's collective broke off
        kept = (
            f"the last checkpoint (update {trainer.saved_update}) is kept"
            if trainer.saved_update
            else "no checkpoint was saved"
        )
        return _lost_other_ranks(trainer.ranks.rank, "", err, kept)
    if summary is None:
        return 130
    if trainer.ranks.main:
        print_result(json_text({k: summary[k] for k in SUMMARY_KEYS}))
    return 0


# what gloo and NCCL say when a peer's process has gone
_PEER_LOST = ("closed by peer", "reset by peer", "Connection closed", "Broken pipe", "aborted")


def _peer_lost(err: RuntimeError) -> bool:
    """Whether ``err`` is a collective's failure because another rank's process went away."""
    import torch.distributed as dist

    if isinstance(err, getattr(dist, "DistError", ())):
        return True
    text = str(err)
    return any(part in text for part in _PEER_LOST)


def _lost_other_ranks(rank: object, when: str, err: RuntimeError, outcome: str) -> int:
    """One line for a collective broken off by another rank's exit; returns the status, 1.

    That rank's own message says why it stopped: a torch traceback here would bury it.
    """
    _error(
        f"rank {rank} lost the other ranks{when} ({first_line(err, limit=200)}): another rank "
        f"stopped, and its own message says why; {outcome}"
    )
    return 1


def _thread_error(args: threading.ExceptHookArgs) -> None:
    name = args.thread.name if args.thread is not None else "a thread"
    logging.getLogger(__name__).error(
        "%s failed: %s: %s", name, getattr(args.exc_type, "__name__", "error"), args.exc_value
    )


def _error(err: BaseException | str, ranks: Ranks | None = None) -> None:
    """``rppo-train: error: ...`` on stderr; with ``ranks``, the rank and host first."""
    message = err.args[0] if isinstance(err, KeyError) and err.args else err
    if ranks is not None and not str(message).startswith(f"rank {ranks.rank} "):
        message = f"{ranks.where}: {message}"
    # one write, line and newline together: print() writes them apart, and the lines of
    # torchrun's ranks, which share one stderr, ran into each other between the two
    sys.stderr.write(f"rppo-train: error: {message}\n")
    sys.stderr.flush()
