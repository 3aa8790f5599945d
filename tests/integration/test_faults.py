"""Fault injection on real ``rppo-train`` processes: signals, kills, crashes, bad checkpoints.

Each faulted run is resumed to the end and compared, row for row, with one uninterrupted run
of the same settings: every update is logged exactly once (``metrics.csv`` and TensorBoard),
the values equal the uninterrupted run's, no ``*.tmp`` is left, and the checkpoint loads.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import pickle
import random
import signal
import struct
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import torch

from rppo_td.train._checkpoint import FORMAT_VERSION, load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
UPDATES = 24
EVERY = 3
SETTINGS = [
    "--num-workers",
    "2",
    "--rollout-steps",
    "8",
    "--sequence-length",
    "4",
    "--hidden-size",
    "8",
    "--epochs",
    "1",
    "--num-minibatches",
    "2",
    "--eval-episodes",
    "0",
    "--checkpoint-every",
    str(EVERY),
    "--total-steps",
    str(16 * UPDATES),
    "--no-progress",
]
# columns that depend on the clock, not on the run's state
CLOCK = {"wall_time_s", "fps", "collect_s", "learn_s", "collect_fps"}
FLAKY = "tests.integration.fault_envs:rppo_td_fault/Flaky-v0"

# A trainer whose checkpoint write for one update stalls halfway (the bytes written so far
# are in checkpoint.pt.tmp) and drops a marker file, so the test can signal it mid-save.
SLOW_SAVE = """
import os, sys, time, torch
marker, update, stall = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
real_save = torch.save
def slow_save(obj, f, *args, **kwargs):
    if isinstance(obj, dict) and obj.get("counters", {}).get("update") == update:
        f.write(b"PK\\x03\\x04 half a checkpoint")
        f.flush()
        open(marker, "w").close()
        time.sleep(stall)
        f.seek(0)
        f.truncate()
    return real_save(obj, f, *args, **kwargs)
torch.save = slow_save
from rppo_td.train import main
sys.exit(main(sys.argv[4:]))
"""


# A trainer whose disk fills up while it writes the checkpoint of one update. torch.save
# then raises its own RuntimeError while handling the OSError (as torch 2.13 does).
FULL_DISK = """
import errno, sys, torch
update = int(sys.argv[1])
real_save = torch.save
def full_save(obj, f, *args, **kwargs):
    if isinstance(obj, dict) and obj.get("counters", {}).get("update") == update:
        f.write(b"PK\\x03\\x04 half a checkpoint")
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos")
    return real_save(obj, f, *args, **kwargs)
torch.save = full_save
from rppo_td.train import main
sys.exit(main(sys.argv[2:]))
"""


def _command(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "rppo_td.train", *SETTINGS, "--output", str(out), *extra]


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
        check=False,
    )


def _start(args: list[str], **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        args,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


def _rows(out: Path) -> list[dict[str, str]]:
    path = out / "metrics.csv"
    if not path.exists():
        return []
    # one read, then parse: a DictReader over the open file could read an empty header line
    # and then rows the trainer appended in between (fieldnames None)
    text = path.read_text()
    return [row for row in csv.DictReader(io.StringIO(text, newline="")) if row.get("loss_total")]


def _wait(condition, proc: subprocess.Popen[str], what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended before {what}: {proc.communicate()[1][-2000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def _finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err


def _resume(out: Path) -> subprocess.CompletedProcess[str]:
    result = _run([sys.executable, "-m", "rppo_td.train", "--resume", str(out), "--no-progress"])
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def _tensorboard_steps(out: Path) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out))
    events.Reload()
    return [e.step for e in events.Scalars("train/loss_total")]


def _assert_same_as(reference: Path, out: Path) -> None:
    """``out`` logged every update once, with the reference run's values, and is tidy."""
    expected, got = _rows(reference), _rows(out)
    assert [r["update"] for r in got] == [str(u) for u in range(1, UPDATES + 1)]
    for a, b in zip(expected, got, strict=True):
        differing = sorted(k for k in a if k not in CLOCK and a[k] != b[k])
        assert not differing, f"update {a['update']}: {differing} differ"
    assert _tensorboard_steps(out) == [16 * u for u in range(1, UPDATES + 1)]
    assert not list(out.glob("*.tmp"))
    assert load_checkpoint(out)["counters"]["update"] == UPDATES
    assert len(list(out.glob("envs-*.pkl"))) == 1


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """One uninterrupted run."""
    out = tmp_path_factory.mktemp("faults") / "reference"
    result = _run(_command(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert len(_rows(out)) == UPDATES
    return out


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_sigkill_at_a_random_update_then_resume(reference, tmp_path, seed):
    out = tmp_path / "run"
    after = random.Random(seed).randint(1, UPDATES - 2)
    proc = _start(_command(out))
    _wait(lambda: len(_rows(out)) >= after, proc, f"update {after}")
    proc.send_signal(signal.SIGKILL)
    code, _ = _finish(proc)
    assert code == -signal.SIGKILL
    logged = len(_rows(out))
    if not (out / "checkpoint.pt").exists():
        # killed before the first checkpoint: nothing to resume, and the run says so
        assert logged < EVERY
        result = _run([sys.executable, "-m", "rppo_td.train", "--resume", str(out)])
        assert result.returncode == 2 and "--overwrite" in result.stderr
        assert _run(_command(out, "--overwrite")).returncode == 0
    else:
        saved = load_checkpoint(out)["counters"]["update"]
        assert saved <= logged and saved % EVERY == 0
        _resume(out)
    _assert_same_as(reference, out)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_one_signal_stops_after_the_update_with_a_checkpoint(reference, tmp_path, sig):
    out = tmp_path / "run"
    proc = _start(_command(out))
    _wait(lambda: len(_rows(out)) >= 5, proc, "update 5")
    proc.send_signal(sig)
    code, err = _finish(proc)
    assert code == 130, err[-2000:]
    assert "Traceback" not in err
    # the checkpoint is of the last logged update: nothing to redo
    assert load_checkpoint(out)["counters"]["update"] == len(_rows(out))
    _resume(out)
    _assert_same_as(reference, out)


def test_sigterm_during_start_up_stops_the_env_processes_in_one_line(tmp_path):
    # once the run's directory exists, start-up spawns the env processes: SIGTERM's default
    # action killed the trainer mid-spawn (its workers' tracebacks, leaked semaphores, an
    # empty directory left behind, no message)
    out = tmp_path / "run"
    proc = _start(_command(out, "--env-processes", "2"))
    _wait(out.exists, proc, "the run's directory")
    proc.send_signal(signal.SIGTERM)
    code, err = _finish(proc)
    assert code == 130, err[-2000:]
    assert "rppo-train: interrupted during start-up; nothing trained" in err, err[-2000:]
    assert "Traceback" not in err and "leaked" not in err, err[-2000:]
    assert not out.exists()  # the half-made directory is removed, as on a Ctrl-C


def test_double_sigint_aborts_and_keeps_the_last_checkpoint(reference, tmp_path):
    out = tmp_path / "run"
    proc = _start(_command(out))
    _wait(lambda: len(_rows(out)) >= 7, proc, "update 7")
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    code, err = _finish(proc)
    assert code == 130, err[-2000:]
    assert "last checkpoint" in err
    saved = load_checkpoint(out)["counters"]["update"]
    assert saved <= len(_rows(out))
    _resume(out)
    _assert_same_as(reference, out)


def test_sigkill_during_a_save(reference, tmp_path):
    out, marker = tmp_path / "run", tmp_path / "saving"
    proc = _start([sys.executable, "-c", SLOW_SAVE, str(marker), "9", "60", *_command(out)[3:]])
    _wait(marker.exists, proc, "the save of update 9")
    assert (out / "checkpoint.pt.tmp").exists()
    proc.send_signal(signal.SIGKILL)
    _finish(proc)
    # the half-written file never replaced the checkpoint of update 6
    assert load_checkpoint(out)["counters"]["update"] == 6
    _resume(out)
    _assert_same_as(reference, out)


def test_double_sigint_during_a_save_completes_it(reference, tmp_path):
    out, marker = tmp_path / "run", tmp_path / "saving"
    proc = _start([sys.executable, "-c", SLOW_SAVE, str(marker), "9", "1.5", *_command(out)[3:]])
    _wait(marker.exists, proc, "the save of update 9")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    code, err = _finish(proc)
    assert code == 130, err[-2000:]
    assert load_checkpoint(out)["counters"]["update"] == 9
    assert len(_rows(out)) == 9
    _resume(out)
    _assert_same_as(reference, out)


def test_full_disk_during_a_save_keeps_the_last_checkpoint(reference, tmp_path):
    out = tmp_path / "run"
    result = _run([sys.executable, "-c", FULL_DISK, "9", *_command(out)[3:]])
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert "No space left on device" in result.stderr.strip().splitlines()[-1]
    assert "last checkpoint (update 6) is kept" in result.stderr
    assert load_checkpoint(out)["counters"]["update"] == 6
    assert not list(out.glob("*.tmp"))
    _resume(out)
    _assert_same_as(reference, out)


def test_env_raising_mid_run_keeps_the_last_checkpoint(tmp_path):
    out = tmp_path / "flaky"
    # each env takes 8 steps per update: step 84 is inside update 11
    result = _run(_command(out, "--env", FLAKY), RPPO_TD_TEST_FAIL_AT_STEP="84")
    assert result.returncode == 1, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("rppo-train: error:")
    assert "rppo_td_fault/Flaky-v0" in result.stderr and "ZeroDivisionError" in result.stderr
    assert "last checkpoint (update 9) is kept" in result.stderr
    assert load_checkpoint(out)["counters"]["update"] == 9
    assert len(_rows(out)) == 10
    # the same run uninterrupted, and the faulted one resumed without the fault
    reference = tmp_path / "flaky_reference"
    assert _run(_command(reference, "--env", FLAKY)).returncode == 0
    _resume(out)
    _assert_same_as(reference, out)


def test_unpicklable_env_is_found_at_start_up(tmp_path, caplog):
    from rppo_td.train import TrainConfig, Trainer

    env = "tests.integration.fault_envs:rppo_td_fault/Unpicklable-v0"
    config = TrainConfig(
        env=env, total_steps=64, num_workers=2, rollout_steps=8, sequence_length=4,
        hidden_size=8, epochs=1, eval_episodes=0, progress=False,
        output=str(tmp_path / "unpicklable"),
    )  # fmt: skip
    trainer = Trainer(config)
    assert "cannot be pickled" in caplog.text  # before any update
    trainer.run()
    checkpoint = load_checkpoint(tmp_path / "unpicklable")
    assert checkpoint["env_state"] is None
    assert not list((tmp_path / "unpicklable").glob("envs-*.pkl"))
    # it resumes, restarting the envs, and says so
    caplog.clear()
    Trainer(config.replace(resume=config.output))
    assert "envs restart from a reset" in caplog.text


class _RunsCode:
    """Unpickling this object creates the file ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def _crafted_files(folder: Path, marker: Path) -> dict[str, Path]:
    files: dict[str, Path] = {}

    def put(name: str, write) -> None:
        path = folder / name / "checkpoint.pt"
        path.parent.mkdir(parents=True)
        write(path)
        files[name] = path

    put(
        "torch_dict",
        lambda p: torch.save({"format_version": FORMAT_VERSION, "x": _RunsCode(marker)}, p),
    )
    put("torch_object", lambda p: torch.save(_RunsCode(marker), p))
    put("plain_pickle", lambda p: p.write_bytes(pickle.dumps(_RunsCode(marker))))
    put("empty", lambda p: p.write_bytes(b""))
    put("random_bytes", lambda p: p.write_bytes(random.Random(0).randbytes(4096)))
    put("text", lambda p: p.write_text("not a checkpoint\n"))
    put("json", lambda p: p.write_text('{"eval_return_mean": 1.0}\n'))  # summary.json, say
    put("list", lambda p: torch.save([1, 2, 3], p))
    put("old_format", lambda p: torch.save({"format_version": 1, "config": {}}, p))
    put("missing_fields", lambda p: torch.save({"format_version": FORMAT_VERSION, "config": {}}, p))
    return files


def test_bad_checkpoints_never_run_code(reference, tmp_path, capsys):
    from rppo_td.evaluate import main as eval_main
    from rppo_td.train import main as train_main

    marker = tmp_path / "code_ran"
    files = _crafted_files(tmp_path / "bad", marker)
    # a real checkpoint cut short
    truncated = tmp_path / "bad" / "truncated" / "checkpoint.pt"
    truncated.parent.mkdir()
    blob = (reference / "checkpoint.pt").read_bytes()
    truncated.write_bytes(blob[: len(blob) // 2])
    files["truncated"] = truncated
    # a real checkpoint whose weights hold a NaN (bytes changed on the disk: torch.load
    # checks no CRC, and rppo-eval scored the damaged net as if it were whole)
    nan = tmp_path / "bad" / "nan_weight" / "checkpoint.pt"
    nan.parent.mkdir()
    data = torch.load(reference / "checkpoint.pt", weights_only=True)
    name = next(k for k, v in data["model"].items() if v.is_floating_point())
    data["model"][name].view(-1)[0] = float("nan")
    torch.save(data, nan)
    files["nan_weight"] = nan
    # a real checkpoint with bytes of one weight changed after it was written: it loaded
    # as another network (rppo-eval scored it, --resume trained on from it), silently
    flipped = tmp_path / "bad" / "flipped" / "checkpoint.pt"
    flipped.parent.mkdir()
    with zipfile.ZipFile(reference / "checkpoint.pt") as archive:
        weights = [info for info in archive.infolist() if "/data/" in info.filename]
        entry = max(weights, key=lambda info: info.file_size)  # a weight's bytes
    header = entry.header_offset  # the local header: 30 bytes, then its name and extra
    name_length, extra_length = struct.unpack("<HH", blob[header + 26 : header + 30])
    start = header + 30 + name_length + extra_length
    damaged = bytearray(blob)
    damaged[start + entry.file_size // 2] ^= 0x01  # one mantissa bit: a finite weight
    flipped.write_bytes(bytes(damaged))
    files["flipped"] = flipped
    for name, path in files.items():
        for command, args in (
            (eval_main, ["--checkpoint", str(path)]),
            (train_main, ["--resume", str(path.parent)]),
        ):
            code = _status(command, args)
            err = capsys.readouterr().err
            assert code == 2, (name, command.__module__, err[-2000:])
            lines = err.strip().splitlines()
            assert len(lines) == 1 and str(path) in lines[0], (name, lines)
            assert not marker.exists(), f"{name}: loading ran code"
            if name in ("text", "json", "plain_pickle", "random_bytes"):
                # before: a text file "holds objects other than tensors and plain data"
                assert "checkpoints are the zip archives torch.save writes" in lines[0], lines
    # and through the real commands, as separate processes
    path = files["torch_dict"]
    for args in (
        [sys.executable, "-m", "rppo_td.evaluate", "--checkpoint", str(path)],
        [sys.executable, "-m", "rppo_td.train", "--resume", str(path.parent)],
    ):
        result = _run(args)
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert not marker.exists()


def _status(command, args: list[str]) -> int:
    """The exit status of a command's ``main``, returned or raised as ``SystemExit``."""
    try:
        return command(args)
    except SystemExit as exit_:
        return int(exit_.code or 0)


def test_eval_never_reads_the_env_copies(reference, tmp_path):
    out = tmp_path / "copy"
    out.mkdir()
    for path in reference.iterdir():
        (out / path.name).write_bytes(path.read_bytes())
    marker = tmp_path / "code_ran"
    (env_file,) = out.glob("envs-*.pkl")
    env_file.write_bytes(pickle.dumps(_RunsCode(marker)))
    result = _run([sys.executable, "-m", "rppo_td.evaluate", "--checkpoint", str(out)])
    assert result.returncode == 0, result.stderr[-2000:]
    assert not marker.exists()
    # --resume reads it only if its hash is the checkpoint's: a swapped file is not unpickled
    assert (
        hashlib.sha256(env_file.read_bytes()).hexdigest()
        != (load_checkpoint(out)["env_state"]["sha256"])
    )
    result = _run([sys.executable, "-m", "rppo_td.train", "--resume", str(out), "--no-progress"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert not marker.exists()
    assert "envs restart from a reset" in result.stderr


def test_a_fresh_run_never_replaces_a_run(reference, tmp_path):
    out = tmp_path / "copy"
    out.mkdir()
    for path in reference.iterdir():
        (out / path.name).write_bytes(path.read_bytes())
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    result = _run(_command(out))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "already holds a run" in lines[0] and "--overwrite" in lines[0]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    result = _run(_command(out, "--overwrite"))
    assert result.returncode == 0, result.stderr[-2000:]
    _assert_same_as(reference, out)
    assert len(list(out.glob("events.out.tfevents.*"))) == 1


def test_two_runs_never_share_a_directory(reference, tmp_path):
    out, marker = tmp_path / "run", tmp_path / "saving"
    # the first run stalls in its save of update 3, holding the directory
    first = _start([sys.executable, "-c", SLOW_SAVE, str(marker), "3", "60", *_command(out)[3:]])
    _wait(marker.exists, first, "the save of update 3")
    for args in (_command(out, "--overwrite"), [*_command(out)[:3], "--resume", str(out)]):
        result = _run(args)
        assert result.returncode == 2, result.stderr[-2000:]
        assert "in use by another rppo-train run" in result.stderr
    first.send_signal(signal.SIGKILL)
    _finish(first)
    # the kill released the lock: the run resumes (from scratch: no checkpoint was complete)
    result = _run(_command(out, "--overwrite"))
    assert result.returncode == 0, result.stderr[-2000:]
    _assert_same_as(reference, out)


def test_a_stale_env_file_that_cannot_be_removed_does_not_stop_the_run(
    tmp_path, monkeypatch, caplog
):
    # the checkpoint was saved, then removing the old envs-*.pkl failed: the run stopped
    # and its error named the checkpoint before as the one kept
    from rppo_td.train._checkpoint import save_checkpoint

    save_checkpoint(tmp_path, {"counters": {"update": 1}}, env_state=b"first")
    (old,) = tmp_path.glob("envs-*.pkl")
    unlink = Path.unlink

    def refuse(self, missing_ok=False):
        if self == old:
            raise PermissionError(1, "Operation not permitted", str(self))
        return unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", refuse)
    with caplog.at_level("WARNING"):
        save_checkpoint(tmp_path, {"counters": {"update": 2}}, env_state=b"second")
    assert f"could not remove {old}" in caplog.text
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert saved["counters"]["update"] == 2 and saved["env_state"]["file"] != old.name


def test_sigint_in_the_final_evaluation_of_a_background_run(tmp_path):
    # a shell starts `rppo-train ... &` with SIGINT ignored: the trainer stopped on a
    # `kill -INT` while it trained, but its final evaluation ignored it (for minutes)
    # an env whose steps take 10 ms: the evaluation of 50 episodes lasts seconds (5000 fast
    # ones were over within the 0.5 s below on a quick machine, and the run ended 0)
    out = tmp_path / "run"
    slow = "tests.integration.fault_envs:rppo_td_fault/Slow-v0"
    args = _command(out, "--env", slow, "--total-steps", "16", "--eval-episodes", "50")
    proc = subprocess.Popen(
        args,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "RPPO_TD_TEST_STEP_SLEEP": "0.01"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    # the last update's row and checkpoint (renamed into place whole): the evaluation is next
    done = lambda: len(_rows(out)) >= 1 and (out / "checkpoint.pt").exists()  # noqa: E731
    _wait(done, proc, "the last update's checkpoint")
    time.sleep(0.5)  # into the evaluation
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("SIGINT was ignored in the final evaluation") from None
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted during the final evaluation" in err, err[-2000:]
    assert "Traceback" not in err


@pytest.mark.parametrize("stderr", ["closed", "reader gone"])
def test_a_stderr_that_cannot_be_written_does_not_stop_the_run(tmp_path, stderr):
    # the progress bar's first write raised (BrokenPipeError, or a bad file descriptor), the
    # run ended with status 1 before training, and its error line raised again
    out = tmp_path / "run"
    args = [*_command(out, "--total-steps", "64", "--eval-episodes", "1"), "--progress"]
    read, write = os.pipe()
    os.close(read)  # `2>&1 | head -1` once head has gone
    try:
        if stderr == "closed":  # `2>&-`
            kwargs = {"preexec_fn": lambda: os.close(2), "stderr": None}
        else:
            kwargs = {"stderr": write}
        done = subprocess.run(
            args, cwd=ROOT, stdout=subprocess.PIPE, text=True, timeout=300, check=False,
            **kwargs,
        )  # fmt: skip
    finally:
        os.close(write)
    assert done.returncode == 0
    assert json.loads(done.stdout)["env_steps"] == 64
    assert (out / "checkpoint.pt").exists() and len(_rows(out)) == 4  # 64 steps of 2 x 8
