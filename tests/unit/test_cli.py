"""The generated command line, presets and config files."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from rppo_td.train import TrainConfig, build_parser, list_presets
from rppo_td.train._cli import config_from_args, load_yaml


def _error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exc:
        config_from_args(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_every_field_is_a_flag():
    help_text = build_parser().format_help()
    for f in dataclasses.fields(TrainConfig):
        assert "--" + f.name.replace("_", "-") in help_text
    for flag in (
        "--preset",
        "--config",
        "--env",
        "--total-steps",
        "--num-workers",
        "--rollout-steps",
        "--sequence-length",
        "--recurrence",
        "--seed",
        "--device",
        "--output",
        "--resume",
    ):
        assert flag in help_text


def test_defaults_and_flags():
    config, given = config_from_args([])
    assert config == TrainConfig()
    assert given == {}
    config, given = config_from_args(
        ["--total-steps", "2048", "--recurrence", "gru", "--no-anneal-lr", "--seed", "3"]
    )
    assert (config.total_steps, config.recurrence, config.anneal_lr, config.seed) == (
        2048,
        "gru",
        False,
        3,
    )
    assert given == {"total_steps": 2048, "recurrence": "gru", "anneal_lr": False, "seed": 3}


def test_presets_ship_and_load():
    assert {"cartpole_novel", "cartpole_novel_memoryless", "smoke"} <= set(list_presets())
    for name in list_presets():
        TrainConfig.from_dict(load_yaml(name, preset=True), where=name)
    # the default preset writes out the defaults
    config, _ = config_from_args(["--preset", "cartpole_novel"])
    assert config == TrainConfig()
    config, _ = config_from_args(["--preset", "cartpole_novel_memoryless"])
    assert config.recurrence == "none"


def test_config_file_then_flags(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("total-steps: 4096\nhidden_size: 32\n")
    config, _ = config_from_args(["--config", str(path), "--hidden-size", "16"])
    assert (config.total_steps, config.hidden_size) == (4096, 16)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--total-steps", "-5"], "total_steps must be an integer >= 1, got -5"),
        (["--sequence-length", "0"], "sequence_length must be an integer >= 1, got 0"),
        (["--env", "NoSuchEnv-v0"], "unknown env 'NoSuchEnv-v0'"),
        (["--env", "no_such_module_xyz:Foo-v0"], "cannot import module"),
        (["--gamma", "1.5"], "gamma must be a number in [0.0, 1.0]"),
        (["--recurrence", "rnn"], "invalid choice: 'rnn'"),
        (["--total-steps", "ten"], "invalid int value: 'ten'"),
        (["--total-steps", "100"], "less than one rollout"),
        (["--preset", "nope"], "unknown preset 'nope'"),
        (["--config", "/no/such/file.yaml"], "does not exist"),
    ],
)
def test_bad_values_give_clear_errors(capsys, argv, message):
    assert message in _error(capsys, argv)


def test_unknown_key_in_config_file(capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("total_stepz: 10\n")
    assert "unknown setting(s) ['total_stepz']" in _error(capsys, ["--config", str(path)])


def test_module_main_help():
    result = subprocess.run(
        [sys.executable, "-m", "rppo_td.train", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "--sequence-length" in result.stdout
