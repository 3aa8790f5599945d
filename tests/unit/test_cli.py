"""The generated command line, presets and config files."""

from __future__ import annotations

import dataclasses
import io
import math
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from hypothesis import given
from hypothesis import strategies as st

from rppo_td.train import TrainConfig, build_parser, list_presets
from rppo_td.train._cli import config_from_args, load_yaml

NOVELTY_31 = ["--novelty-steps", "31"]


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
    # any case, '-' or '_'
    assert load_yaml("POC-Memory", preset=True) == load_yaml("poc_memory", preset=True)
    with pytest.raises(ValueError, match="unknown preset 'POC-MEMRY'"):
        load_yaml("POC-MEMRY", preset=True)
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
        (["--total-steps", "-5"], f"--total-steps must be an integer in [1, {10**15}], got -5"),
        (["--sequence-length", "0"], "--sequence-length must be an integer >= 1, got 0"),
        (["--env", "NoSuchEnv-v0"], "unknown env 'NoSuchEnv-v0'"),
        (["--env", "no_such_module_xyz:Foo-v0"], "cannot import module"),
        (["--gamma", "1.5"], "--gamma must be a finite number in [0.0, 1.0]"),
        # 0 was in the help's range, then refused by the loss as normalize_advantage_eps
        (["--advantage-eps", "0"], "--advantage-eps must be a finite number in (0.0, 1000000.0]"),
        (["--recurrence", "rnn"], "invalid choice: 'rnn'"),
        (["--total-steps", "ten"], "argument --total-steps: 'ten' is not a whole number"),
        (["--total-steps", "100"], "less than one rollout"),
        (["--preset", "nope"], "unknown preset 'nope'"),
        # the first preset was dropped silently
        (["--preset", "smoke", "--preset", "poc-memory"], "--preset given twice"),
        (["--config", "a.yaml", "--config", "b.yaml"], "--config given twice"),
        (["--config", "/no/such/file.yaml"], "does not exist"),
        (["--config", "/"], "is not a file"),
        (["--log-level", "VERBOSE"], "--log-level must be one of ['DEBUG', 'INFO', 'WARNING'"),
        (["--seed", "-1"], "--seed must be an integer in [0, 4294967295], got -1"),
        (["--gamma", "nan"], "--gamma must be a finite number in [0.0, 1.0], got nan"),
        # a clip at 0 scaled every gradient to zero: nothing learned, without a word
        (["--max-grad-norm", "0"], "--max-grad-norm must be a finite number in [1e-09,"),
        (["--learning-rate", "inf"], "--learning-rate must be a finite number"),
        (
            [
                "--num-workers",
                "2",
                "--rollout-steps",
                "8",
                "--sequence-length",
                "4",
                "--num-minibatches",
                "5",
            ],
            "--num-minibatches=5 can exceed the sequences of a rollout",
        ),
        (["--start-state", "fresh"], "invalid choice: 'fresh'"),
        (["--burn-in", "-1"], "--burn-in must be"),
        (["--recurrence", "none", "--burn-in", "4"], "--burn-in=4 needs a recurrent core"),
        (["--recurrence", "none", "--start-state", "zero"], "'zero' needs a recurrent core"),
        (
            ["--rollout-steps", "32", "--burn-in", "32"],
            "--burn-in=32 asks for more steps than a rollout holds",
        ),
        (["--recurrence", "gru", "--forget-bias", "3"], "recurrence='gru' has none"),
        (["--forget-bias", "nan"], "--forget-bias must be"),
        (["--forget-bias", "1000"], "--forget-bias must be"),
        (["--novelty-bonus", "-0.1"], "--novelty-bonus must be"),
        (["--novelty-bonus", "nan"], "--novelty-bonus must be"),
        (["--novelty-steps", "-5"], "--novelty-steps must be"),
        (
            ["--num-workers", "4", "--rollout-steps", "8", "--novelty-bonus", "0.1", *NOVELTY_31],
            "--novelty-steps=31 is shorter than one update",
        ),
        (["--total-steps", str(10**15 + 1)], "--total-steps must be an integer in [1, "),
        (["--gam", "0.5"], "unrecognized arguments: --gam 0.5; did you mean --gamma?"),
        (["--learning-rte", "1e-3"], "did you mean --learning-rate?"),
    ],
)
def test_bad_values_give_clear_errors(capsys, argv, message):
    err = _error(capsys, argv)
    assert message in err
    # one line, pointing at --help rather than printing the whole usage block
    assert len(err.strip().splitlines()) == 1 and "--help" in err


def test_log_level_is_case_insensitive():
    config, _ = config_from_args(["--log-level", "debug"])
    assert config.log_level == "DEBUG"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("total_steps: [1, 2\n", "is not valid YAML at line 2"),
        ("output: 7\n", "output must be a string, got 7 (int)"),
        ("num_workers: four\n", "num_workers must be an integer in [1, 100000], got 'four'"),
        ("gamma: [1]\n", "gamma must be a finite number in [0.0, 1.0], got [1]"),
        ("anneal_lr: 'yes'\n", "anneal_lr must be true or false, got 'yes'"),
        ("recurrence: 3\n", "recurrence must be one of ['lstm', 'gru', 'none'], got 3"),
        ("- 1\n- 2\n", "must hold a mapping of settings, got list"),
        ("seed: -3\n", "seed must be an integer in [0, 4294967295], got -3"),
        ("total_steps: 2048\ntotal-steps: 4096\n", "sets 'total_steps' twice"),
        # PyYAML kept the last value silently
        ("total_steps: 512\ntotal_steps: 1024\n", "the key 'total_steps' is set twice"),
        ("gamma: 1e-x\n", "gamma must be a finite number in [0.0, 1.0], got '1e-x'"),
    ],
)
def test_bad_config_files_give_clear_errors(capsys, tmp_path, text, message):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    err = _error(capsys, ["--config", str(path)])
    assert message in err
    assert len(err.strip().splitlines()) == 1
    if message.startswith(text.split(":")[0]):  # a setting's value: the file is named
        assert f"(set by config file {str(path)!r})" in err


def test_a_float_written_without_a_dot_is_a_number(tmp_path):
    # YAML 1.1 reads 1e-3 as text; the command line reads it as a number
    path = tmp_path / "run.yaml"
    path.write_text("learning_rate: 1e-3\nentropy_coef: 5E-2\n")
    config, _ = config_from_args(["--config", str(path)])
    assert (config.learning_rate, config.entropy_coef) == (1e-3, 5e-2)


def test_empty_config_file_is_the_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert config_from_args(["--config", str(path)])[0] == TrainConfig()


def test_every_field_is_type_checked():
    """A value of the wrong type is refused for every field, naming it."""
    for f in dataclasses.fields(TrainConfig):
        wrong = 1.5 if isinstance(f.default, str | bool) else "x"
        with pytest.raises(ValueError, match=f"^{f.name} must be"):
            TrainConfig(**{f.name: wrong})


def test_numpy_scalars_are_taken_as_python_numbers():
    # a sweep over np.arange: np.int64 is an integer, refused before as "must be an integer"
    import numpy as np

    config = TrainConfig(
        burn_in=np.int64(2), learning_rate=np.float64(1e-3), progress=np.bool_(False)
    )
    assert (type(config.burn_in), type(config.learning_rate), type(config.progress)) == (
        int,
        float,
        bool,
    )
    assert config.burn_in == 2
    with pytest.raises(ValueError, match=r"burn_in must be an integer in \[0, 100000\], got -1$"):
        TrainConfig(burn_in=np.int64(-1))


def test_unknown_key_in_config_file(capsys, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("total_stepz: 10\n")
    message = _error(capsys, ["--config", str(path)])
    assert f"config file {str(path)!r}: unknown setting(s) ['total_stepz']" in message
    assert message.count("(see rppo-train --help)") == 1  # it was said twice
    path.write_text("gae_lambda: 0.9\n")  # an old name is still read
    config, _ = config_from_args(["--config", str(path)])
    assert config.lmbda == 0.9


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


def test_renamed_settings_are_read_under_their_old_names(tmp_path, caplog):
    # gae_lambda is now lmbda (the library's and TorchRL's name): flag, file and dict
    config, given = config_from_args(["--gae-lambda", "0.7"])
    assert config.lmbda == 0.7 and given["lmbda"] == 0.7 and "gae_lambda" not in given
    assert "'gae_lambda' is now called 'lmbda'" in caplog.text
    file = tmp_path / "old.yaml"
    file.write_text("gae_lambda: 0.6\n")
    assert config_from_args(["--config", str(file)])[0].lmbda == 0.6
    assert TrainConfig.from_dict({"gae_lambda": 0.5}).lmbda == 0.5
    with pytest.raises(ValueError, match="'gae_lambda' is the old name of 'lmbda'"):
        TrainConfig.from_dict({"gae_lambda": 0.5, "lmbda": 0.5})


def test_a_collective_broken_off_by_another_rank_is_one_line(monkeypatch, capsys):
    # rank 0 of a 2-rank run whose rank 1 stopped (its env failed) printed gloo's traceback
    import types

    import rppo_td.train as train

    class Broken:
        ranks = types.SimpleNamespace(distributed=True, rank=0, main=True)
        saved_update = 3

        def __init__(self, config, given=None):
            pass

        def run(self):
            raise RuntimeError("[../gloo/transport/tcp/pair.cc:553] Connection closed by peer")

    monkeypatch.setattr(train, "Trainer", Broken)
    assert train.main(["--preset", "smoke", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("rppo-train: error: rank 0 lost the other ranks ([../gloo/"), err
    assert "its own message says why; the last checkpoint (update 3) is kept" in err
    # before the first checkpoint it said one was kept, a line after the log said none was
    Broken.saved_update = 0
    assert train.main(["--preset", "smoke", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.rstrip().endswith("its own message says why; no checkpoint was saved"), err
    Broken.ranks = types.SimpleNamespace(distributed=False, rank=0, main=True)
    with pytest.raises(RuntimeError, match="closed by peer"):  # one process: not ours to hide
        train.main(["--preset", "smoke", "--no-progress"])


def test_a_rank_that_fails_says_which_rank_and_host(monkeypatch, capsys):
    # torchrun's ranks share one stderr: an env fault on rank 1 of several nodes named no rank
    import socket

    import rppo_td.train as train
    from rppo_td.envs import EnvError
    from rppo_td.train._distributed import Ranks

    class Failing:
        ranks = Ranks(rank=1, world_size=2)
        saved_update = 0
        error: Exception = EnvError("env 'X-v0': raised RuntimeError in step(): boom")

        def __init__(self, config, given=None):
            pass

        def run(self):
            raise self.error

    monkeypatch.setattr(train, "Trainer", Failing)
    assert train.main(["--preset", "smoke", "--no-progress"]) == 1
    where = f"rank 1 on {socket.gethostname()}"
    err = capsys.readouterr().err
    assert err == f"rppo-train: error: {where}: env 'X-v0': raised RuntimeError in step(): boom\n"
    Failing.error = ValueError(f"{where}: already says where")  # not said twice
    assert train.main(["--preset", "smoke", "--no-progress"]) == 1
    assert capsys.readouterr().err == f"rppo-train: error: {where}: already says where\n"
    Failing.ranks = Ranks()
    Failing.error = ValueError("bad input")
    assert train.main(["--preset", "smoke", "--no-progress"]) == 1  # one process: no prefix
    assert capsys.readouterr().err == "rppo-train: error: bad input\n"


@pytest.mark.parametrize(("entry", "prog"), [("train", "rppo-train"), ("evaluate", "rppo-eval")])
@pytest.mark.parametrize("stop", ["raised", "sigint", "sigterm"])
def test_a_stop_while_the_trainer_loads_is_one_line(monkeypatch, capsys, entry, prog, stop):
    # the console scripts imported torch and TorchRL before any guard: a traceback on a
    # Ctrl-C, and SIGTERM's default action killed the process silently (status -15); then a
    # Ctrl-C raised inside an import could leave numpy half-imported, or abort the process
    # from a C++ extension: a signal is now held until the imports are whole
    import builtins
    import os
    import signal

    from rppo_td import _entry

    real_import = builtins.__import__
    whole = []

    def interrupted(name, *args, **kwargs):
        if name == "rppo_td.train":
            if stop == "raised":
                raise KeyboardInterrupt
            os.kill(os.getpid(), signal.SIGINT if stop == "sigint" else signal.SIGTERM)
            module = real_import(name, *args, **kwargs)  # the signal waits for this
            whole.append(name)
            return module
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupted)
    sigint = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as exit_:
            getattr(_entry, entry)()
        # a second Ctrl-C while the process exits is ignored (it ended in a traceback from
        # an exit handler)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, sigint)
    assert exit_.value.code == 130
    assert capsys.readouterr().err == f"{prog}: interrupted during start-up; nothing done\n"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the default is back
    assert whole == ([] if stop == "raised" else ["rppo_td.train"])


def test_terminate_as_interrupt_leaves_another_handler_alone():
    import signal

    from rppo_td._signals import terminate_as_interrupt

    def own(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, own)
    try:
        with terminate_as_interrupt():
            assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, previous)
    with terminate_as_interrupt():
        handler = signal.getsignal(signal.SIGTERM)
        assert callable(handler) and handler is not own
        with pytest.raises(KeyboardInterrupt):
            handler(signal.SIGTERM, None)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_an_interrupt_that_lands_in_a_weakref_callback_is_raised_again(capsys):
    # a `kill -INT` during rppo-train's final evaluation landed in a weakref callback run by
    # the garbage collector: Python printed "Exception ignored in ..." and the run exited 0
    import signal
    import sys
    import time
    import weakref

    from rppo_td._signals import terminate_as_interrupt

    class Thing:
        pass

    def landed(ref):  # the signal handler's KeyboardInterrupt, raised in here
        raise KeyboardInterrupt

    hook = sys.unraisablehook
    sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with terminate_as_interrupt(), pytest.raises(KeyboardInterrupt):
            thing = Thing()
            ref = weakref.ref(thing, landed)
            del thing  # the callback runs here, and its exception is dropped
            for _ in range(1000):
                time.sleep(0.001)
        assert ref() is None
    finally:
        signal.signal(signal.SIGINT, sigint)
    assert sys.unraisablehook is hook  # given back
    assert "Exception ignored" not in capsys.readouterr().err


def test_ranks_that_refuse_together_each_say_why_before_any_exits(monkeypatch, capsys):
    # rank 1 of a torchrun whose output directory rank 0 refused was stopped by torchrun, as
    # soon as rank 0 had exited, before it printed its own line
    import sys
    import types

    import rppo_td.train as train
    from rppo_td.train._distributed import RanksRefused

    said = []

    class Refused:
        def __init__(self, config, given=None):
            raise RanksRefused("rank 1: output directory 'x' already holds a run")

    monkeypatch.setattr(train, "Trainer", Refused)
    monkeypatch.setattr(train, "wait_for_ranks", lambda: said.append(capsys.readouterr().err))
    assert train.main(["--preset", "smoke", "--no-progress"]) == 2
    assert said == ["rppo-train: error: rank 1: output directory 'x' already holds a run\n"]
    # the ranks share one stderr: each line is one write, else two ranks' lines ran together
    writes = []
    stream = types.SimpleNamespace(write=writes.append, flush=lambda: None)
    monkeypatch.setattr(sys, "stderr", stream)
    assert train.main(["--preset", "smoke", "--no-progress"]) == 2
    assert writes == ["rppo-train: error: rank 1: output directory 'x' already holds a run\n"]


def test_an_env_of_ones_own_that_cannot_be_built_is_a_setting_error(monkeypatch, capsys, tmp_path):
    # before: a module failing on import was a traceback (exit 1); an entry point that does not
    # load or a constructor that raises was one line but exit 1, as for an env failing mid-run
    import rppo_td.train as train

    (tmp_path / "mine_broken.py").write_text("raise RuntimeError('module side effect failed')\n")
    (tmp_path / "mine_envs.py").write_text(
        "import gymnasium as gym\n"
        "class NeedsArg(gym.Env):\n"
        "    def __init__(self, size):\n"
        "        pass\n"
        "gym.register('mine/Missing-v0', entry_point='mine_envs:DoesNotExist')\n"
        "gym.register('mine/NeedsArg-v0', entry_point='mine_envs:NeedsArg')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    run = ["--preset", "smoke", "--no-progress", "--output", str(tmp_path / "run"), "--env"]
    with pytest.raises(SystemExit) as exc:
        train.main([*run, "mine_broken:X-v0"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "importing module 'mine_broken' to register 'X-v0' raised RuntimeError: module " in err
    assert len(err.splitlines()) == 1
    for env, message in (
        ("mine_envs:mine/Missing-v0", "could not load its entry point 'mine_envs:DoesNotExist'"),
        ("mine_envs:mine/NeedsArg-v0", "raised TypeError while being built"),
    ):
        assert train.main([*run, env, "--overwrite"]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    ("settings", "unused"),
    [
        ({"start_state": "refreshed", "burn_in": 4}, "burn_in=4 adds nothing"),
        (
            {"start_state": "refreshed", "rollout_steps": 16, "sequence_length": 16},
            "start_state='refreshed' changes nothing while sequence_length=16 >= rollout_steps",
        ),
        (
            {"burn_in": 4, "rollout_steps": 16, "sequence_length": 32},
            "burn_in=4 changes nothing while sequence_length=32",
        ),
        ({"recurrence": "none", "num_layers": 3}, "num_layers=3 stacks recurrent layers"),
        ({"normalize_observations": False, "center_observations": True}, "center_observations"),
        ({"normalize_observations": False, "normalizer_steps": 100}, "normalizer_steps=100"),
        ({"novelty_steps": 4096}, "novelty_steps=4096"),
        ({"anneal_lr": False, "anneal_clip": False, "anneal_steps": 4096}, "anneal_steps=4096"),
        ({"advantage_eps": 0.5}, "advantage_eps=0.5"),
        ({"recurrence": "none", "encoder_skip": True}, "encoder_skip=True feeds the heads"),
        ({"epochs": 1, "target_kl": 0.02}, "target_kl=0.02 stops an update"),
        # the update raised it to 0.001 in silence (old runs' 0.0 still load)
        ({"clip_epsilon": 0.0}, "clip_epsilon=0.0 is below 0.001"),
        # trained nothing, in silence
        ({"learning_rate": 0.0}, "learning_rate=0.0 leaves the network as it is"),
    ],
)
def test_settings_left_unused_are_warned_of(settings, unused, tmp_path, caplog):
    config = TrainConfig(**settings)
    assert [line for line in config.unused_settings() if line.startswith(unused)]
    # the same settings where they act, and the defaults: nothing to say
    assert TrainConfig().unused_settings() == []
    assert TrainConfig(novelty_bonus=0.01, novelty_steps=4096).unused_settings() == []
    assert TrainConfig(burn_in=4, rollout_steps=32, num_workers=32).unused_settings() == []
    assert TrainConfig(encoder_skip=True, epochs=2, target_kl=0.02).unused_settings() == []
    # the trainer logs each line when a run starts
    from rppo_td.train import Trainer

    runs = {"total_steps": 4096, "eval_episodes": 0, "progress": False}
    with caplog.at_level("WARNING", logger="rppo_td.train._loop"):
        Trainer(config.replace(**runs, output=str(tmp_path / "run"))).release()
    assert any(unused in record.getMessage() for record in caplog.records)


def test_whole_numbers_for_float_settings_are_floats():
    # learning_rate: 1 in a config file was written to summary.json as the int 1
    config = TrainConfig(learning_rate=1, gamma=1, target_kl=0)
    assert type(config.learning_rate) is float and config.learning_rate == 1.0
    assert type(config.gamma) is float and type(config.target_kl) is float
    assert type(config.num_workers) is int  # int settings stay ints


def test_a_device_this_build_cannot_use_is_refused_before_the_directory_is_touched(
    capsys, tmp_path
):
    # before: --device mps (or meta, xla) failed with a traceback after --overwrite had
    # deleted the previous run
    from rppo_td import train

    run = ["--preset", "smoke", "--no-progress", "--threads", "1", "--output", str(tmp_path)]
    assert train.main(run) == 0
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    for device, words in (
        ("mps", "cannot be used by this torch build here"),
        ("meta", "holds no data"),
        ("ipu", "cannot be used by this torch build here"),
    ):
        assert train.main([*run, "--overwrite", "--device", device]) == 2
        err = capsys.readouterr().err.strip()
        assert f"device {device!r} {words}" in err and len(err.splitlines()) == 1, err
        assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_resume_checks_its_flags_against_the_checkpoint_not_the_defaults(capsys, tmp_path):
    # before: `--resume r --total-steps 512` of a run of 4 x 32-step rollouts was refused as
    # "less than one rollout (num_workers * rollout_steps = 1024)", the defaults' rollout
    from rppo_td import train

    run = ["--preset", "smoke", "--no-progress", "--threads", "1", "--num-workers", "4"]
    run += ["--rollout-steps", "32", "--sequence-length", "8", "--total-steps", "512"]
    assert train.main([*run, "--output", str(tmp_path)]) == 0
    capsys.readouterr()
    assert train.main(["--resume", str(tmp_path), "--total-steps", "512"]) == 0
    # a value of its own is still refused alone, and a change against the checkpoint
    with pytest.raises(SystemExit):
        config_from_args(["--resume", str(tmp_path), "--hidden-size", "-3"])
    assert "--hidden-size must be an integer" in capsys.readouterr().err
    assert train.main(["--resume", str(tmp_path), "--total-steps", "1024"]) == 2
    assert "total_steps: checkpoint 512, requested 1024" in capsys.readouterr().err


def test_from_dict_names_what_is_not_a_mapping():
    # from_dict(None) raised "'NoneType' object is not iterable"; from_dict([]) was taken
    for values, kind in ((None, "NoneType"), ([], "list"), ("total_steps", "str")):
        with pytest.raises(TypeError, match=f"config must be a mapping .*, got {kind}"):
            TrainConfig.from_dict(values)


class _HugeDiscreteObs(gym.Env):
    """Discrete(2**40) observations: one-hot encoded, 2**40 inputs."""

    observation_space = gym.spaces.Discrete(2**40)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        return 0, {}

    def step(self, action):
        return 0, 0.0, False, False, {}


def test_an_agent_too_big_for_memory_names_the_spaces_and_the_size(capsys, tmp_path):
    # the allocator's message was cut at 160 characters, mid-word, naming no space
    import rppo_td.train as train

    if "rppo_td_test/HugeDiscreteObs-v0" not in gym.registry:
        gym.register("rppo_td_test/HugeDiscreteObs-v0", entry_point=_HugeDiscreteObs)
    argv = ["--env", "rppo_td_test/HugeDiscreteObs-v0", "--output", str(tmp_path / "run")]
    assert train.main([*argv, "--no-progress", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "rppo-train: error: the agent (hidden_size=64, num_layers=1) for observation space "
        "Discrete(1099511627776) and action space Discrete(3) does not fit in memory on cpu"
    ), err
    assert err.endswith("it tried to allocate 256.0 TiB\n"), err


def test_settings_from_a_file_or_python_are_read_as_a_user_means_them(tmp_path, capsys, caplog):
    # an int beyond float's range for a float setting raised OverflowError (exit status 1)
    huge = tmp_path / "huge.yaml"
    huge.write_text("gamma: 1" + "0" * 400 + "\n")
    err = _error(capsys, ["--config", str(huge)])
    assert "gamma must be a finite number in [0.0, 1.0], got an integer of 401 digits" in err
    with pytest.raises(ValueError, match="learning_rate must be a finite number"):
        TrainConfig(learning_rate=-(10**400))
    with pytest.raises(ValueError, match="got an integer of 401 digits"):
        TrainConfig.check_each({"gamma": 10**400})  # a resume's given settings, alone
    # ~ in a YAML file or from Python: the home directory, not a folder named "~" here
    config = TrainConfig(output="~/runs/x")
    assert config.output_dir() == Path.home() / "runs" / "x"
    from rppo_td.train._checkpoint import checkpoint_file

    assert checkpoint_file("~/no/such/run.pt") == Path.home() / "no" / "such" / "run.pt"
    # the flags of the command line are not settings a file holds; misspellings get a hint
    (tmp_path / "preset.yaml").write_text("preset: smoke\n")
    err = _error(capsys, ["--config", str(tmp_path / "preset.yaml")])
    assert "names ['preset']: --preset and --config are flags of the command line" in err
    (tmp_path / "typo.yaml").write_text("learning_rte: 0.001\n")
    err = _error(capsys, ["--config", str(tmp_path / "typo.yaml")])
    assert "unknown setting(s) ['learning_rte'] (did you mean 'learning_rate'?)" in err
    assert "unknown preset 'smok' (did you mean 'smoke'?)" in _error(capsys, ["--preset", "smok"])
    with pytest.raises(KeyError, match=r"\['num_worker'\] \(did you mean 'num_workers'\?\)"):
        TrainConfig.from_dict({"num_worker": 4})
    # a schedule's horizon while its feature is off: a warning (quickstart), not a refusal
    off = TrainConfig(novelty_steps=5, anneal_steps=5, anneal_lr=False, anneal_clip=False)
    assert [line.split(" ")[0] for line in off.unused_settings()] == [
        "novelty_steps=5",
        "anneal_steps=5",
    ]
    with pytest.raises(ValueError, match="novelty_steps=5 is shorter than one update"):
        TrainConfig(novelty_steps=5, novelty_bonus=0.1)
    with pytest.raises(ValueError, match="anneal_steps=5 is shorter than one update"):
        TrainConfig(anneal_steps=5)
    # a resume's runtime settings were checked against the default 128 workers: the
    # --env-processes 3 of a run of 6 was refused before its checkpoint was read
    config, given = config_from_args(["--resume", str(tmp_path / "run"), "--env-processes", "3"])
    assert config.env_processes == 3 and given["env_processes"] == 3
    from rppo_td.train._checkpoint import check_resumable

    saved = TrainConfig(num_workers=4, rollout_steps=16, total_steps=256, resume="elsewhere")
    with pytest.raises(ValueError, match="env_processes=3 must divide num_workers=4"):
        check_resumable(saved, {"env_processes": 3})  # checked in full, resume or not
    help_text = " ".join(build_parser().format_help().split())
    assert "(default: 'INFO'; one of DEBUG, INFO, WARNING, ERROR, CRITICAL)" in help_text


def test_closed_standard_descriptors_point_at_devnull(tmp_path):
    # with `<&- >&-` the next file opened took descriptor 0 (then 1): what writes to stdout
    # from C, or a process started later, wrote into that file (a run's own, say)
    script = (
        "import os, sys\n"
        "from rppo_td._streams import guard_std_streams\n"
        "guard_std_streams()\n"
        "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)\n"
        "null = [os.path.samefile(f'/proc/self/fd/{i}', os.devnull) for i in (0, 1)]\n"
        "os.write(fd, f'{fd} {null}'.encode())\n"
    )
    out = tmp_path / "opened"
    done = subprocess.run(
        [sys.executable, "-c", script, str(out)], stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: [os.close(fd) for fd in (0, 1)], timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    fd, null = out.read_text().split(" ", 1)
    assert int(fd) > 2 and null == "[True, True]"


def test_stderr_whose_file_fails_drops_its_writes():
    # a reader gone (`2>&1 | head -1`): the write's error ended the run; the descriptor is
    # pointed at devnull too, so what writes to it later (C code, a child process) succeeds
    from rppo_td._streams import QuietStream

    read, write = os.pipe()
    os.close(read)
    stream = open(write, "w", buffering=1)  # noqa: SIM115 (closed below)
    quiet = QuietStream(stream)
    try:
        assert quiet.write("lost\n") == 5
        assert quiet.write("also lost\n") == 10
        quiet.flush()
        assert os.write(write, b"x") == 1  # devnull, not the broken pipe
    finally:
        quiet.close()
        stream.close()

    class FailingFlush(io.StringIO):
        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    failing = FailingFlush()
    quiet = QuietStream(failing)
    quiet.flush()  # dropped, not raised
    quiet.write("later\n")
    quiet.flush()
    assert failing.getvalue() == ""  # what follows goes to devnull
    quiet.close()


def test_help_gives_each_setting_one_default_and_says_none_for_empty_ones():
    # --output read "(default runs/<env>-<recurrence>-s<seed>) (default: '')"
    help_text = " ".join(build_parser().format_help().split())
    assert "(default runs/<env>-<recurrence>-s<seed>) --resume" in help_text
    assert "so resume only runs you trust (default: none) " in help_text
    assert "(default: '')" not in help_text


@given(st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**60), 2**60).map(float))
def test_whole_number_is_the_int_a_float_names_exactly(value):
    from rppo_td.train._config import whole_number

    whole = whole_number(value)
    exact = math.isfinite(value) and value.is_integer() and abs(value) < 2**53
    assert (whole is not None) == exact
    if exact:
        assert type(whole) is int and whole == value
        assert whole_number(repr(value)) == whole  # the text YAML 1.1 leaves: '1e+16'
    assert whole_number(True) is None and whole_number(3) is None and whole_number("x") is None


def test_counts_written_in_float_notation_are_read_as_counts(tmp_path, capsys):
    # YAML 1.1 reads `total_steps: 1e5` as the string '1e5' and rl-zoo writes
    # `!!float 1e5`: both were refused ("must be an integer, got '1e5'"), as was --total-steps 1e5
    config, given = config_from_args(["--total-steps", "2.048e3", "--num-workers", "16.0"])
    assert (config.total_steps, config.num_workers) == (2048, 16) and given["total_steps"] == 2048
    assert type(config.total_steps) is int
    for text in ("total_steps: 2e3\n", "total_steps: !!float 2000\n", "total_steps: 2000.0\n"):
        path = tmp_path / "run.yaml"
        path.write_text(text)
        config, _ = config_from_args(["--config", str(path)])
        assert config.total_steps == 2000 and type(config.total_steps) is int
    assert TrainConfig(total_steps=1e5).total_steps == 100_000
    # not whole, or too large to be the number written: refused by name
    assert "'2.5e0' is not a whole number" in _error(capsys, ["--total-steps", "2.5e0"])
    assert "--seed must be an integer in [0, 4294967295], got an integer of 301 digits" in _error(
        capsys, ["--seed", "1e300"]
    )
    # text is read exactly: digits past 2**53 stay themselves, a fraction that rounds to a
    # whole float is no whole number, a float at 2**53 may be the rounding of another
    from rppo_td.train._cli import integer_flag
    from rppo_td.train._config import whole_number

    assert integer_flag("9007199254740993") == 2**53 + 1
    assert integer_flag("9.007199254740993e15") == 2**53 + 1
    assert integer_flag("1e20") == 10**20
    assert "'4503599627370495.5' is not a whole number" in _error(
        capsys, ["--total-steps", "4503599627370495.5"]
    )
    assert whole_number(2.0**53) is None and whole_number(2.0**53 - 1) == 2**53 - 1
    # rppo-eval's integer flags read the same way (parsed, then the checkpoint is missing)
    from rppo_td.train._evaluate import main as evaluate

    given = ["--episodes", "2e1", "--seed", "1e4", "--threads", "2.0", "--max-episode-steps"]
    given += ["5e2", "--video", str(tmp_path / "v.gif"), "--video-episodes", "1e0"]
    with pytest.raises(SystemExit):
        evaluate(["--checkpoint", str(tmp_path / "none"), *given])
    assert "rppo-eval: error: no checkpoint at" in capsys.readouterr().err
    for flag in ("--episodes", "--seed", "--threads", "--max-episode-steps", "--video-episodes"):
        with pytest.raises(SystemExit):
            evaluate(["--checkpoint", str(tmp_path / "none"), flag, "2.5"])
        assert f"argument {flag}: '2.5' is not a whole number" in capsys.readouterr().err
    path = tmp_path / "half.yaml"
    path.write_text("total_steps: 2000.5\n")
    assert "total_steps must be an integer in [1, " in _error(capsys, ["--config", str(path)])
    with pytest.raises(ValueError, match=r"total_steps must be an integer in .*got 1e\+20"):
        TrainConfig(total_steps=1e20)
