"""C. Crafted checkpoints given to ``rppo-eval --checkpoint`` and ``rppo-train --resume``."""

from __future__ import annotations

import copy
import io
import random
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.adversarial.core import (
    CODE,
    CORRECT,
    EVAL,
    LOST,
    TINY,
    TRAIN,
    Case,
    Result,
    cli_crash_reason,
    cli_error,
    compare_metrics,
    digest_diff,
    fixtures,
    read_rows,
    run_proc,
    tree_digest,
)

CAT = "C. checkpoints"
MARKER = "PWNED"


def _real_run(directory: Path) -> Path:
    out = directory / "run"
    proc = run_proc([*TRAIN, *TINY, "--output", str(out)], cwd=directory, timeout=180)
    if proc.rc != 0 or not (out / "checkpoint.pt").is_file():
        raise RuntimeError("tiny training run failed: " + cli_crash_reason(proc))
    return out


def real_run_dir() -> Path:
    """A finished tiny run (read-only: copy it)."""
    return fixtures().get("real_run", _real_run)


def real_checkpoint() -> Path:
    """Its checkpoint.pt (read-only)."""
    return real_run_dir() / "checkpoint.pt"


def _load_real() -> dict[str, Any]:
    import torch

    # our own fixture, written by the code under test: trusted
    return torch.load(real_checkpoint(), map_location="cpu", weights_only=False)


class Evil:
    """Unpickling it runs ``code``."""

    def __init__(self, code: str, how: str = "exec") -> None:
        self.code = code
        self.how = how

    def __reduce__(self):
        if self.how == "system":
            import os

            return (os.system, (self.code,))
        return (exec, (self.code,))


def _evil(tmp: Path, how: str) -> Evil:
    path = tmp / MARKER
    if how == "system":
        return Evil(f"touch '{path}'", "system")
    return Evil(f"open({str(path)!r}, 'w').write('code ran')")


def _save(obj, path: Path, legacy: bool = False) -> None:
    import torch

    kw = {"_use_new_zipfile_serialization": False} if legacy else {}
    torch.save(obj, path, **kw)


def _bytes(fn: Callable[[bytes], bytes]) -> Callable[[Path, Path], None]:
    def write(tmp: Path, path: Path) -> None:
        path.write_bytes(fn(real_checkpoint().read_bytes()))

    return write


def _obj(fn: Callable[[Path], Any], legacy: bool = False) -> Callable[[Path, Path], None]:
    def write(tmp: Path, path: Path) -> None:
        _save(fn(tmp), path, legacy)

    return write


def _real_with(change: Callable[[dict, Path], None]) -> Callable[[Path], Any]:
    def make(tmp: Path) -> dict:
        data = copy.deepcopy(_load_real())
        change(data, tmp)
        return data

    return make


def _zip_not_torch(_real: bytes) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("hello.txt", "not a checkpoint")
    return buf.getvalue()


def _set(path: tuple, value) -> Callable[[dict, Path], None]:
    def change(data: dict, tmp: Path) -> None:
        target = data
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value(tmp) if callable(value) else value

    return change


def _drop(key: str) -> Callable[[dict, Path], None]:
    return lambda data, tmp: data.pop(key, None)


def _format_version() -> Any:
    return _load_real().get("format_version", 1)


# id -> (writer, extra words naming the problem, is the payload code?)
def variants() -> dict[str, tuple[Callable[[Path, Path], None], list, bool]]:
    return {
        "empty.file": (_bytes(lambda b: b""), [], False),
        "truncated.half": (_bytes(lambda b: b[: len(b) // 2]), [], False),
        "truncated.100.bytes": (_bytes(lambda b: b[:100]), [], False),
        "truncated.minus.1.byte": (_bytes(lambda b: b[:-1]), [], False),
        "random.bytes": (_bytes(lambda b: random.Random(0).randbytes(4096)), [], False),
        "text.file": (_bytes(lambda b: b"model: lstm\nthis is not a checkpoint\n"), [], False),
        "zip.not.torch": (_bytes(_zip_not_torch), [], False),
        "torch.tensor": (_obj(lambda tmp: __import__("torch").zeros(3)), [], False),
        "torch.list": (_obj(lambda tmp: [1, 2, 3]), [], False),
        "dict.empty": (_obj(lambda tmp: {}), [], False),
        "dict.format.only": (_obj(lambda tmp: {"format_version": _format_version()}), [], False),
        "future.format.version": (
            _obj(_real_with(_set(("format_version",), 99))),
            [("format", "version")],
            False,
        ),
        "missing.model": (_obj(_real_with(_drop("model"))), ["model"], False),
        "missing.config": (_obj(_real_with(_drop("config"))), ["config"], False),
        "missing.counters": (_obj(_real_with(_drop("counters"))), ["counters"], False),
        "missing.optimizer": (_obj(_real_with(_drop("optimizer"))), ["optimizer"], False),
        "config.bad.value": (
            _obj(_real_with(_set(("config", "hidden_size"), -1))),
            ["hidden_size"],
            False,
        ),
        "config.unknown.key": (
            _obj(_real_with(_set(("config", "warp_drive"), 1))),
            ["warp_drive"],
            False,
        ),
        "config.env.missing.module": (
            _obj(_real_with(_set(("config", "env"), "nosuchmod_adv:X-v0"))),
            ["nosuchmod_adv"],
            False,
        ),
        "config.not.dict": (_obj(_real_with(_set(("config",), "lstm"))), ["config"], False),
        "model.wrong.shape": (
            _obj(_real_with(_set(("config", "hidden_size"), 16))),
            [("model", "hidden_size", "size", "does not fit", "state_dict")],
            False,
        ),
        "model.not.dict": (_obj(_real_with(_set(("model",), [1, 2]))), ["model"], False),
        "counters.bad.types": (
            _obj(_real_with(_set(("counters",), {"update": "x"}))),
            ["counters"],
            False,
        ),
        "evil.toplevel.exec": (_obj(lambda tmp: _evil(tmp, "exec")), [], True),
        "evil.toplevel.system": (_obj(lambda tmp: _evil(tmp, "system")), [], True),
        "evil.in.config": (
            _obj(_real_with(_set(("config", "seed"), lambda tmp: _evil(tmp, "exec")))),
            [],
            True,
        ),
        "evil.in.collector": (
            _obj(_real_with(_set(("collector", "extra"), lambda tmp: _evil(tmp, "system")))),
            [],
            True,
        ),
        "evil.in.model.state": (
            _obj(_real_with(_set(("model", "_metadata_x"), lambda tmp: _evil(tmp, "exec")))),
            [],
            True,
        ),
        "evil.legacy.format": (
            _obj(
                lambda tmp: {"format_version": _format_version(), "x": _evil(tmp, "exec")},
                legacy=True,
            ),
            [],
            True,
        ),
    }


# what rppo-eval may do without: evaluating such a checkpoint is right, so is refusing it
EVAL_MAY_ACCEPT = {"missing.optimizer"}


def _case(command: str, name: str, writer, extra, evil) -> Case:
    def fn(tmp: Path) -> Result:
        ck = tmp / "ck"
        ck.mkdir()
        path = ck / "checkpoint.pt"
        writer(tmp, path)
        (tmp / MARKER).unlink(missing_ok=True)
        before = tree_digest(ck)
        if command == "eval":
            argv = [*EVAL, "--checkpoint", str(path), "--episodes", "1"]
        else:
            argv = [*TRAIN, "--resume", str(ck), "--no-progress"]
        proc = run_proc(argv, cwd=tmp, timeout=120)
        if (tmp / MARKER).exists():
            return Result(CODE, f"loading the crafted checkpoint ran its code (exit {proc.rc})")
        # a bad setting inside the checkpoint's config may be named alone (the setting)
        where = [] if name.startswith("config.") else [("checkpoint", str(path), str(ck))]
        if command == "eval" and name in EVAL_MAY_ACCEPT and proc.rc == 0:
            return Result(CORRECT)  # evaluation does not need what is missing
        res = cli_error(proc, [*where, *extra])
        if command == "resume":
            diff = digest_diff(before, tree_digest(ck))
            if diff and res.outcome != CODE:
                return Result(LOST, f"refused resume changed the run directory: {diff}")
        return res

    return Case(f"C.{command}.{name}", CAT, fn, kind="proc")


def _dir_case(command: str) -> Case:
    def fn(tmp: Path) -> Result:
        ck = tmp / "ck"
        (ck / "checkpoint.pt").mkdir(parents=True)
        argv = (
            [*EVAL, "--checkpoint", str(ck), "--episodes", "1"]
            if command == "eval"
            else [*TRAIN, "--resume", str(ck), "--no-progress"]
        )
        return cli_error(run_proc(argv, cwd=tmp), [("checkpoint",)])

    return Case(f"C.{command}.checkpoint.is.directory", CAT, fn, kind="proc")


def _valid_eval() -> Case:
    def fn(tmp: Path) -> Result:
        proc = run_proc([*EVAL, "--checkpoint", str(real_run_dir()), "--episodes", "1"], cwd=tmp)
        if proc.rc == 0 and '"eval_return_mean"' in proc.stdout:
            return Result(CORRECT)
        return Result("traceback", "real checkpoint not evaluable: " + cli_crash_reason(proc))

    return Case("C.eval.valid.real.checkpoint", CAT, fn, kind="proc")


def _valid_resume_finished() -> Case:
    def fn(tmp: Path) -> Result:
        run = tmp / "run"
        shutil.copytree(real_run_dir(), run)
        ref = read_rows(run / "metrics.csv") or []
        proc = run_proc([*TRAIN, "--resume", str(run), "--no-progress"], cwd=tmp)
        if proc.rc != 0:
            return Result("traceback", "resume of a finished run failed: " + cli_crash_reason(proc))
        why = compare_metrics(read_rows(run / "metrics.csv"), ref)
        return Result(CORRECT) if why is None else Result(LOST, why)

    return Case("C.resume.valid.finished.run", CAT, fn, kind="proc")


def all_cases() -> list[Case]:
    cases = []
    for name, (writer, extra, evil) in variants().items():
        for command in ("eval", "resume"):
            cases.append(_case(command, name, writer, extra, evil))
    cases += [_dir_case("eval"), _dir_case("resume"), _valid_eval(), _valid_resume_finished()]
    return cases
