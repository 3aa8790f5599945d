"""``torchrun`` data-parallel runs: 2 gloo ranks as real processes on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rppo_td.train._checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[2]


def _torchrun(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", "-m", "rppo_td.train", *args]
    return subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp") / "run"
    # a tiny target_kl stops updates early: the ranks must stop at the same epoch, or they hang
    # or part (ranks_in_sync)
    args = ("--preset", "smoke", "--total-steps", "1024", "--target-kl", "1e-6")
    done = _torchrun(*args, "--output", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    # rank 0 alone prints the summary
    assert done.stdout.count('"eval_return_mean"') == 1, done.stdout
    return out


def test_two_ranks_train_one_run_in_sync(run):
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert summary["ranks_in_sync"] is True  # parameters compared across ranks at the end
    # total_steps is the budget of the run, both ranks together: 2 x 4 envs x 32 steps per update
    assert summary["env_steps"] == 1024 and summary["updates"] == 4
    rows = (run / "metrics.csv").read_text().splitlines()
    assert len(rows) == 1 + 4  # one writer: no rank's rows twice
    assert [int(r.split(",")[1]) for r in rows[1:]] == [256, 512, 768, 1024]
    column = rows[0].split(",").index("epochs")
    epochs = [int(r.split(",")[column]) for r in rows[1:]]
    assert set(epochs) <= {1, 2} and 1 in epochs, epochs  # the smoke preset's 2, or stopped
    checkpoint = load_checkpoint(run)
    assert checkpoint["counters"]["env_steps"] == 1024
    assert all(torch.isfinite(v).all() for v in checkpoint["model"].values())


def test_the_group_resumes(run):
    done = _torchrun("--resume", str(run))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 1: only rank 0's envs are checkpointed" in done.stderr
    assert done.stderr.count("resumed") == 2  # both ranks loaded the checkpoint
    assert json.loads((run / "summary.json").read_text())["ranks_in_sync"] is True
