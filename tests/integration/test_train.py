"""End-to-end runs of the trainer at tiny scale: outputs, resume, errors, other spaces."""

from __future__ import annotations

import csv
import json
import math
import pickle
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from rppo_td.evaluate import main as eval_main
from rppo_td.train import SUMMARY_KEYS, TrainConfig, Trainer, evaluate_agent, load_agent, main
from rppo_td.train._checkpoint import CheckpointError, load_checkpoint
from rppo_td.train._loop import _upgrade_collector_state

TINY = {
    "total_steps": 256,
    "num_workers": 4,
    "rollout_steps": 16,
    "sequence_length": 8,
    "hidden_size": 16,
    "epochs": 2,
    "num_minibatches": 2,
    "checkpoint_every": 2,
    "eval_episodes": 2,
    "progress": False,
}


class _FakeEnv(gym.Env):
    """A short episodic env: reward 1 when the action's first entry matches a hidden bit."""

    def __init__(self, observation_space: gym.Space, action_space: gym.Space) -> None:
        self.observation_space = observation_space
        self.action_space = action_space
        self._t = 0
        self._bit = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        self._bit = int(self.np_random.integers(2))
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        return self.observation_space.sample(), {}

    def step(self, action):
        self._t += 1
        first = np.asarray(action).reshape(-1)[0]
        reward = float((first > 0) == bool(self._bit))
        terminated = self._t >= 6 and self._bit == 1
        return self.observation_space.sample(), reward, terminated, False, {}


BOX = gym.spaces.Box(-1.0, 1.0, (3,), dtype=np.float32)


class ImageEnv(_FakeEnv):
    def __init__(self):
        super().__init__(
            gym.spaces.Box(0, 255, (12, 12, 3), dtype=np.uint8), gym.spaces.Discrete(2)
        )


class AmbiguousImageEnv(_FakeEnv):
    """``[3, 4, 4]`` uint8: channels first (C = 3) or last (C = 4), which auto refuses."""

    def __init__(self):
        super().__init__(gym.spaces.Box(0, 255, (3, 4, 4), dtype=np.uint8), gym.spaces.Discrete(2))


class TupleEnv(_FakeEnv):
    def __init__(self):
        super().__init__(
            gym.spaces.Tuple((BOX, gym.spaces.Discrete(4))), gym.spaces.MultiDiscrete([2, 3])
        )


class MultiDiscreteEnv(_FakeEnv):
    def __init__(self):
        super().__init__(gym.spaces.MultiDiscrete([3, 2]), gym.spaces.MultiDiscrete([2, 2]))


class DictBoxEnv(_FakeEnv):
    def __init__(self):
        super().__init__(
            gym.spaces.Dict({"pos": BOX, "flag": gym.spaces.Discrete(2)}),
            gym.spaces.Box(-1.0, 1.0, (2,), dtype=np.float32),
        )


FAKE_ENVS = {
    "Image": ImageEnv,
    "AmbiguousImage": AmbiguousImageEnv,
    "Tuple": TupleEnv,
    "MultiDiscrete": MultiDiscreteEnv,
    "DictBox": DictBoxEnv,
}
for _name, _cls in FAKE_ENVS.items():
    if f"rppo_td_test/{_name}-v0" not in gym.registry:
        gym.register(
            id=f"rppo_td_test/{_name}-v0",
            entry_point=_cls,
            max_episode_steps=10,
            disable_env_checker=True,
        )


def _run(tmp_path, name="run", **overrides):
    config = TrainConfig(**{**TINY, "output": str(tmp_path / name), **overrides})
    return Trainer(config), config


def _rows(directory) -> list[dict[str, str]]:
    with (directory / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def test_a_run_without_evaluation_writes_strict_json(tmp_path, capsys):
    """No evaluation leaves eval_return_mean NaN: summary.json and the printed summary hold
    null there, which strict parsers read (Python's json would write NaN)."""

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")

    out = tmp_path / "noeval"
    assert main(["--preset", "smoke", "--eval-episodes", "0", "--output", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out, parse_constant=refuse)
    summary = json.loads((out / "summary.json").read_text(), parse_constant=refuse)
    for data in (printed, summary):
        assert data["eval_return_mean"] is None and data["eval_return_std"] is None
        assert data["env_steps"] == 512


def test_smoke_run_writes_well_formed_outputs(tmp_path, capsys):
    out = tmp_path / "smoke"
    assert main(["--preset", "smoke", "--output", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    summary = json.loads((out / "summary.json").read_text())
    for key in SUMMARY_KEYS:
        assert key in summary and key in printed
        assert math.isfinite(summary[key])
    assert summary["env_steps"] == 512 and summary["eval_episodes"] == 2
    rows = _rows(out)
    assert len(rows) == 4
    assert [int(r["env_steps"]) for r in rows] == [128, 256, 384, 512]
    for row in rows:
        for key in (
            "loss_objective",
            "loss_critic",
            "loss_entropy",
            "clip_fraction",
            "kl_approx",
            "kl_k3",
            "ESS",
            "explained_variance",
            "fps",
            "episode_return_mean",
            "episode_length_mean",
        ):
            float(row[key])
    # each update's seconds split into collection and learning, adding up to the wall time
    walls = [0.0] + [float(r["wall_time_s"]) for r in rows]
    for row, before, after in zip(rows, walls, walls[1:], strict=False):
        collect, learn = float(row["collect_s"]), float(row["learn_s"])
        assert collect > 0 and learn > 0
        assert collect + learn == pytest.approx(after - before, abs=2e-6)
        assert float(row["collect_fps"]) == pytest.approx(128 / collect, rel=1e-4)
    split = summary["collect_time_s"] + summary["learn_time_s"]
    assert split == pytest.approx(summary["wall_time_s"], rel=1e-9)
    assert summary["collect_fraction"] == pytest.approx(
        summary["collect_time_s"] / summary["wall_time_s"]
    )
    # the checkpoints' writing, outside wall_time_s, is given apart (it was nowhere)
    assert summary["checkpoint_time_s"] > 0
    assert (out / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(out.glob("events.out.tfevents.*"))
    checkpoint = load_checkpoint(out)
    assert checkpoint["counters"]["env_steps"] == 512
    assert {"model", "optimizer", "rng", "config", "counters"} <= set(checkpoint)
    assert not list(out.glob("*.tmp"))
    # rppo-eval prints the same fields
    assert eval_main(["--checkpoint", str(out / "checkpoint.pt"), "--episodes", "3"]) == 0
    evaluation = json.loads(capsys.readouterr().out)
    assert evaluation["eval_episodes"] == 3
    assert evaluation["env_steps"] == 512
    for key in ("eval_return_mean", "eval_return_std", "wall_time_s", "fps"):
        assert key in evaluation
    # load_agent (what rppo-eval runs first) gives the checkpoint's agent: its weights, and
    # the same episodes as rppo-eval's (default --seed 10000)
    agent, loaded, data = load_agent(out)
    assert loaded.env == summary["config"]["env"]
    assert data["counters"]["env_steps"] == 512
    for name, value in agent.state_dict().items():
        assert torch.equal(value, checkpoint["model"][name]), name
    again = evaluate_agent(agent, loaded.env, episodes=3, seed=10_000)
    assert again["eval_returns"] == evaluation["eval_returns"]


@pytest.mark.parametrize("novelty", [0.0, 0.5])
def test_resume_equals_uninterrupted_run(tmp_path, novelty):
    # with novelty_bonus the open episodes' observations are checkpointed too (PocMemory's
    # positions repeat within an episode, and its episodes outlast a rollout)
    extra = {"novelty_bonus": novelty, "env": "rppo_td/PocMemory-v0"} if novelty else {}
    full, _ = _run(tmp_path, "full", total_steps=384, seed=5, **extra)
    full.run()
    part, config = _run(tmp_path, "part", total_steps=384, seed=5, **extra)
    assert part.run(stop_after_updates=2) is None
    assert load_checkpoint(tmp_path / "part")["counters"]["update"] == 2
    resumed = Trainer(config.replace(resume=str(tmp_path / "part")))
    assert resumed.counters["update"] == 2
    resumed.run()
    for key, value in full.agent.state_dict().items():
        torch.testing.assert_close(resumed.agent.state_dict()[key], value, rtol=0, atol=0)
    a, b = _rows(tmp_path / "full"), _rows(tmp_path / "part")
    assert len(a) == len(b) == 6
    for ra, rb in zip(a, b, strict=True):
        for key in (
            "env_steps",
            "episode_return_mean",
            "episode_length_mean",  # its window restored too
            "loss_objective",
            "loss_critic",
            "kl_approx",
            *(("novel_fraction", "novelty_bonus") if novelty else ()),
        ):
            assert ra[key] == rb[key], key


def test_novelty_bonus_is_for_learning_only(tmp_path):
    # masked CartPole pays 1 a step: the logged returns equal the episode lengths whatever
    # the bonus; the bonus falls linearly to 0 over novelty_steps, once per update
    trainer, _ = _run(tmp_path, total_steps=512, novelty_bonus=100.0, novelty_steps=128)
    summary = trainer.run()
    rows = _rows(tmp_path / "run")
    assert [float(r["novelty_bonus"]) for r in rows] == [100.0, 50.0] + [0.0] * 6
    for row in rows:
        if row["episode_return_mean"]:
            assert float(row["episode_return_mean"]) == float(row["episode_length_mean"])
        assert 0.0 < float(row["novel_fraction"]) <= 1.0  # float observations rarely repeat
    assert summary is not None and summary["eval_return_mean"] <= 500


def test_checkpoint_from_another_config_is_refused(tmp_path, capsys):
    out = tmp_path / "ck"
    assert main(["--preset", "smoke", "--output", str(out)]) == 0
    capsys.readouterr()
    code = main(["--preset", "smoke", "--resume", str(out), "--recurrence", "gru"])
    assert code == 2
    err = capsys.readouterr().err
    assert "checkpoint was written with another config" in err
    assert "recurrence: checkpoint 'lstm', requested 'gru'" in err
    # runtime settings may change; an unchanged config resumes (nothing left to do)
    assert main(["--preset", "smoke", "--resume", str(out), "--no-progress"]) == 0


def test_resume_without_checkpoint(tmp_path, capsys):
    assert main(["--resume", str(tmp_path / "nothing")]) == 2
    assert "no checkpoint at" in capsys.readouterr().err


def test_a_failed_save_names_the_update_it_was_saving(tmp_path, monkeypatch, caplog):
    # a full disk while saving update 4's checkpoint was reported as "during update 5"
    trainer, _ = _run(tmp_path)
    real_save, calls = trainer.save, []

    def save():
        calls.append(trainer.counters["update"])
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_save()

    monkeypatch.setattr(trainer, "save", save)
    with pytest.raises(OSError), caplog.at_level("ERROR"):
        trainer.run()
    assert calls == [2, 4]
    assert (
        "the run stopped while saving the checkpoint of update 4; the last checkpoint "
        "(update 2) is kept" in caplog.text
    )


def test_a_damaged_checkpoint_says_what_to_do(tmp_path, capsys):
    trainer, _ = _run(tmp_path)
    trainer.run()
    path = tmp_path / "run" / "checkpoint.pt"
    path.write_bytes(path.read_bytes()[:1000])  # truncated
    assert main(["--resume", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        "failed finding central directory); it cannot be resumed from: put back a good copy, "
        "or start the run again with --overwrite (which replaces its files)"
    ), err  # torch's first sentence, not its cut-off guesses
    # removed: the rows say how far the run got ("stopped before its first checkpoint"
    # alone was wrong, and --overwrite deletes those rows)
    path.unlink()
    assert main(["--resume", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    rows = len(_rows(tmp_path / "run"))
    assert f"though metrics.csv there logs {rows} updates" in err, err
    assert "or the file was removed; put a copy back to resume" in err, err


def test_a_resume_on_another_number_of_ranks_is_refused(tmp_path, capsys):
    # the budget is all ranks' steps: a 2-rank run resumed on one overshot it (and one
    # resumed on 2 ranks stopped at half), silently
    trainer, _ = _run(tmp_path, total_steps=512)
    trainer.run()
    trainer.release()
    path = tmp_path / "run" / "checkpoint.pt"
    data = torch.load(path, weights_only=True)
    data["counters"]["env_steps"] *= 2  # as a run of 2 ranks writes it
    torch.save(data, path)
    assert main(["--resume", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "was written by a run of 2 rank(s) (1024 env steps in 8 updates of 64 steps" in err
    assert "this run has 1: resume it on as many ranks as it started with" in err


@pytest.mark.parametrize("name", sorted(set(FAKE_ENVS) - {"AmbiguousImage"}))
def test_other_spaces_train(tmp_path, name):
    trainer, _ = _run(tmp_path, env=f"rppo_td_test/{name}-v0", recurrence="gru")
    summary = trainer.run()
    assert summary["env_steps"] == 256
    assert math.isfinite(summary["eval_return_mean"])
    assert all(math.isfinite(float(r["loss_total"])) for r in _rows(tmp_path / "run"))


def test_memoryless_control_trains(tmp_path):
    trainer, _ = _run(tmp_path, recurrence="none")
    assert trainer.run()["updates"] == 4


def test_torchrl_collector_path(tmp_path):
    trainer, _ = _run(tmp_path, collector="torchrl", total_steps=128)
    summary = trainer.run()
    assert summary["env_steps"] == 128
    rows = _rows(tmp_path / "run")
    assert len(rows) == 2


def test_truncation_bootstraps_from_the_final_observation(tmp_path):
    trainer, _ = _run(
        tmp_path, env="rppo_td/CartPoleNoVel-v1", num_workers=2, rollout_steps=600, total_steps=1200
    )
    # steer every worker to the 500-step limit by keeping the pole upright: set the state
    collector = trainer.collector
    collector.env.state[:] = 0.0  # the CartPoleNoVelVectorEnv's [W, 4] states
    collector.env.elapsed[:] = 498
    td = trainer.ppo.gae(collector.rollout())  # the trainer's GAE values "next" itself
    truncated = td["next", "truncated"].squeeze(-1)
    terminated = td["next", "terminated"].squeeze(-1)
    where = (truncated & ~terminated).nonzero()
    assert len(where), "no truncation happened"
    w, t = (int(i) for i in where[0])
    # replay step t from its stored entering state, then value the final observation
    step = td[w : w + 1, t].exclude("next")
    trainer.critic(step)
    following = td["next"][w : w + 1, t].select("observation")
    following.set("is_init", torch.zeros(1, 1, dtype=torch.bool))
    for key in trainer.agent.critic_state_keys:
        following.set(key, step["next", key])
    expected = trainer.critic(following)["state_value"]
    torch.testing.assert_close(td["next", "state_value"][w : w + 1, t], expected)
    # the next observation is the pre-reset one, and the step after it starts an episode
    assert not torch.equal(td["next", "observation"][w, t], td["observation"][w, t + 1])
    assert bool(td["is_init"][w, t + 1])


def test_collector_state_of_the_old_layout_resumes(tmp_path):
    # before actor and critic had their own state keys, one [W, layers, 2H] tensor per key
    # held both halves, not yet zeroed where is_init
    trainer, _ = _run(tmp_path)
    collector = trainer.collector
    w, h = collector.num_envs, trainer.agent.hidden_size
    joined = [torch.randn(w, 1, 2 * h) for _ in trainer.agent.actor_state_keys]
    is_init = torch.tensor([True] + [False] * (w - 1))
    obs = {"observation": torch.randn(w, 2)}
    old = {
        "obs": obs,
        "state": joined,
        "is_init": is_init,
        "running_return": torch.zeros(w, dtype=torch.float64),
        "running_length": torch.zeros(w, dtype=torch.int64),
    }
    new = _upgrade_collector_state(old, trainer.agent)
    collector.load_state_dict(new, collector.env_copies())
    carry = collector.state_dict()["carry"]
    for i, key in enumerate(trainer.agent.actor_state_keys):
        torch.testing.assert_close(carry[key][1:], joined[i][1:, :, :h])
        torch.testing.assert_close(carry["critic_" + key][1:], joined[i][1:, :, h:])
        assert not carry[key][0].any()
    assert carry["is_init"].tolist() == is_init.view(-1, 1).tolist()
    assert collector.rollout().batch_size == (w, TINY["rollout_steps"])


def test_unavailable_device_is_refused(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    assert main(["--preset", "smoke", "--device", "cuda", "--output", str(tmp_path / "d")]) == 2
    assert "CUDA is not available" in capsys.readouterr().err
    assert not (tmp_path / "d").exists()


def test_observation_statistics_freeze_after_normalizer_steps(tmp_path):
    trainer, config = _run(tmp_path, normalizer_steps=128)
    trainer.run()
    assert config.steps_per_update == 64
    assert float(trainer.agent.normalizer.count) == 128


@pytest.mark.parametrize("anneal_steps", [0, 256, 512, 1000])
def test_learning_rate_and_clip_fall_linearly_to_zero_over_anneal_steps(tmp_path, anneal_steps):
    """Both schedules fall by ``1 / anneal_updates`` an update (``anneal_steps // (W * T)``,
    ``num_updates`` at 0): over ``total_steps`` they reach 0 after the last update; a longer
    horizon leaves the run where a run of that length would be."""
    trainer, config = _run(tmp_path, anneal_steps=anneal_steps, learning_rate=0.01)
    trainer.run()
    horizon = {0: 4, 256: 4, 512: 8, 1000: 15}[anneal_steps]  # 64 steps an update
    assert config.anneal_updates == horizon
    rows = _rows(tmp_path / "run")
    assert len(rows) == config.num_updates == 4
    for update, row in enumerate(rows):
        remaining = 1 - update / horizon
        assert float(row["learning_rate"]) == pytest.approx(0.01 * remaining)
        assert float(row["clip_epsilon"]) == pytest.approx(max(0.2 * remaining, 1e-3))


def test_anneal_steps_shorter_than_an_update_is_refused():
    with pytest.raises(ValueError, match=r"anneal_steps=63 is shorter than one update.*64"):
        TrainConfig(**{**TINY, "anneal_steps": 63}).validate()


def test_output_directory_that_cannot_be_created(tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(["--preset", "smoke", "--output", str(blocker / "run")]) == 2
    err = capsys.readouterr().err
    assert "cannot be created" in err and str(blocker / "run") in err
    assert f"{str(blocker)!r} is a file, not a directory" in err  # it said "File exists"
    assert len(err.strip().splitlines()) == 1
    # a name over 255 bytes: looking it up raised, and the run ended with status 1
    too_long = tmp_path / ("x" * 300) / "run"
    assert main(["--preset", "smoke", "--output", str(too_long)]) == 2
    err = capsys.readouterr().err
    assert "cannot be created or written (File name too long)" in err
    assert len(err.strip().splitlines()) == 1


def test_resume_and_overwrite_together_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--resume", str(tmp_path), "--overwrite"])
    assert "contradict" in capsys.readouterr().err


def test_resume_into_another_output_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["--preset", "smoke", "--output", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["--resume", str(out), "--output", str(tmp_path / "elsewhere")]) == 2
    assert "is not the resumed run's directory" in capsys.readouterr().err


def test_a_checkpoint_resumed_beside_another_runs_checkpoint_is_refused(tmp_path, capsys):
    # the run resumes in the file's directory: another run's file dropped in there mixed the
    # two runs' metrics.csv and replaced that run's checkpoint and summary (status 0)
    flags = ["--preset", "smoke", "--no-progress", "--checkpoint-every", "1"]
    lstm, gru = tmp_path / "lstm", tmp_path / "gru"
    assert main([*flags, "--output", str(lstm)]) == 0
    assert main([*flags, "--output", str(gru), "--recurrence", "gru"]) == 0
    shutil.copy(gru / "checkpoint.pt", lstm / "gru.pt")
    before = {p.name: p.read_bytes() for p in lstm.iterdir()}
    capsys.readouterr()
    assert main(["--resume", str(lstm / "gru.pt")]) == 2
    err = capsys.readouterr().err
    assert "whose checkpoint.pt is another run's (recurrence: 'lstm' there, 'gru' here)" in err
    assert {p.name: p.read_bytes() for p in lstm.iterdir()} == before
    # an older checkpoint of the same run: its later updates would be dropped
    trainer, config = _run(tmp_path, "same")
    trainer.run(stop_after_updates=2)
    shutil.copy(tmp_path / "same" / "checkpoint.pt", tmp_path / "same" / "older.pt")
    Trainer(config.replace(resume=str(tmp_path / "same"))).run()
    with pytest.raises(ValueError, match=r"checkpoint.pt is of the same run at update 4: "
                       r"resuming update 2 would drop updates 3-4"):  # fmt: skip
        Trainer(config.replace(resume=str(tmp_path / "same" / "older.pt")))


def test_an_unreadable_checkpoint_is_one_line(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    assert main(["--preset", "smoke", "--output", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    real_open = Path.open

    def denied(self, *args, **kwargs):
        if self.name == "checkpoint.pt":
            raise PermissionError(13, "Permission denied")
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", denied)
    with pytest.raises(CheckpointError, match=r"checkpoint.pt' cannot be read \(Permission"):
        load_agent(out)


def test_resuming_a_finished_run_keeps_its_files(tmp_path, capsys, caplog):
    # it evaluated again, rewrote summary.json and added a TensorBoard file every time
    out = tmp_path / "run"
    assert main(["--preset", "smoke", "--output", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    summary = json.loads((out / "summary.json").read_text())
    with caplog.at_level("INFO"):
        assert main(["--resume", str(out)]) == 0
    assert json.loads(capsys.readouterr().out) == {k: summary[k] for k in SUMMARY_KEYS}
    assert "finished already" in caplog.text
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # stopped in its final evaluation (no summary.json): a resume evaluates it
    (out / "summary.json").unlink()
    assert main(["--resume", str(out)]) == 0
    capsys.readouterr()
    again = json.loads((out / "summary.json").read_text())
    assert again["eval_returns"] == summary["eval_returns"]
    assert again["env_steps"] == summary["env_steps"]
    assert sorted(p.name for p in out.iterdir()) == sorted(before)


def test_eval_episodes_are_bounded(capsys):
    with pytest.raises(SystemExit) as exit_:
        eval_main(["--checkpoint", "x", "--episodes", "100000000"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--episodes must be in [1, 10000]" in err and len(err.strip().splitlines()) == 1
    # before: a seed past what the env and torch take was "Overflow when unpacking long long"
    with pytest.raises(SystemExit) as exit_:
        eval_main(["--checkpoint", "x", "--episodes", "3", "--seed", str(2**64 - 2)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"--seed must be in [0, 2**64 - --episodes] = [0, {2**64 - 3}]" in err


def test_a_ctrl_c_anywhere_in_the_command_is_one_line(monkeypatch, capsys):
    import rppo_td.train as train_package

    def interrupted(argv):
        raise KeyboardInterrupt

    # outside the run's own guards (here: while the settings are read)
    monkeypatch.setattr(train_package, "config_from_args", interrupted)
    assert main([]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "rppo-train: interrupted"


def test_a_format_2_checkpoint_is_refused_with_the_reason(tmp_path, capsys):
    """Format 2 networks load into the same names but act differently: refused, saying why."""
    path = tmp_path / "old" / "checkpoint.pt"
    path.parent.mkdir()
    torch.save({"format_version": 2, "config": {}}, path)
    with pytest.raises(SystemExit):
        eval_main(["--checkpoint", str(path)])
    err = capsys.readouterr().err
    assert "format_version: 2" in err and "policy head" in err and "retrain" in err


def test_a_format_3_checkpoint_loads_centred_as_it_was_trained(tmp_path, capsys):
    """Format 3 predates ``center_observations`` and always centred: it loads with the setting
    on, so its agent is evaluated with the normalisation it was trained with."""
    trainer, config = _run(tmp_path, center_observations=True, total_steps=256)
    trainer.run()
    new = Path(config.output) / "checkpoint.pt"
    data = torch.load(new, weights_only=True)
    assert data["format_version"] == 4 and data["config"]["center_observations"] is True
    del data["config"]["center_observations"]
    old = tmp_path / "format3" / "checkpoint.pt"
    old.parent.mkdir()
    torch.save({**data, "format_version": 3}, old)
    loaded = load_checkpoint(old)
    assert loaded["format_version"] == 4 and loaded["config"]["center_observations"] is True
    capsys.readouterr()
    returns = []
    for path in (new, old):
        assert eval_main(["--checkpoint", str(path), "--episodes", "3"]) == 0
        returns.append(json.loads(capsys.readouterr().out)["eval_returns"])
    assert returns[0] == returns[1]


def test_env_copies_of_an_earlier_checkpoint_resume_in_the_array_env(tmp_path):
    # checkpoints written before CartPoleNoVelVectorEnv pickled W checked copies; loading
    # them into the array env goes on with the same episodes as the copies would
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    from rppo_td.envs import CARTPOLE_NOVEL_ID, make_env

    trainer, _ = _run(tmp_path)
    collector = trainer.collector
    w = collector.num_envs
    copies = SyncVectorEnv(
        [lambda: make_env(CARTPOLE_NOVEL_ID) for _ in range(w)],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    copies.reset(seed=11)
    for _ in range(7):
        copies.step(np.ones(w, dtype=np.int64))
    state = collector.state_dict()
    collector.load_state_dict(state, pickle.loads(pickle.dumps(copies.envs)))
    actions = np.array([0, 1] * (w // 2))
    for _ in range(50):
        ours, theirs = collector.env.step(actions), copies.step(actions)
        for a, b in zip(ours[:4], theirs[:4], strict=True):
            np.testing.assert_array_equal(a, b)
    # and its own state round-trips through the collector
    saved = pickle.loads(pickle.dumps(collector.env_copies()))
    ahead = [collector.env.step(actions)[0] for _ in range(20)]
    collector.load_state_dict(state, saved)
    for obs in ahead:
        np.testing.assert_array_equal(collector.env.step(actions)[0], obs)


def test_rppo_eval_reads_an_ambiguous_image_checkpoint_with_image_layout(tmp_path, capsys):
    """A checkpoint saved before image_layout existed (its config lacks the key) of a shape
    that reads either way: refused under auto, naming the setting; ``--image-layout`` says."""
    env = "rppo_td_test/AmbiguousImage-v0"
    trainer, config = _run(tmp_path, env=env, image_layout="channels_last", eval_episodes=1)
    trainer.run()
    path = Path(config.output) / "checkpoint.pt"
    data = torch.load(path, weights_only=True)
    del data["config"]["image_layout"]  # as an earlier version wrote it
    torch.save(data, path)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        eval_main(["--checkpoint", str(path), "--episodes", "1"])
    assert "reads either way" in capsys.readouterr().err
    args = ["--checkpoint", str(path), "--episodes", "2"]
    assert eval_main([*args, "--image-layout", "channels_last"]) == 0
    assert json.loads(capsys.readouterr().out)["eval_episodes"] == 2


def test_rppo_eval_refuses_an_image_layout_the_checkpoint_contradicts(tmp_path, capsys):
    env = "rppo_td_test/AmbiguousImage-v0"
    trainer, config = _run(tmp_path, env=env, image_layout="channels_last", eval_episodes=1)
    trainer.run()
    capsys.readouterr()
    args = ["--checkpoint", config.output, "--episodes", "1"]
    with pytest.raises(SystemExit) as info:
        eval_main([*args, "--image-layout", "channels_first"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "image_layout='channels_first' (rppo-eval's --image-layout) contradicts" in err
    assert "'channels_last'" in err
    assert eval_main([*args, "--image-layout", "channels_last"]) == 0  # the same: accepted
    # from Python, the same refusal names the argument
    with pytest.raises(ValueError, match=r"image_layout='channels_first' .*'channels_last'"):
        load_agent(config.output, image_layout="channels_first")


def test_rppo_eval_refuses_an_image_layout_on_a_run_without_images(tmp_path, capsys):
    """--image-layout on a vector run would be ignored: refused by name, in one line."""
    trainer, config = _run(tmp_path, eval_episodes=1)
    trainer.run()
    capsys.readouterr()
    args = ["--checkpoint", config.output, "--episodes", "1"]
    with pytest.raises(SystemExit) as info:
        eval_main([*args, "--image-layout", "channels_last"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and len(err.strip().splitlines()) == 1
    assert "--image-layout" in err and "uint8 image observations" in err
    assert eval_main(args) == 0


def test_rppo_train_refuses_an_image_layout_on_an_env_without_images(tmp_path, capsys):
    """It was ignored: a float image went to the MLP while the user asked for a layout."""
    out = tmp_path / "run"
    args = ["--total-steps", "1024", "--output", str(out), "--no-progress"]
    assert main([*args, "--image-layout", "channels_first"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "image_layout='channels_first' is for uint8 image observations" in err
    assert not out.exists()


def test_rppo_eval_stochastic_is_seeded(tmp_path, capsys):
    trainer, config = _run(tmp_path, eval_episodes=1)
    trainer.run()
    capsys.readouterr()
    runs = []
    for seed in (5, 5, 6):
        args = ["--checkpoint", config.output, "--episodes", "6", "--stochastic"]
        assert eval_main([*args, "--seed", str(seed)]) == 0
        runs.append(json.loads(capsys.readouterr().out)["eval_returns"])
    assert runs[0] == runs[1]  # the same seed: the same sampled actions


def test_total_steps_between_updates_is_rounded_down_and_said(tmp_path, caplog):
    caplog.set_level("INFO")
    trainer, _ = _run(tmp_path, total_steps=300)  # 4 x 16 = 64 steps an update
    trainer.release()
    assert trainer.num_updates == 4
    assert "total_steps=300 is not a multiple of one update" in caplog.text
    assert "4 updates, 256 env steps" in caplog.text


def test_a_run_that_fails_to_start_leaves_no_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("rppo_td.train._loop.build_agent", _raise_value_error)
    out = tmp_path / "new" / "run"
    existing = tmp_path / "existing"
    existing.mkdir()
    for directory in (out, existing):
        assert main(["--preset", "smoke", "--output", str(directory), "--no-progress"]) == 2
        assert "agent refused" in capsys.readouterr().err
    assert not out.exists() and existing.is_dir()  # made by the run: removed; the user's: kept


def _raise_value_error(config):
    raise ValueError("agent refused")


def test_a_signal_while_the_run_opens_its_logs_stops_it_after_one_update(
    tmp_path, monkeypatch, caplog
):
    # before: a Ctrl-C while metrics.csv and TensorBoard's writer were being opened (after
    # start-up, before the first update) left a header-only metrics.csv, no checkpoint and
    # no message; now the signal is taken as one between updates is
    import os
    import signal

    from rppo_td.train import _loop

    opened = _loop.MetricsLog.__init__

    def signalled(self, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        opened(self, *args, **kwargs)

    monkeypatch.setattr(_loop.MetricsLog, "__init__", signalled)
    trainer, _ = _run(tmp_path)
    with caplog.at_level("INFO", logger="rppo_td.train._loop"):
        assert trainer.run() is None
    assert load_checkpoint(tmp_path / "run")["counters"]["update"] == 1
    assert len(_rows(tmp_path / "run")) == 1
    assert "stopped at update 1; continue with --resume" in caplog.text


def test_a_reader_that_closes_the_pipe_is_no_error(tmp_path):
    # before: `rppo-eval ... | head -1` ended with a BrokenPipeError traceback
    import shlex
    import subprocess
    import sys

    trainer, _ = _run(tmp_path, eval_episodes=0)
    trainer.run()
    command = shlex.join(
        [sys.executable, "-m", "rppo_td.evaluate", "--checkpoint", str(tmp_path / "run")]
    )
    # the reader takes nothing and exits: the result's print meets a closed pipe
    done = subprocess.run(
        f"{command} --episodes 2 | true; exit ${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


def test_overwrite_and_resume_delete_the_runs_files_and_no_others(tmp_path):
    # before: --overwrite (and a resume's clean-up of older env copies) deleted a user's own
    # envs-mine.pkl, named like the env copies' glob
    trainer, config = _run(tmp_path)
    trainer.run()
    out = tmp_path / "run"
    mine = {"envs-mine.pkl": b"mine", "envs-1.pkl": b"one", "notes.txt": b"notes"}
    for name, data in mine.items():
        (out / name).write_bytes(data)
    Trainer(config.replace(resume=str(out))).release()
    trainer = Trainer(config.replace(overwrite=True))
    trainer.run()
    for name, data in mine.items():
        assert (out / name).read_bytes() == data
    assert len(list(out.glob("envs-[0-9]*.pkl"))) == 2  # the new run's copies, and envs-1.pkl


def test_a_finished_run_resumed_without_its_plot_gets_it(tmp_path):
    # a run killed between its last update and its plot: the resume evaluated it but never
    # wrote learning_curve.png
    trainer, config = _run(tmp_path)
    trainer.run()
    out = tmp_path / "run"
    (out / "learning_curve.png").unlink()
    (out / "summary.json").unlink()
    assert Trainer(config.replace(resume=str(out))).run() is not None
    assert (out / "learning_curve.png").stat().st_size > 0
    assert (out / "summary.json").exists()


def test_a_rank_without_the_checkpoint_says_which_rank_and_host(tmp_path, monkeypatch):
    # across machines each rank reads the run directory on its own node: rank 1 said only
    # "no checkpoint at 'run'"
    import socket

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    config = TrainConfig(resume=str(tmp_path / "run"), progress=False)
    with pytest.raises(ValueError, match=rf"^rank 1 on {socket.gethostname()}: .*checkpoint"):
        Trainer(config)


def test_an_interrupt_after_the_summary_is_written_says_the_run_finished(
    tmp_path, monkeypatch, capsys
):
    # it said "interrupted during the final evaluation ... --resume evaluates it", and the
    # resume then found the run finished already
    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "leave_group", interrupted)
    out = tmp_path / "run"
    assert main(["--preset", "smoke", "--eval-episodes", "1", "--output", str(out)]) == 130
    err = capsys.readouterr().err
    assert "interrupted after the run finished: its summary.json is written" in err
    assert "final evaluation" not in err
    assert json.loads((out / "summary.json").read_text())["env_steps"] > 0


class _FloatImageEnv(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (8, 8, 3), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros((8, 8, 3), np.float32), {}

    def step(self, action):
        return np.zeros((8, 8, 3), np.float32), 0.0, True, False, {}


def test_a_float_image_box_is_said_to_reach_the_mlp_flattened(caplog):
    # it went to the MLP flattened without a word, where a uint8 one goes through the CNN
    from rppo_td.train._setup import build_agent

    gym.register("probe/FloatImage-v0", entry_point=_FloatImageEnv)
    with caplog.at_level("WARNING"):
        build_agent(TrainConfig(env="probe/FloatImage-v0"))
    assert "observation 'observation' is a float Box [8, 8, 3]: the MLP reads it flattened" in (
        caplog.text
    )
    caplog.clear()
    with caplog.at_level("WARNING"):
        build_agent(TrainConfig())  # a vector: nothing to say
    assert "float Box" not in caplog.text


def test_a_trainer_runs_once_and_a_python_resume_checks_its_settings(tmp_path):
    # a second run() on the same Trainer reopened metrics.csv as a new run's: rows 1-2 lost,
    # summary.json said 8 updates. A resume from Python without given= dropped every other
    # setting in silence (learning_rate, env, threads); stop_after_updates took 0, -1 or "2"
    trainer, config = _run(tmp_path, total_steps=256)
    assert trainer.run(stop_after_updates=2) is None
    with pytest.raises(RuntimeError, match=r"called already \(the run is at update 2 of 4\)"):
        trainer.run()
    assert [row["update"] for row in _rows(tmp_path / "run")] == ["1", "2"]
    resume = config.replace(resume=str(tmp_path / "run"))
    with pytest.raises(ValueError, match=r"learning_rate: checkpoint 0\.004, requested 0\.1"):
        Trainer(resume.replace(learning_rate=0.1))
    resumed = Trainer(resume.replace(threads=2))
    assert resumed.config.threads == 2  # a setting that may change is applied
    # a second trainer on the directory (a notebook cell run again) was "another rppo-train run"
    with pytest.raises(ValueError, match="held by another Trainer of this process"):
        Trainer(resume)
    for bad in (0, 2, 5, -1, "3", 3.0, True):
        with pytest.raises(ValueError, match=r"stop_after_updates must be an int in \[3, 4\]"):
            resumed.run(stop_after_updates=bad)
    assert resumed.run(stop_after_updates=3) is None
    assert [row["update"] for row in _rows(tmp_path / "run")] == ["1", "2", "3"]
    finished = Trainer(resume)
    finished.run()
    with pytest.raises(ValueError, match="the run has done all its 4 updates"):
        Trainer(resume).run(stop_after_updates=4)  # said "an int in [5, 4]"
    # the run's own total_steps restated, less than a default rollout (128 x 8): the config
    # was checked against the defaults and refused; given= names checked, by name and bounds
    restated = Trainer(TrainConfig(resume=str(tmp_path / "run"), total_steps=256, progress=False))
    assert restated.config.total_steps == 256 and restated.config.num_workers == 4
    restated.release()
    with pytest.raises(KeyError, match=r"given: unknown setting\(s\) \['gama'\] \(did you mean"):
        Trainer(resume, given={"gama": 0.9})  # an AttributeError from inside
    with pytest.raises(ValueError, match=r"gamma must be a finite number in \[0.0, 1.0\], got 7"):
        Trainer(resume, given={"gamma": 7})  # was "checkpoint 0.99, requested 7"
    # a runtime setting is checked against the resumed run's settings, not the defaults
    with pytest.raises(ValueError, match="env_processes=3 must divide num_workers=4"):
        Trainer(resume.replace(env_processes=3))
    # a config changed after it was built is checked again (a ZeroDivisionError inside)
    changed = TrainConfig(**{**TINY, "output": str(tmp_path / "other")})
    changed.num_workers = 0
    with pytest.raises(ValueError, match="num_workers must be an integer in"):
        Trainer(changed)
    with pytest.raises(TypeError, match="Trainer needs a TrainConfig, got dict"):
        Trainer({"total_steps": 256})


def test_episode_means_are_empty_until_an_episode_ends(tmp_path):
    # Pendulum's episodes last 200 steps: 4 updates of 4 x 16 end none (they were "nan",
    # which a NaN check on metrics.csv took for a fault); then the means are written
    trainer, _ = _run(tmp_path, env="rppo_td/PendulumNoVel-v1", total_steps=1024, eval_episodes=0)
    trainer.run()
    rows = _rows(tmp_path / "run")
    assert "nan" not in {value for row in rows for value in row.values()}
    ended = [int(row["episodes"]) > 0 for row in rows]
    assert ended[:3] == [False] * 3 and ended[-1]
    for row, some in zip(rows, ended, strict=True):
        assert bool(row["episode_return_mean"]) == bool(row["episode_length_mean"]) == some
    assert float(rows[-1]["episode_length_mean"]) == 200.0


def test_the_update_uses_the_logged_learning_rate_and_clip(tmp_path, monkeypatch):
    # the annealing test read the logged values only: an optimizer a step behind, or a loss
    # given the unannealed clip, passed it
    from rppo_td.train._ppo import PPOUpdate

    used = []
    call = PPOUpdate.__call__

    def spy(self, rollout, *, clip_epsilon):
        used.append((self.optimizer.param_groups[0]["lr"], clip_epsilon))
        return call(self, rollout, clip_epsilon=clip_epsilon)

    monkeypatch.setattr(PPOUpdate, "__call__", spy)
    trainer, _ = _run(tmp_path, learning_rate=0.01)
    trainer.run()
    logged = [
        (float(r["learning_rate"]), float(r["clip_epsilon"])) for r in _rows(tmp_path / "run")
    ]
    assert len(logged) == 4 and logged == used
    assert len(set(used)) == 4  # annealed: a new pair at every update
