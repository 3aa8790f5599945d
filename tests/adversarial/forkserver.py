"""A fork server for ``python -m rppo_td.train`` / ``rppo_td.evaluate`` runs.

Importing torch, torchrl and gymnasium costs about 3 s of CPU per command, most of a config
case. The server imports them once, then forks one child per command; the child does what
``python -m MODULE ARGS`` does (``runpy``, ``sys.exit`` status, a printed traceback and exit 1
for an uncaught exception, death by SIGINT for an uncaught ``KeyboardInterrupt``) in its own
session, working directory and environment, with stdout/stderr in files. The modules are those
on disk when the server started. ``run_pass --no-fork`` uses plain subprocesses instead.

Protocol: one JSON request per line on stdin (``id``, ``module``, ``args``, ``cwd``, ``env``,
``stdout``, ``stderr``, ``limit``); replies on stdout: ``{"id", "pid"}`` once forked, then
``{"id", "rc"}`` when it ends (``rc`` negative for a signal, as ``subprocess`` reports it).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import signal
import sys
import time

PRELOAD = ("torch", "tensordict", "torchrl", "gymnasium", "rppo_td.train", "rppo_td.evaluate")


def _child(req: dict, proto_fds: list[int]) -> None:
    code = 1
    try:
        for fd in proto_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        os.setsid()
        with contextlib.suppress(ValueError, OSError):
            limit = int(req.get("limit", 0))
            if limit:
                resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        with contextlib.suppress(ValueError, OSError):
            fsize = int(req["env"].get("ADV_FSIZE", 0))
            if fsize:
                resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
        for sig in (signal.SIGTERM, signal.SIGALRM, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # what CPython does at start-up
            signal.signal(sig, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        null = os.open(os.devnull, os.O_RDONLY)
        out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in {null, out, err} - {0, 1, 2}:
            os.close(fd)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
        code = _run(req["module"], req["args"])
    except BaseException:
        with contextlib.suppress(BaseException):
            import traceback

            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code if isinstance(code, int) and 0 <= code < 256 else 1)


def _run(module: str, args: list[str]) -> int:
    import atexit
    import runpy
    import threading
    import traceback

    sys.argv = [module, *args]
    interrupted = False
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
        code = 130
    except BaseException:
        traceback.print_exc()
        code = 1
    with contextlib.suppress(BaseException):
        threading._shutdown()  # type: ignore[attr-defined]  # join non-daemon threads
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    if interrupted:  # what CPython does for an uncaught KeyboardInterrupt
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def serve() -> None:
    """Reads requests from stdin until EOF; forks a child per request."""
    import importlib
    import warnings

    warnings.simplefilter("ignore")
    for name in PRELOAD:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    proto_in = sys.stdin.buffer.raw.fileno()
    proto_out_fd = os.dup(1)
    proto_out = os.fdopen(proto_out_fd, "w", buffering=1)
    os.dup2(2, 1)  # stray prints of the server go to its stderr, never into the protocol
    children: dict[int, object] = {}
    buf = b""
    open_input = True
    proto_out.write(json.dumps({"ready": True}) + "\n")
    while open_input or children:
        ready = select.select([proto_in] if open_input else [], [], [], 0.02)[0]
        if ready:
            chunk = os.read(proto_in, 65536)
            if not chunk:
                open_input = False
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if not line.strip():
                    continue
                req = json.loads(line)
                pid = -1
                for attempt in range(6):  # EAGAIN: out of processes for a moment
                    try:
                        pid = os.fork()
                        break
                    except BlockingIOError:
                        time.sleep(2.0 * (attempt + 1))
                if pid < 0:
                    proto_out.write(json.dumps({"id": req["id"], "error": "fork failed"}) + "\n")
                    continue
                if pid == 0:
                    _child(req, [proto_in, proto_out_fd])
                children[pid] = req["id"]
                proto_out.write(json.dumps({"id": req["id"], "pid": pid}) + "\n")
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            rid = children.pop(pid, None)
            if rid is None:
                continue
            rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            proto_out.write(json.dumps({"id": rid, "rc": rc}) + "\n")


if __name__ == "__main__":
    serve()
