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


def test_a_refused_output_directory_is_one_line_on_every_rank(run):
    # rank 0 alone prepares the directory: rank 1 went on to the first broadcast and broke
    # off in a 27-line gloo traceback when rank 0 exited
    done = _torchrun("--preset", "smoke", "--output", str(run))
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("rppo-train: error")]
    # each rank says why (torchrun may stop rank 0 once rank 1 has exited, before it printed)
    assert 1 <= len(errors) <= 2 and all("already holds a run" in e for e in errors), done.stderr
    assert any(e.startswith("rppo-train: error: rank 1: output directory") for e in errors), (
        done.stderr
    )
    # torchrun's own ChildFailedError report follows; no rank prints a traceback
    assert "[rank1]" not in done.stderr and "closed by peer" not in done.stderr, done.stderr


def test_ranks_started_with_different_settings_refuse_together(tmp_path):
    # rank 1 with another num_minibatches waited forever in a collective; another
    # learning_rate trained on in silence
    script = tmp_path / "per_rank.py"
    script.write_text(
        "import os, sys\n"
        "from rppo_td.train import cli\n"
        "extra = ['--num-minibatches', '4', '--gamma', '0.9']\n"
        "extra = extra if os.environ['RANK'] == '1' else []\n"
        "sys.argv = ['rppo-train', *sys.argv[1:], *extra]\n"
        "cli()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", str(script), "--preset", "smoke"]
    command += ["--output", str(tmp_path / "run"), "--threads", "1"]
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("rppo-train: error")]
    assert errors, done.stderr[-3000:]
    assert all(
        "different settings: gamma=0.9 on rank 1 but 0.99 on rank 0; num_minibatches=4 on "
        "rank 1 but 2 on rank 0" in line
        for line in errors
    ), errors
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_the_group_resumes(run):
    done = _torchrun("--resume", str(run))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 1: only rank 0's envs are checkpointed" in done.stderr
    assert done.stderr.count("resumed") == 2  # both ranks loaded the checkpoint
    assert json.loads((run / "summary.json").read_text())["ranks_in_sync"] is True


# A 2-rank run that records, on each rank, what every update logs (the means PPOUpdate
# returns) and each rank's own loss terms before they are averaged over the ranks.
RANK_LOSSES = """
import json, sys
import torch.distributed as dist
from rppo_td.train import _ppo
from rppo_td.train._config import TrainConfig
from rppo_td.train._loop import Trainer
logged, own = [], []
call, mean = _ppo.PPOUpdate.__call__, _ppo.mean_over_ranks
def record_call(self, rollout, *, clip_epsilon):
    out = call(self, rollout, clip_epsilon=clip_epsilon)
    kept = ("epochs", "explained_variance")
    logged.append({k: v for k, v in out.items() if k.startswith("loss_") or k in kept})
    return out
def record_mean(values, world_size):
    if any(k.startswith("loss_") for k in values):  # not the explained variance's sums
        own.append({k: float(v) for k, v in values.items()})
    return mean(values, world_size)
_ppo.PPOUpdate.__call__, _ppo.mean_over_ranks = record_call, record_mean
config = TrainConfig(total_steps=512, num_workers=4, rollout_steps=16, hidden_size=16,
                     eval_episodes=0, progress=False, output=sys.argv[1], num_minibatches=2)
trainer = Trainer(config)
trainer.run()
everyone = [None, None]
dist.all_gather_object(everyone, (logged, own))
if dist.get_rank() == 0:
    print(json.dumps(everyone))
trainer.leave_group()
"""


def test_the_logged_loss_is_the_loss_over_every_rank(tmp_path):
    # each rank's loss terms are its own share: rank 0's alone were logged (the diagnostics,
    # reduced in the loss, were already every rank's)
    script = tmp_path / "rank_losses.py"
    script.write_text(RANK_LOSSES)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", str(script), str(tmp_path / "run")]
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (logged0, own0), (logged1, own1) = json.loads(done.stdout.strip().splitlines()[-1])
    # every rank logs the same, the rollout's explained variance (every rank's) too
    assert len(logged0) == len(own0) == 4 and logged0 == logged1
    assert all("explained_variance" in row for row in logged0)
    assert any(own0[u]["loss_critic"] != own1[u]["loss_critic"] for u in range(4))
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    for update, row in enumerate(rows[1:]):
        values = dict(zip(header, row.split(","), strict=True))
        for name in ("loss_objective", "loss_critic", "loss_entropy", "loss_total"):
            # the mean of the ranks' sums over the update's minibatches (2 an epoch)
            count = 2 * logged0[update]["epochs"]
            expected = (own0[update][name] + own1[update][name]) / 2 / count
            assert logged0[update][name] == pytest.approx(expected, rel=1e-6)
            assert logged0[update][name] == pytest.approx(float(values[name]), rel=1e-6)


# Rank 1 alone gets a SIGTERM at its third update; rank 0's closing steps (the plot) are slow
# and end by writing a marker file.
ONE_RANK_STOPPED = """
import os, signal, sys, time
from pathlib import Path
import torch.distributed as dist
from rppo_td.train import _loop, main
out = Path(sys.argv[1])
one_update, plot = _loop.Trainer._one_update, _loop._plot
def stopping_update(self):
    row = one_update(self)
    if dist.get_rank() == 1 and self.counters["update"] == 3:
        os.kill(os.getpid(), signal.SIGTERM)
    return row
def slow_plot(directory, config):
    time.sleep(3)
    plot(directory, config)
    (out / "closed").write_text("rank 0 closed the run's files")
_loop.Trainer._one_update, _loop._plot = stopping_update, slow_plot
sys.exit(main(["--preset", "smoke", "--total-steps", "4096", "--output", str(out)]))
"""


def test_a_signal_to_one_rank_lets_rank_0_close_the_run(tmp_path):
    # the signalled rank stopped with the others after the same update, then exited at once;
    # torchrun then stopped rank 0 while it was still closing the run's files
    script = tmp_path / "one_rank.py"
    script.write_text(ONE_RANK_STOPPED)
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", str(script), str(out)]
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert (out / "closed").exists(), done.stderr[-3000:]
    assert load_checkpoint(out)["counters"]["update"] == 3
    assert len((out / "metrics.csv").read_text().splitlines()) == 1 + 3


# Rank 0's envs (seeds 0, 1) run 3-step episodes whose every view is new; rank 1's (seeds 2,
# 3) 1-step episodes that see nothing new.
SPLIT_ENV = """
import gymnasium as gym
import numpy as np

class Split(gym.Env):
    observation_space = gym.spaces.Box(0.0, 10.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed is not None:
            self.long = seed < 2
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.full(1, self.t if self.long else 0, np.float32)
        return obs, 1.0, self.t >= (3 if self.long else 1), False, {}

gym.register("Split-v0", entry_point=Split)
"""


def test_two_ranks_log_every_ranks_schedule_episodes_and_novelty(tmp_path):
    # before: the schedules ran over a horizon 2x too long (one rank's steps against a budget
    # of all ranks'); the window of recent episodes held rank 1's alone (rank order, last 20);
    # novel_fraction was rank 0's
    (tmp_path / "split_env.py").write_text(SPLIT_ENV)
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": f"{REPO}:{tmp_path}", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", "-m", "rppo_td.train", "--env", "split_env:Split-v0"]
    command += ["--num-workers", "2", "--rollout-steps", "16", "--total-steps", "256"]
    command += ["--sequence-length", "4", "--num-minibatches", "2", "--hidden-size", "8"]
    command += ["--novelty-bonus", "0.1", "--eval-episodes", "0", "--no-progress"]
    command += ["--output", str(out)]
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = (out / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    values = [dict(zip(header, row.split(","), strict=True)) for row in rows[1:]]
    assert len(values) == 4  # 256 steps, 2 ranks x 2 envs x 16 steps an update
    first = float(values[0]["learning_rate"])
    for update, row in enumerate(values):
        assert float(row["learning_rate"]) == pytest.approx(first * (1 - update / 4))
        assert float(row["novel_fraction"]) == pytest.approx(0.5)
        # a single process stepping the 4 envs logs 3-step episodes beside the 1-step ones
        assert 1.0 < float(row["episode_length_mean"]) < 3.0


PER_RANK = (
    "import os, sys\n"
    "from rppo_td.train import cli\n"
    "mine = sys.argv[1:] if os.environ['RANK'] == '0' else os.environ['RANK1_ARGS'].split()\n"
    "sys.argv = ['rppo-train', *mine]\n"
    "cli()\n"
)


def _per_rank(tmp_path, rank0: list[str], rank1: list[str]) -> subprocess.CompletedProcess[str]:
    """Two ranks started with their own flags (rank 1's through RANK1_ARGS)."""
    script = tmp_path / "per_rank.py"
    script.write_text(PER_RANK)
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}", "OMP_NUM_THREADS": "1"}
    env["RANK1_ARGS"] = " ".join(rank1)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", str(script), *rank0]
    return subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False
    )


def test_a_rank_resumed_beside_a_fresh_one_is_refused_on_both(run, tmp_path):
    # rank 0 resumed the run while rank 1 started afresh: rank 1 trained its own schedule
    # into the group's gradients, then both hung
    before = (run / "metrics.csv").read_text()
    fresh = ["--preset", "smoke", "--total-steps", "1024", "--target-kl", "1e-6"]
    done = _per_rank(tmp_path, ["--resume", str(run)], [*fresh, "--output", str(tmp_path / "new")])
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("rppo-train: error")]
    assert errors and all(
        "resumed_from_update=None on rank 1 but 4 on rank 0" in e for e in errors
    ), done.stderr[-3000:]
    assert (run / "metrics.csv").read_text() == before
    assert not (tmp_path / "new").exists()


FAILS_ON_RANK_1 = """
import os
import gymnasium as gym

class OnRank1(gym.Env):
    def __init__(self):
        if os.environ.get("RANK") == "1":
            raise RuntimeError("cannot build on rank 1")
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,))
        self.action_space = gym.spaces.Discrete(2)

gym.register("OnRank1-v0", entry_point=OnRank1, max_episode_steps=10)
"""


def test_an_env_failing_to_build_on_one_rank_is_one_line_on_every_rank(tmp_path):
    (tmp_path / "rank_env.py").write_text(FAILS_ON_RANK_1)
    args = ["--preset", "smoke", "--env", "rank_env:OnRank1-v0", "--output", str(tmp_path / "r")]
    done = _per_rank(tmp_path, args, args)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("rppo-train: error")]
    assert any("cannot build on rank 1" in e for e in errors), done.stderr[-3000:]
    # rank 0's first collective broke off: one line, no traceback (torchrun's own
    # ChildFailedError report follows)
    assert any(e.startswith("rppo-train: error: rank 0 lost the other ranks") for e in errors)
    assert "[rank0]:" not in done.stderr, done.stderr
    assert not (tmp_path / "r").exists()


FAILS_ON_RANK_1_LATER = """
import os
import gymnasium as gym
import numpy as np

class LaterOnRank1(gym.Env):
    def __init__(self):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,))
        self.action_space = gym.spaces.Discrete(2)
        self.steps = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, dtype=np.float32), {}

    def step(self, action):
        self.steps += 1
        if os.environ.get("RANK") == "1" and self.steps > 80:
            raise RuntimeError("boom")
        return np.zeros(2, dtype=np.float32), 1.0, False, False, {}

gym.register("LaterOnRank1-v0", entry_point=LaterOnRank1, max_episode_steps=10)
"""


def test_an_env_failing_while_training_on_one_rank_names_the_rank(tmp_path):
    # the failing rank's line named no rank (several nodes share torchrun's stderr), and rank
    # 0 said "the last checkpoint is kept" whether or not one had been saved
    import socket

    (tmp_path / "rank_env.py").write_text(FAILS_ON_RANK_1_LATER)
    out = tmp_path / "r"
    # 4 envs x 32 steps per update and rank: each env's 81st step is in update 3, after the
    # checkpoint of update 2 (checkpoint_every: 2)
    args = ["--preset", "smoke", "--env", "rank_env:LaterOnRank1-v0", "--total-steps", "2048"]
    args += ["--output", str(out)]
    done = _per_rank(tmp_path, args, args)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("rppo-train: error")]
    where = f"rppo-train: error: rank 1 on {socket.gethostname()}: env 'LaterOnRank1-v0'"
    assert any(e.startswith(where) and "boom" in e for e in errors), done.stderr[-3000:]
    lost = [e for e in errors if e.startswith("rppo-train: error: rank 0 lost the other ranks")]
    assert lost and lost[0].endswith("the last checkpoint (update 2) is kept"), errors
    assert load_checkpoint(out)["counters"]["update"] == 2
