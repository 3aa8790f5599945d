"""Every benchmark script runs with --quick and writes the JSON fields the docs rely on."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from unittest import mock

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"


def run_script(script: str, *args: str) -> None:
    """Runs ``benchmarks/<script> args`` and checks that it succeeded."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def run_quick(script: str, output: str) -> dict:
    return run_script_json(script, output, "--quick")


def run_script_json(script: str, output: str, *args: str) -> dict:
    """Runs ``benchmarks/<script> args --output output``; returns (and removes) its JSON."""
    run_script(script, *args, "--output", output)
    path = RESULTS / f"{output}.json"
    try:
        return json.loads(path.read_text())
    finally:
        path.unlink(missing_ok=True)


@pytest.mark.slow
def test_pipeline_quick() -> None:
    data = run_quick("pipeline.py", "test_pipeline_quick")
    assert data["environment"]["torch"]
    assert data["results"]
    for result in data["results"]:
        assert {"shape", "rollout_bytes", "times", "ratios", "stages"} <= result.keys()
        assert {
            "rppo_td",
            "rppo_td padded",
            "torchrl split",
            "torchrl pipeline",
            "copy",
            "copy fresh",
        } <= result["times"].keys()
        assert result["times"]["rppo_td"]["median"] > 0
        assert "rppo_td / copy" in result["ratios"]
        assert result["epoch_steps_check"]
    measured = [r["memory"] for r in data["results"] if "memory" in r]
    assert measured
    assert {"rppo_td", "rppo_td padded"} <= measured[0].keys()
    assert "ratio" in measured[0]["rppo_td"]


@pytest.mark.slow
def test_native_kernels_quick() -> None:
    data = run_quick("native_kernels.py", "test_native_kernels_quick")
    assert {(r["shape"], r["path"]) for r in data["results"]} >= {("4x32 vec LSTM8", "padded")}
    for result in data["results"]:
        assert result["kernels on s"] > 0 and result["kernels off s"] > 0
        assert result["off / on"] == result["kernels off s"] / result["kernels on s"]


@pytest.mark.slow
def test_learn_phase_quick() -> None:
    data = run_quick("learn_phase.py", "test_learn_phase_quick")
    (result,) = data["results"]
    assert result["shared_critic"]
    assert {"before", "shared trunk only", "after", "after + fused Adam"} <= result["learn"].keys()
    assert all(times["median"] > 0 for times in result["learn"].values())
    assert result["collect_ratio"] > 0
    # one pass of the shared trunk computes what two did
    before, after = result["first_minibatch_loss_before"], result["first_minibatch_loss_after"]
    assert after == pytest.approx(before, abs=1e-6)


@pytest.mark.slow
def test_gae_quick() -> None:
    data = run_quick("gae.py", "test_gae_quick")
    for result in data["results"]:
        assert {"rppo_td", "torchrl loop", "torchrl vec"} <= result["times"].keys()
        assert result["exact"], result["max_abs_error"]
        assert result["fastest torchrl / rppo_td"] > 0


@pytest.mark.slow
def test_update_quick() -> None:
    data = run_quick("update.py", "test_update_quick")
    for result in data["results"]:
        assert {"padded", "packed"} <= result["times"].keys()
        assert result["faster"] in ("padded", "packed")
        assert result["max_abs_grad_difference"] < 1e-4


@pytest.mark.slow
def test_memory_suite_quick() -> None:
    data = run_quick("memory_suite.py", "test_memory_suite_quick")
    (run,) = data["runs"].values()
    assert run["returncode"] == 0, run.get("error")
    assert run["overrides"]["start-state"] == "refreshed"
    assert run["env_steps"] == 1024 and run["curve"]
    assert {"eval_return", "steps_to_target", "train_s", "load_before"} <= run.keys()


@pytest.mark.slow
def test_start_states_quick() -> None:
    data = run_quick("start_states.py", "test_start_states_quick")
    assert {"stored", "refreshed", "zero", "refreshed + burn-in 4"} <= data["update"].keys()
    assert data["update_ratios"]["stored"] == 1.0
    assert data["refresh_speedup"] > 0


def test_memory_readout_quick() -> None:
    data = run_quick("memory_readout.py", "test_memory_readout_quick")
    cells = [(r["head_layers"], r["forget_bias"]) for r in data["results"]]
    assert cells == [(0, 0.0), (0, 5.0), (1, 0.0), (1, 5.0)]
    for result in data["results"]:
        assert result["solved_at"] is None or 0 <= result["solved_at"] < 20


def test_learning_floor_quick() -> None:
    data = run_quick("learning_floor.py", "test_learning_floor_quick")
    batch, length = data["minibatch"]
    # the episode ends are cleared: each worker's 8 steps make one sequence (L = 16)
    assert (batch, length) == (128, 8)
    assert data["gradient_steps"] == 97 * 4
    step, lstm = data["times"]["step"], data["times"]["lstm"]
    assert lstm["ms_per_step"] > 0 and step["ms_per_step"] > 0
    assert data["lstm_share"] == pytest.approx(lstm["ms_per_step"] / step["ms_per_step"])


def test_robustness_quick() -> None:
    data = run_quick("robustness.py", "test_robustness_quick")
    assert data["seeds"] == [0, 1] and data["target"] == 475.0
    (result,) = data["results"]
    assert result["setting"] == "defaults" and result["crashed"] == 0
    assert result["runs"] == 2 and 0 <= result["solved"] <= 2
    low, high = result["wilson_95"]
    assert 0.0 <= low <= result["solved"] / 2 <= high <= 1.0
    for row in result["rows"]:
        assert row["env_steps"] == 2048 and row["wall_time_s"] > 0


def test_memory_suite_records_an_imported_runs_settings_that_differ_from_the_preset(
    tmp_path: Path,
) -> None:
    """``--import-run`` of a run made with other settings than the preset's labels it with
    them, so the report never counts it as the preset's run, and keys it by them and by the
    CPU model: it never replaces the preset's run of the same seed, nor a run of the same seed
    and settings recorded on another machine, and importing it again replaces itself."""
    from rppo_td.train import TrainConfig
    from rppo_td.train._cli import load_yaml

    preset = load_yaml("poc_memory", preset=True)
    base = {**vars(TrainConfig()), **preset, "seed": 3, "threads": 2, "output": "elsewhere"}
    output = "test_memory_suite_import"
    path = RESULTS / f"{output}.json"
    cases = (
        ("same", base, {}),
        (
            "other",
            {**base, "epochs": 7, "encoder_skip": True},
            {"encoder-skip": "True", "epochs": "7"},
        ),
    )
    # keys end with this machine's CPU model, which the suite's JSON records
    keys = {
        "same": "poc-memory seed=3 imported on ",
        "other": "poc-memory seed=3 --encoder-skip True --epochs 7 imported on ",
    }
    # a record of the same seed and settings from another machine, in the key format of
    # before CPU models were recorded: it must survive the imports
    elsewhere = "poc-memory seed=3 --encoder-skip True --epochs 7 imported"
    path.write_text(json.dumps({"runs": {elsewhere: {"task": "poc-memory", "seed": 3}}}))
    seen: set[str] = {elsewhere}
    try:
        for name, config, expected in cases * 2:
            run = tmp_path / name
            run.mkdir(exist_ok=True)
            summary = {"config": config, "eval_return_mean": 1.0, "eval_return_std": 0.0}
            (run / "summary.json").write_text(
                json.dumps({**summary, "env_steps": 2048, "wall_time_s": 2.0})
            )
            (run / "metrics.csv").write_text(
                "env_steps,wall_time_s,episode_return_mean\n1024,1.0,0.5\n2048,2.0,1.2\n"
            )
            run_script(
                "memory_suite.py", "--output", output, "--import-run", "poc-memory", "3", str(run)
            )
            data = json.loads(path.read_text())
            runs, key = data["runs"], keys[name] + data["environment"]["cpu"]
            # one key per seed and settings: the second pass replaces the first pass's runs
            seen.add(key)
            assert set(runs) == seen
            assert runs[key]["overrides"] == expected
            assert runs[key]["cpu"] == data["environment"]["cpu"]
            assert runs[key]["steps_to_target"] == 2048
            # dated by when it was trained: summary.json's time less the run's 2 s
            written = (run / "summary.json").stat().st_mtime
            trained = datetime.fromisoformat(runs[key]["trained"]).timestamp()
            assert written - 3.5 < trained < written - 0.5
    finally:
        path.unlink(missing_ok=True)


def _loaded_suite(memory_suite, tmp_path: Path, runs: dict):  # type: ignore[no-untyped-def]
    """``runs`` written as a suite's JSON, and the suite loaded from it: ``(path, suite)``."""
    path = tmp_path / "suite.json"
    path.write_text(json.dumps({"runs": runs}))
    return path, memory_suite.Suite.load(path)


def _memory_suite():  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import memory_suite
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return memory_suite


def test_memory_suite_ablation_commands_parse_as_rppo_train_takes_them() -> None:
    """Every ablation cell's flags reach ``rppo-train`` as flags it accepts: on-off settings
    (``center-observations True``, the cells' key format) as ``--name`` / ``--no-name``."""
    memory_suite = _memory_suite()
    from rppo_td.train._cli import config_from_args

    for task in ("poc-memory", "cartpole-novel"):
        for run in memory_suite.ablation_runs(task, [0], 2048, True):
            argv = ["--preset", memory_suite.TASKS[task].preset]
            for name, value in run.overrides:
                argv += memory_suite.cli_args(name, value)
            config, _ = config_from_args(argv)  # exits on an argument it refuses
            assert config.center_observations  # the ablations keep centred observations
    assert memory_suite.cli_args("encoder-skip", "False") == ["--no-encoder-skip"]


def test_memory_suite_runs_a_failed_run_again(tmp_path: Path) -> None:
    """A run that failed is not done: the next invocation runs it again (and fails again)."""
    output = str(tmp_path / "failing")
    # settings rppo-train accepts, and a device the run then refuses
    args = ("--tasks", "poc-memory", "--seeds", "0", "--flags", "--device meta")
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "memory_suite.py"), *args,
             "--output", output],
            cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 1, done.stdout + done.stderr
        assert "0 already in" in done.stdout
        assert "FAILED" in done.stdout


def test_memory_suite_report_spells_flags_as_rppo_train_takes_them(tmp_path: Path) -> None:
    """The report's "flags over the preset" column is what a reader can paste after
    ``rppo-train --preset ...``: on-off settings as ``--no-name``, not ``--name False``."""
    memory_suite = _memory_suite()
    run = {"task": "poc-memory", "seed": 0, "returncode": 0, "finished": "2026-12-05"}
    suite = memory_suite.Suite(tmp_path / "suite.json")
    suite.runs["a"] = {**run, "overrides": {"anneal-lr": "False", "epochs": "7"}}
    suite.runs["b"] = {**run, "overrides": {}}
    flags = [text for _, text, _ in memory_suite.task_groups(suite)]
    assert flags == ["", "--no-anneal-lr --epochs 7"]


def test_memory_suite_quick_runs_alone() -> None:
    for other in (["--report"], ["--tasks", "poc-memory"]):
        done = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "memory_suite.py"), "--quick", *other],
            cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert done.returncode == 2 and "--quick is one short run on its own" in done.stderr


def test_memory_suite_keeps_the_runs_of_an_earlier_preset_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run recorded before its task's preset changed a setting was made with the earlier
    value: loading the suite labels and keys it with that value as a flag, so the report
    never counts it as the new preset's run and a run of the new preset never replaces it.
    Runs that set the setting by a flag, or finished after the change, stay as they were
    (and keep their keys); a run with a flag equal to the new preset's value is the preset's,
    and done; loading again changes nothing, and no record is dropped."""
    memory_suite = _memory_suite()
    epochs = int(memory_suite.preset_setting("poc-memory", "epochs"))
    old = str(epochs + 1)
    when = "2026-12-05T12:00:00+00:00"
    # two settings changed at once, one line each
    changes = ((when, "poc-memory", {"epochs": old}), (when, "poc-memory", {"gamma": "0.5"}))
    monkeypatch.setattr(memory_suite, "PRESET_CHANGES", changes)
    run = {"task": "poc-memory", "returncode": 0, "eval_return": 1.0}
    before, after = "2026-12-05T11:00:00+00:00", "2026-12-05T13:00:00+00:00"
    gamma = str(memory_suite.preset_setting("poc-memory", "gamma"))
    runs = {
        "poc-memory seed=0 imported on CPU": {
            **run, "seed": 0, "overrides": {}, "finished": before
        },
        f"poc-memory seed=1 --epochs {epochs} --gamma {gamma}": {
            **run, "seed": 1, "overrides": {"epochs": str(epochs), "gamma": gamma},
            "finished": before,
        },
        "poc-memory seed=2": {**run, "seed": 2, "overrides": {}, "finished": after},
        # a failed run of the earlier preset does not take the key of a run that finished
        "poc-memory seed=3": {
            **run, "seed": 3, "overrides": {}, "finished": before, "returncode": 1
        },
        f"poc-memory seed=3 --epochs {old} --gamma 0.5": {
            **run, "seed": 3, "overrides": {"epochs": old, "gamma": "0.5"}, "finished": after
        },
        # started before the change, finished after: the earlier preset's
        "poc-memory seed=5": {
            **run, "seed": 5, "overrides": {}, "started": before, "finished": after
        },
    }  # fmt: skip
    path, suite = _loaded_suite(memory_suite, tmp_path, runs)
    assert sorted(suite.runs) == sorted(
        [
            f"poc-memory seed=0 --epochs {old} --gamma 0.5 imported on CPU",
            f"poc-memory seed=1 --epochs {epochs} --gamma {gamma}",
            "poc-memory seed=2",
            f"poc-memory seed=3 --epochs {old} --gamma 0.5 (another)",
            f"poc-memory seed=3 --epochs {old} --gamma 0.5",
            f"poc-memory seed=5 --epochs {old} --gamma 0.5",
        ]
    )
    assert suite.runs[f"poc-memory seed=3 --epochs {old} --gamma 0.5"]["returncode"] == 0
    moved = suite.runs[f"poc-memory seed=0 --epochs {old} --gamma 0.5 imported on CPU"]
    assert moved["overrides"] == moved["from_preset"] == {"epochs": old, "gamma": "0.5"}
    groups = {
        text: sorted(r["seed"] for r in rs) for _, text, rs in memory_suite.task_groups(suite)
    }
    assert groups == {"": [1, 2], f"--epochs {old} --gamma 0.5": [0, 3, 5]}
    # the new preset's runs of seeds 1 and 2 are done (seed 1 under its flags' key), of seed
    # 3 not (its key holds a run of the earlier preset)
    ran: list[str] = []
    with monkeypatch.context() as patch:
        patch.setattr(memory_suite, "run_one", lambda run, _: ran.append(run.key) or {})
        patch.setattr(memory_suite.Suite, "save", lambda self: None)
        memory_suite.run_all(
            [memory_suite.Run("poc-memory", seed) for seed in (1, 2)], suite, 1, rerun=False
        )
    assert ran == []
    assert memory_suite.Run("poc-memory", 3).key not in suite.runs
    suite.save()
    assert memory_suite.Suite.load(path).runs.keys() == suite.runs.keys()


def test_memory_suite_keeps_the_runs_of_earlier_arithmetic_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run trained before a change of the trainer's arithmetic that applies to its settings
    (``CODE_CHANGES``: a setting's value, by the preset or a flag) is labelled with it: keyed
    and grouped apart from the runs of the code as it is, never counted as the preset's, and
    not replaced by them (its identity differs). Runs without that setting's value, runs
    trained after the change (an import dated by ``trained``, not by when it was imported),
    and runs labelled already are left as they are; loading again changes nothing."""
    memory_suite = _memory_suite()
    epochs = int(memory_suite.preset_setting("poc-memory", "epochs"))
    when = "2026-12-05T12:00:00+00:00"
    label = "earlier code: a test"
    monkeypatch.setattr(memory_suite, "CODE_CHANGES", ((when, "epochs", epochs, label),))
    before, after = "2026-12-05T11:00:00+00:00", "2026-12-05T13:00:00+00:00"
    run = {
        "task": "poc-memory", "returncode": 0, "eval_return": 1.0, "overrides": {},
        "steps_to_target": None, "seconds_to_target": None, "train_s": 1.0,
    }  # fmt: skip
    runs = {
        "poc-memory seed=0": {**run, "seed": 0, "finished": before},
        # another value of the setting: the change does not apply
        f"poc-memory seed=1 --epochs {epochs + 1}": {
            **run, "seed": 1, "overrides": {"epochs": str(epochs + 1)}, "finished": before
        },
        # trained before the change, imported after it
        "poc-memory seed=2 imported on CPU": {
            **run, "seed": 2, "finished": after, "trained": before, "command": "imported from x"
        },
        # trained after it
        "poc-memory seed=3 imported on CPU": {
            **run, "seed": 3, "finished": after, "trained": after, "command": "imported from x"
        },
        "poc-memory seed=4": {**run, "seed": 4, "finished": after},
        # the flag equal to the preset's value: the change applies
        f"poc-memory seed=5 --epochs {epochs}": {
            **run, "seed": 5, "overrides": {"epochs": str(epochs)}, "started": before,
            "finished": after,
        },
    }  # fmt: skip
    path, suite = _loaded_suite(memory_suite, tmp_path, runs)
    assert sorted(suite.runs) == sorted(
        [
            f"poc-memory seed=0 [{label}]",
            f"poc-memory seed=1 --epochs {epochs + 1}",
            f"poc-memory seed=2 imported on CPU [{label}]",
            "poc-memory seed=3 imported on CPU",
            "poc-memory seed=4",
            f"poc-memory seed=5 --epochs {epochs} [{label}]",
        ]
    )
    assert suite.runs[f"poc-memory seed=0 [{label}]"]["code"] == label
    groups = {
        text: sorted(r["seed"] for r in rs) for _, text, rs in memory_suite.task_groups(suite)
    }
    assert groups == {"": [3, 4], f"[{label}]": [0, 2, 5], f"--epochs {epochs + 1}": [1]}
    table = "\n".join(memory_suite.task_table(suite))
    assert f"| poc-memory | - ({label}) |" in table
    # a run of the code as it is is not done by the earlier code's run of its seed
    assert memory_suite.identity(memory_suite.Run("poc-memory", 0).as_result()) != (
        memory_suite.identity(suite.runs[f"poc-memory seed=0 [{label}]"])
    )
    suite.save()
    assert memory_suite.Suite.load(path).runs == suite.runs


def test_memory_suite_import_replaces_the_same_run_recorded_under_another_key(
    tmp_path: Path,
) -> None:
    """An import of the preset's settings on this CPU model replaces a record of the same
    seed and settings from this CPU model that was keyed by a flag equal to the preset's
    value (the same run), and keeps the one from another CPU model."""
    memory_suite = _memory_suite()
    from _common import cpu_model  # type: ignore[import-not-found]

    from rppo_td.train import TrainConfig
    from rppo_td.train._cli import load_yaml

    epochs = str(memory_suite.preset_setting("poc-memory", "epochs"))
    output = "test_memory_suite_import_same"
    path = RESULTS / f"{output}.json"
    record = {"task": "poc-memory", "seed": 3, "returncode": 0, "overrides": {"epochs": epochs}}
    record["command"] = "imported from elsewhere"
    here, there = cpu_model(), "Another CPU"
    runs = {
        f"poc-memory seed=3 --epochs {epochs} imported on {cpu}": {**record, "cpu": cpu}
        for cpu in (here, there)
    }
    path.write_text(json.dumps({"runs": runs}))
    config = {**vars(TrainConfig()), **load_yaml("poc_memory", preset=True), "seed": 3}
    run = tmp_path / "run"
    run.mkdir()
    summary = {"config": config, "eval_return_mean": 1.0, "eval_return_std": 0.0}
    (run / "summary.json").write_text(json.dumps({**summary, "env_steps": 8, "wall_time_s": 1}))
    (run / "metrics.csv").write_text("env_steps,wall_time_s,episode_return_mean\n8,1.0,1.1\n")
    try:
        memory_suite.main(["--output", output, "--import-run", "poc-memory", "3", str(run)])
        assert sorted(json.loads(path.read_text())["runs"]) == sorted(
            [
                f"poc-memory seed=3 imported on {here}",
                f"poc-memory seed=3 --epochs {epochs} imported on {there}",
            ]
        )
    finally:
        path.unlink(missing_ok=True)


def test_memory_suite_refuses_a_flag_that_is_no_setting(capsys: pytest.CaptureFixture[str]) -> None:
    """A misspelt ``--flags`` name is a one-line usage error naming it, before any run."""
    memory_suite = _memory_suite()
    with pytest.raises(SystemExit) as stop:
        memory_suite.main(["--tasks", "poc-memory", "--flags", "--hiden-size 4"])
    assert stop.value.code == 2
    assert "--hiden-size is no rppo-train setting" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "nothing to do"),
        (
            ["--tasks", "poc-memory", "--seeds", "0", "0"],
            "--seeds must be distinct integers in [0, 4294967295]",
        ),
        (
            ["--tasks", "poc-memory", "--seeds", "-1"],
            "--seeds must be distinct integers in [0, 4294967295]",
        ),
        (["--flags", "--epochs 2"], "--flags applies to the --tasks runs, and none were asked"),
        (["--ablation-steps", "9"], "--ablation-steps applies to the --ablation runs"),
        (["--report", "--output", "mine"], "--report writes docs/results.md"),
        (["--import-run", "poc-memory", "x", "."], "SEED must be an integer >= 0, got 'x'"),
        # rppo-train's own checks of each run's settings, before any run
        (["--tasks", "poc-memory", "--flags", "--hidden-size 0"], "--hidden-size must be"),
        (["--tasks", "poc-memory", "--flags", "--epochs two"], "'two' is not a whole number"),
    ],
)
def test_memory_suite_refuses_what_would_do_nothing_or_fail(
    args: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    memory_suite = _memory_suite()
    # where a refusal fails, the runs and the report go here, not to the published files
    monkeypatch.setattr(memory_suite, "RESULTS", tmp_path)
    monkeypatch.setattr(memory_suite, "DOCS", tmp_path)
    monkeypatch.setattr(memory_suite, "run_all", lambda *args: 0)
    with pytest.raises(SystemExit) as stop:
        memory_suite.main(args)
    assert stop.value.code == 2
    assert message in capsys.readouterr().err


def _finished_run(directory: Path, config: dict) -> Path:
    """A finished run's files, as rppo-train writes them, with ``config``."""
    directory.mkdir()
    summary = {"config": config, "eval_return_mean": 1.0, "eval_return_std": 0.0}
    (directory / "summary.json").write_text(
        json.dumps({**summary, "env_steps": 8, "wall_time_s": 1})
    )
    (directory / "metrics.csv").write_text("env_steps,wall_time_s,episode_return_mean\n8,1.0,1.1\n")
    return directory


def test_memory_suite_imports_only_runs_of_the_tasks_env_and_budget(tmp_path: Path) -> None:
    """A run of another env or budget is refused by name: the task's row is scored against
    its target and shows its budget (a CartPole run scored 16.8 against PocMemory's 1)."""
    memory_suite = _memory_suite()
    from rppo_td.train import TrainConfig
    from rppo_td.train._cli import load_yaml

    config = {**vars(TrainConfig()), **load_yaml("poc_memory", preset=True), "seed": 0}
    for name, value in (("env", "rppo_td/CartPoleNoVel-v1"), ("total_steps", 4096)):
        run = _finished_run(tmp_path / name, {**config, name: value})
        with pytest.raises(SystemExit, match=rf"trained {name}={value!r}, and poc-memory's"):
            memory_suite.import_run("poc-memory", 0, run)
    broken = _finished_run(tmp_path / "broken", config)
    (broken / "metrics.csv").write_text("garbage\n")
    with pytest.raises(SystemExit, match=r"is not rppo-train's metrics\.csv"):
        memory_suite.import_run("poc-memory", 0, broken)
    (broken / "metrics.csv").unlink()
    with pytest.raises(SystemExit, match=r"metrics\.csv is not there"):
        memory_suite.import_run("poc-memory", 0, broken)
    (broken / "summary.json").write_text("{")
    with pytest.raises(SystemExit, match="is not rppo-train's JSON"):
        memory_suite.import_run("poc-memory", 0, broken)


def test_memory_suite_never_imports_a_run_it_made_itself(tmp_path: Path) -> None:
    """The suite's own run of a seed and settings on this CPU model is the same measurement
    as an import of them (the same path): it is not recorded, nor counted, twice."""
    memory_suite = _memory_suite()
    from _common import cpu_model  # type: ignore[import-not-found]

    from rppo_td.train import TrainConfig
    from rppo_td.train._cli import load_yaml

    output = "test_memory_suite_import_own"
    path = RESULTS / f"{output}.json"
    own = {"task": "poc-memory", "seed": 0, "returncode": 0, "overrides": {}}
    own |= {"total_steps_override": None, "cpu": cpu_model(), "command": "-m rppo_td.train"}
    path.write_text(json.dumps({"runs": {"poc-memory seed=0": own}}))
    config = {**vars(TrainConfig()), **load_yaml("poc_memory", preset=True), "seed": 0}
    run = _finished_run(tmp_path / "run", config)
    try:
        memory_suite.main(["--output", output, "--import-run", "poc-memory", "0", str(run)])
        assert list(json.loads(path.read_text())["runs"]) == ["poc-memory seed=0"]
    finally:
        path.unlink(missing_ok=True)


def test_memory_suite_ablation_cells_hold_one_budget_and_the_ablations_flags(
    tmp_path: Path,
) -> None:
    """Runs of a shorter budget, or with flags besides the cell's and the ablation's base, are
    not averaged into the published cells (1,024-step runs were, beside 30,000-step ones)."""
    memory_suite = _memory_suite()
    base = dict(memory_suite.TASKS["poc-memory"].ablation_base)
    cell = {**base, "start-state": "stored", "sequence-length": "8", "burn-in": "0"}
    run = {"task": "poc-memory", "returncode": 0, "finished": "2026-12-05", "curve": []}
    run |= {"steps_to_target": 5000}
    suite = memory_suite.Suite(tmp_path / "suite.json")
    suite.runs["full"] = {**run, "seed": 0, "overrides": cell, "eval_return": 1.0}
    suite.runs["short"] = {
        **run, "seed": 0, "overrides": cell, "eval_return": -0.6, "total_steps_override": 1024
    }  # fmt: skip
    suite.runs["other flags"] = {
        **run, "seed": 1, "overrides": {**cell, "epochs": "1"}, "eval_return": -0.6
    }  # fmt: skip
    suite.runs["no base"] = {
        **run, "seed": 2, "overrides": {k: cell[k] for k in memory_suite.CELL_FLAGS},
        "eval_return": -0.6,
    }  # fmt: skip
    published = "\n".join(memory_suite.ablation_table(suite, "poc-memory"))
    assert "| stored | 0 | " in published and "1 · 1/1 · 5k" in published
    short = "\n".join(memory_suite.ablation_table(suite, "poc-memory", total_steps=1024))
    assert "-0.6 · 0/1 · 5k" in short and "1 · 1/1" not in short


def test_a_published_result_is_never_overwritten(tmp_path: Path, monkeypatch) -> None:
    # before: a partial pipeline.py run (--shape 256x128) replaced pipeline_cpu.json, whose
    # figures the README cites
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        import _common
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    monkeypatch.setattr(_common, "RESULTS", tmp_path)
    first = _common.write_json("pipeline_cpu", {"run": 1})
    second = _common.write_json("pipeline_cpu", {"run": 2})
    assert first == tmp_path / "pipeline_cpu.json"
    assert json.loads(first.read_text())["run"] == 1
    assert second.name.startswith("pipeline_cpu-") and json.loads(second.read_text())["run"] == 2
    _common.write_json("pipeline_quick", {"run": 1})
    assert _common.write_json("pipeline_quick", {"run": 2}) == tmp_path / "pipeline_quick.json"
    # --output may name folders (it was a FileNotFoundError after the whole run)
    assert _common.write_json("sub/dir/x", {"run": 1}) == tmp_path / "sub" / "dir" / "x.json"
    # bad settings are refused by their flag's name before any work
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "pipeline.py"), "--repeats", "0"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert "argument --repeats: expected an int >= 1, got 0" in done.stderr


@pytest.mark.parametrize("seeds", [["-1"], ["0", "0"]])
def test_learning_refuses_seeds_before_any_run(seeds: list[str]) -> None:
    # a seed of -1 failed its run, and the script still wrote a dated JSON of "0/0 seeds"
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "learning.py"), "--seeds", *seeds],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert (
        f"--seeds must be distinct integers in [0, 4294967295], got [{', '.join(seeds)}]"
        in done.stderr
    )


def test_quick_keeps_the_flags_given() -> None:
    """``--quick`` fills in only what the command line left out."""
    data = run_script_json(
        "memory_readout.py",
        "test_memory_readout_given",
        "--quick",
        "--seeds",
        "1",
        "--head-layers",
        "0",
        "--forget-bias",
        "5",
    )
    assert data["settings"]["seeds"] == [1] and data["settings"]["iterations"] == 20
    assert [(r["head_layers"], r["forget_bias"], r["seed"]) for r in data["results"]] == [
        (0, 5.0, 1)
    ]


def test_learning_quick() -> None:
    data = run_quick("learning.py", "test_learning_quick")
    assert [(r["recurrence"], r["seed"]) for r in data["rows"]] == [
        ("lstm (default)", 0),
        ("none", 0),
    ]
    assert all(r["env_steps"] == 2048 and r["wall_time_s"] > 0 for r in data["rows"])
    assert data["verdict"]["seeds_run"] == 1


def test_peer_sb3_quick() -> None:
    pytest.importorskip("sb3_contrib")
    data = run_quick("peer_sb3.py", "test_peer_sb3_quick")
    assert {"sb3-contrib RecurrentPPO", "rppo-train"} == data["rows"].keys()
    assert data["rows"]["rppo-train"]["env_steps"] == 2048
    assert data["ratio"]["train_wall"] > 0


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("bad=--epochs zero", "--setting 'bad': rppo-train refuses its flags"),
        ("bad=--seed 3", "--setting 'bad': --seed is set by this script"),
        ("bad=--threads=2", "--setting 'bad': --threads is set by this script"),
    ],
)
def test_robustness_refuses_a_setting_before_any_run(setting: str, message: str) -> None:
    before = set(RESULTS.glob("robustness*"))
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "robustness.py"), "--setting", setting],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert message in done.stderr, done.stderr
    assert "seeds" not in done.stdout  # no run started
    assert set(RESULTS.glob("robustness*")) == before


def test_memory_suite_rerun_never_replaces_a_successful_record_with_a_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory_suite = _memory_suite()
    key = memory_suite.Run("poc-memory", 0).key
    good = {**memory_suite.Run("poc-memory", 0).as_result(), "returncode": 0, "eval_return": 1.0}
    path, suite = _loaded_suite(memory_suite, tmp_path, {key: good})
    success = {"returncode": 0, "eval_return": 0.5, "eval_std": 0.0, "steps_to_target": None}
    success.update(train_s=1.0, load_before=0.0)
    outcomes = iter([{"returncode": 1, "error": "killed"}, success])
    monkeypatch.setattr(
        memory_suite, "run_one", lambda run, _: {**run.as_result(), **next(outcomes)}
    )
    runs = [memory_suite.Run("poc-memory", 0)]
    assert memory_suite.run_all(runs, suite, 1, rerun=True) == 1
    assert memory_suite.Suite.load(path).runs[key]["eval_return"] == 1.0  # the good one kept
    assert memory_suite.run_all(runs, suite, 1, rerun=True) == 0
    assert memory_suite.Suite.load(path).runs[key]["eval_return"] == 0.5  # a success replaces it


def test_memory_suite_refuses_repeated_tasks_and_an_ablation_budget_rppo_train_refuses() -> None:
    memory_suite = _memory_suite()
    for argv, message in (
        (["--tasks", "poc-memory", "poc-memory"], "--tasks must name each task once"),
        (["--ablation", "poc-memory", "--ablation-steps", "512"], "less than one rollout"),
    ):
        with pytest.raises(SystemExit) as info, mock.patch("sys.stderr", new=io.StringIO()) as err:
            memory_suite.main([*argv, "--output", "never_written"])
        assert info.value.code == 2
        assert message in err.getvalue()


def _refusal(script: str, *args: str, env: dict[str, str] | None = None) -> str:
    """``benchmarks/<script> args``'s stderr; the script must refuse (status 2) in seconds."""
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / script), *args],
        cwd="/", capture_output=True, text=True, timeout=120, check=False,
        env=None if env is None else {**os.environ, **env},
    )  # fmt: skip
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    return done.stderr


def test_a_bad_output_is_refused_before_any_work(tmp_path: Path) -> None:
    # it was only found when the JSON was written, after the whole run: the figures were lost
    said = _refusal("robustness.py", "--quick", "--output", "/proc/nope/x")
    assert "argument --output: '/proc/nope/x': cannot write in /proc/nope" in said
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from _common import results_name
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    (tmp_path / "taken.json").mkdir()
    for output, message in [
        ("/etc/hostname/x", "/etc/hostname is not a folder"),
        ("sub/", "must name a file"),
        ("", "must name a file"),
        (str(tmp_path / "taken"), "is a folder"),
        ("/proc/x", "cannot write in /proc"),  # a folder that is there, but not writable
    ]:
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
            results_name(output)
    assert results_name("/tmp/x.json") == "/tmp/x"


def test_argument_types_take_their_bounds_and_refuse_past_them() -> None:
    # rppo-train's seeds end at 2**32 - 1, which must pass; infinities are not finite
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from _common import MAX_SEED, at_least, check_seeds, finite_float
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    parser = argparse.ArgumentParser()
    check_seeds(parser, "--seeds", [0, MAX_SEED])
    with mock.patch.object(parser, "error", side_effect=SystemExit(2)) as error:
        for bad in ([MAX_SEED + 1], [-1], [3, 3]):
            with pytest.raises(SystemExit):
                check_seeds(parser, "--seeds", bad)
        assert error.call_count == 3
    seed = at_least(0, MAX_SEED)
    assert seed("0") == 0 and seed(str(MAX_SEED)) == MAX_SEED
    for bad in (str(MAX_SEED + 1), "-1", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(f"in [0, {MAX_SEED}]")):
            seed(bad)
    assert finite_float("-1e300") == -1e300
    for bad in ("nan", "inf", "-inf", "1e999", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected a finite number"):
            finite_float(bad)


def test_scripts_refuse_bad_settings_before_any_run(tmp_path: Path) -> None:
    assert "--workers must be even" in _refusal("scaling.py", "--workers", "3")
    assert "numba's kernels cannot run here" in _refusal(
        "native_kernels.py", "--quick", env={"RPPO_TD_NATIVE": "0"}
    )
    assert "--total-steps: rppo-train refuses it" in _refusal("learning.py", "--total-steps", "1")
    said = _refusal("memory_readout.py", "--quick", "--head-layers", "0", "-1")
    assert "argument --head-layers: expected an int >= 0, got -1" in said
    said = _refusal("memory_readout.py", "--quick", "--forget-bias", "nan")
    assert "argument --forget-bias: expected a finite number, got nan" in said
    assert "--seed must be in [0, " in _refusal("minigrid_starts.py", str(tmp_path), "--seed", "-1")
    # the second run is checked before the first is evaluated
    said = _refusal("minigrid_starts.py", str(tmp_path), "--episodes", "1")
    assert f"{tmp_path}: no checkpoint at" in said
    said = _refusal("peer_sb3.py", "--seed", str(2**32))
    assert "argument --seed: expected an int in [0, 4294967295], got 4294967296" in said
    assert "--device must be cpu or cuda" in _refusal("pipeline.py", "--quick", "--device", "mps")
    assert "expected a finite number, got nan" in _refusal("robustness.py", "--target", "nan")


def test_robustness_quick_fills_in_only_the_budget_a_setting_leaves_out() -> None:
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from robustness import quick_flags  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    assert quick_flags([]) == ["--total-steps", "2048", "--eval-episodes", "2"]
    assert quick_flags(["--total-steps", "4096"]) == ["--eval-episodes", "2"]
    assert quick_flags(["--lmbda", "0.9", "--total-steps=4096", "--eval-episodes", "3"]) == []
