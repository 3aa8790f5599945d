"""``env_processes``: the W envs stepped in TorchRL worker processes, same rollouts as in-process.

Each start of worker processes costs seconds (they are spawned), so the suite starts three
groups: one for identical rollouts, one for a worker's fault surfacing as ``EnvError``, and
one in a trainer subprocess that resumes an in-process run (the envs restart, with a warning)
and is stopped by Ctrl-C, leaving no process behind.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torchrl.envs.utils import ExplorationType, set_exploration_type

from rppo_td.envs import CARTPOLE_NOVEL_ID, EnvError, ProcessVectorEnv, make_vector_env
from rppo_td.modules import RecurrentActorCritic, RecurrentPolicy
from rppo_td.train import TrainConfig, Trainer
from rppo_td.train._setup import env_spaces
from rppo_td.train._vector_collector import VectorCollector
from tests.integration.fault_envs import DIE_MARKER, FAIL_AT_STEP

ROOT = Path(__file__).resolve().parents[2]
FLAKY = "tests.integration.fault_envs:rppo_td_fault/Flaky-v0"
DIES = "tests.integration.fault_envs:rppo_td_fault/Dies-v0"
W, T = 4, 60  # T long enough for episodes to end inside the rollout


def _rollout(processes: int) -> torch.Tensor:
    torch.manual_seed(0)
    net = RecurrentActorCritic(*env_spaces(CARTPOLE_NOVEL_ID), hidden_size=8)
    env = make_vector_env(CARTPOLE_NOVEL_ID, W, processes=processes)
    collector = VectorCollector(
        env, RecurrentPolicy(net), leaves=net.leaves, frames_per_batch=W * T, seed=3
    )
    try:
        torch.manual_seed(1)  # the same action samples on both sides
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            return collector.rollout()
    finally:
        collector.shutdown()


def test_two_processes_give_the_in_process_rollout():
    inside, outside = _rollout(0), _rollout(2)
    assert bool(inside["next", "done"].any()), "no episode ended: the test proves less"
    keys = sorted(inside.keys(True, True), key=str)
    assert keys == sorted(outside.keys(True, True), key=str)
    for key in keys:  # observations, rewards, flags, recurrent states, actions: bit for bit
        torch.testing.assert_close(outside.get(key), inside.get(key), rtol=0, atol=0, msg=str(key))


def test_rewards_cross_the_processes_unrounded():
    """PocMemory's -0.1 a step is not a float32: rewards reach the parent as the envs returned
    them (float64), so episode returns logged from them match an in-process run exactly."""
    import numpy as np

    inside = make_vector_env("rppo_td/PocMemory-v0", 4)
    outside = make_vector_env("rppo_td/PocMemory-v0", 4, processes=2)
    try:
        inside.reset(seed=0)
        outside.reset(seed=0)
        actions = np.random.default_rng(0).integers(0, 2, (40, 4))
        for action in actions:
            mine, theirs = inside.step(action), outside.step(action)
            assert theirs[1].dtype == np.float64 and np.array_equal(theirs[1], mine[1])
            assert np.array_equal(theirs[2], mine[2]) and np.array_equal(theirs[3], mine[3])
    finally:
        outside.close()
        inside.close()


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"num_workers": 4, "env_processes": 3}, ["env_processes=3", "num_workers=4"]),
        ({"num_workers": 4, "env_processes": 8}, ["env_processes=8", "num_workers=4"]),
        ({"env_processes": 2, "collector": "torchrl"}, ["env_processes=2", "torchrl"]),
    ],
)
def test_settings_are_checked(settings, words):
    with pytest.raises(ValueError) as err:
        TrainConfig(**settings)
    assert all(word in str(err.value) for word in words), err.value


def test_processes_must_divide_the_envs():
    with pytest.raises(ValueError, match="must divide"):  # before any worker starts
        make_vector_env(CARTPOLE_NOVEL_ID, 4, processes=3)


def test_a_fault_in_a_worker_is_the_env_error(monkeypatch):
    monkeypatch.setenv(FAIL_AT_STEP, "5")  # the spawned workers inherit it
    env = make_vector_env(FLAKY, 2, processes=2)
    assert isinstance(env, ProcessVectorEnv)
    env.reset(seed=0)
    start = time.monotonic()
    with pytest.raises(EnvError) as err:
        for _ in range(10):
            env.step(env.action_space.sample())
    assert time.monotonic() - start < 15, "the fault took too long to surface"
    message = str(err.value)
    assert "rppo_td_fault/Flaky-v0" in message and "ZeroDivisionError" in message, message
    assert "\n" not in message
    assert env.closed  # the workers were shut down
    env.close()


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_a_worker_that_dies_leaves_no_live_sibling(monkeypatch, tmp_path):
    # TorchRL's close failed on the dead worker before shutting the others down, and they
    # ignore SIGTERM: the live one held the trainer at exit forever
    monkeypatch.setenv(DIE_MARKER, str(tmp_path / "died"))
    env = make_vector_env(DIES, 2, processes=2)
    env.reset(seed=0)
    workers = [process.pid for process in env._env._workers]  # TorchRL's processes
    assert len(workers) == 2
    with pytest.raises(EnvError, match="a worker process failed"):
        for _ in range(10):
            env.step(env.action_space.sample())
    assert (tmp_path / "died").exists()
    assert env.closed
    assert not [pid for pid in workers if _alive(pid)]


def _children(pid: int) -> set[int]:
    """Pids whose parent is ``pid`` (read from /proc)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _rows(out: Path) -> int:
    """Lines of the run's ``metrics.csv`` (0 before it exists)."""
    try:
        return len((out / "metrics.csv").read_text().splitlines())
    except OSError:
        return 0


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_resumes_across_env_processes_and_ctrl_c_stops_the_workers(tmp_path, caplog):
    """0 -> 2 -> 0 env processes over two resumes; the middle run is a CLI run stopped by Ctrl-C.

    One subprocess (one start of workers) checks both that a run checkpointed in-process
    resumes in worker processes, saying the envs restart, and that Ctrl-C stops such a run
    (exit 130, a checkpoint, no traceback) with its workers.
    """
    out = tmp_path / "run"
    settings = {
        "total_steps": 100_000,  # the CLI run goes on until Ctrl-C
        "num_workers": 4,
        "rollout_steps": 16,
        "sequence_length": 8,
        "hidden_size": 8,
        "epochs": 1,
        "num_minibatches": 2,
        "checkpoint_every": 1,
        "eval_episodes": 0,
        "progress": False,
        "env_processes": 0,
        "output": str(out),
    }
    Trainer(TrainConfig(**settings)).run(stop_after_updates=1)
    assert [f.name for f in out.glob("envs-*.pkl")] == ["envs-00000001.pkl"]  # exact resume
    rows = _rows(out)

    command = [sys.executable, "-m", "rppo_td.train", "--resume", str(out)]
    command += ["--env-processes", "2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 40
        workers: set[int] = set()
        while time.monotonic() < deadline and proc.poll() is None:
            workers |= _children(proc.pid)
            if _rows(out) > rows and len(workers) >= 2:  # an update in the workers is done
                break
            time.sleep(0.2)
        assert proc.poll() is None, proc.stderr.read()[-2000:] if proc.stderr else ""
        assert len(workers) >= 2, "the worker processes never showed up"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=40)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    warned = [line for line in err.splitlines() if "restart from a reset" in line]
    assert len(warned) == 1, err[-2000:]
    assert "env_processes=2" in warned[0] and "worker processes" in warned[0]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(pid) for pid in workers):
        time.sleep(0.1)
    assert not [pid for pid in workers if _alive(pid)], "worker processes left behind"
    assert not list(out.glob("envs-*.pkl"))  # workers hand no envs out to pickle

    # and back in-process: the checkpoint of the worker run resumes, the envs restart again
    caplog.set_level(logging.WARNING)
    given = {"resume": str(out), "env_processes": 0}
    trainer = Trainer(TrainConfig(**{**settings, **given}), given=given)
    saved = trainer.counters["update"]
    assert saved >= 2
    assert trainer.run(stop_after_updates=saved + 1) is None
    assert trainer.counters["update"] == saved + 1
    warned = [r.getMessage() for r in caplog.records if "restart from a reset" in r.getMessage()]
    assert len(warned) == 1 and "no usable env state" in warned[0], warned
    assert [f.name for f in out.glob("envs-*.pkl")] == [f"envs-{saved + 1:08d}.pkl"]


def test_a_script_without_a_main_guard_is_told_so(tmp_path):
    # before: "a worker process failed (EOFError: )", the cause only in the worker's stderr
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from rppo_td.envs import CARTPOLE_NOVEL_ID, make_vector_env\n"
        "env = make_vector_env(CARTPOLE_NOVEL_ID, 2, processes=2)\n"
        "env.reset(seed=0)\n"
        "env.close()\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode != 0
    assert "a worker process failed" in done.stderr
    assert "if __name__ == '__main__':" in done.stderr.splitlines()[-1]


@pytest.mark.parametrize("ending", ["exit", "raise", "env alone"])
def test_workers_never_run_do_not_hold_the_interpreter_at_exit(tmp_path, ending):
    # the workers ignore SIGTERM, which multiprocessing sends its daemon children at exit
    # before joining them: a Trainer built and never run (or its env) hung the exit forever
    if ending == "env alone":
        body = (
            "from rppo_td.envs import ProcessVectorEnv\n"
            "env = ProcessVectorEnv('rppo_td/CartPoleNoVel-v1', 4, processes=2, kwargs={})\n"
            "env.reset(seed=0)\n"
        )
    else:
        body = (
            "from rppo_td.train import TrainConfig, Trainer\n"
            f"trainer = Trainer(TrainConfig(output={str(tmp_path / 'run')!r}, num_workers=4, "
            "rollout_steps=8, total_steps=64, env_processes=2, progress=False))\n"
        )
        if ending == "raise":
            body += "raise SystemExit(3)\n"
    script = tmp_path / "script.py"
    script.write_text(f"if __name__ == '__main__':\n{textwrap.indent(body, '    ')}")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == (3 if ending == "raise" else 0), done.stderr[-2000:]


def test_a_script_read_from_stdin_is_told_to_run_from_its_file(tmp_path):
    # the hint said to add an `if __name__ == "__main__":` guard, which cannot help here
    script = (
        "from rppo_td.train import TrainConfig, Trainer\n"
        f"Trainer(TrainConfig(output={str(tmp_path / 'run')!r}, num_workers=4, "
        "rollout_steps=8, total_steps=64, env_processes=2, progress=False))\n"
    )
    done = subprocess.run(
        [sys.executable, "-"], input=script, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "a script read from stdin (python - < script.py) cannot give them" in done.stderr
