"""B. rppo-train / rppo-eval configuration: flags, YAML files, presets, paths."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

from tests.adversarial.core import (
    CODE,
    CORRECT,
    EVAL,
    SILENT,
    TINY,
    TRAIN,
    Case,
    Result,
    Words,
    cli_crash_reason,
    cli_error,
    read_rows,
    run_proc,
    tmp_files,
)

CAT_TRAIN = "B. train config"
CAT_EVAL = "B. eval config"


def _fill(args, tmp: Path):
    return [a.replace("{tmp}", str(tmp)) for a in args]


def _fill_word(word, tmp: Path):
    if isinstance(word, str):
        return word.replace("{tmp}", str(tmp))
    return tuple(w.replace("{tmp}", str(tmp)) for w in word)


def _valid_run(proc, out: Path, check: Callable[[Path], str | None] | None) -> Result:
    if proc.rc != 0 or proc.timed_out:
        return Result("traceback", "valid settings refused: " + cli_crash_reason(proc))
    if "Traceback (most recent call last)" in proc.stderr:
        return Result("traceback", "exit 0 but a traceback in stderr")
    if not (out / "summary.json").is_file():
        return Result(SILENT, "exit 0 without summary.json")
    rows = read_rows(out / "metrics.csv")
    if not rows:
        return Result(SILENT, "exit 0 without metrics rows")
    left = tmp_files(out)
    if left:
        return Result("data lost", f"temporary files left: {left}")
    why = check(out) if check else None
    return Result(CORRECT) if why is None else Result(SILENT, why)


def train_case(
    cid: str,
    args: list[str],
    words: Words = (),
    *,
    valid: bool = False,
    codes=(2,),
    timeout: float = 120,
    setup: Callable[[Path], None] | None = None,
    check: Callable[[Path], str | None] | None = None,
    output: bool = True,
    marker: str | None = None,
    base: list[str] | None = None,
    out_rel: str = "run",
) -> Case:
    """``rppo-train TINY <args> --output {tmp}/run``; refused with ``words`` unless ``valid``."""

    def fn(tmp: Path) -> Result:
        if setup:
            setup(tmp)
        out = tmp / "run"
        argv = [*TRAIN, *(TINY if base is None else base), *_fill(args, tmp)]
        if output:
            argv += ["--output", str(out)]
        proc = run_proc(argv, cwd=tmp, timeout=timeout)
        if marker and (tmp / marker).exists():
            return Result(CODE, f"{marker} was created: the input executed code")
        if valid:
            return _valid_run(proc, tmp / out_rel, check)
        res = cli_error(proc, [_fill_word(w, tmp) for w in words], codes=codes)
        if res.outcome == "clear error" and check:
            why = check(tmp)
            if why:
                return Result(SILENT, why)
        return res

    return Case(f"B.train.{cid}", CAT_TRAIN, fn, kind="proc", timeout=timeout)


def eval_case(cid, args, words=(), *, valid=False, setup=None, timeout=120) -> Case:
    def fn(tmp: Path) -> Result:
        if setup:
            setup(tmp)
        proc = run_proc([*EVAL, *_fill(args, tmp)], cwd=tmp, timeout=timeout)
        if valid:
            if proc.rc == 0 and '"eval_return_mean"' in proc.stdout:
                return Result(CORRECT)
            return Result("traceback", "valid evaluation failed: " + cli_crash_reason(proc))
        return cli_error(proc, [_fill_word(w, tmp) for w in words])

    return Case(f"B.eval.{cid}", CAT_EVAL, fn, kind="proc", timeout=timeout)


def _names(flag: str) -> tuple[str, str]:
    return (flag.replace("-", "_"), flag)


# (flag, bad values, valid tricky values)
INT_FLAGS: dict[str, tuple[list[str], list[str]]] = {
    "total-steps": (["-64", "0", "abc", "1.5", "", "10"], []),
    "num-workers": (["-1", "0", "abc", "2.5", "1000000"], []),
    "rollout-steps": (["-1", "0", "x", "1000000"], []),
    "sequence-length": (["-1", "0", "x", "4.0"], ["1", "1000000000"]),
    "hidden-size": (["-8", "0", "x", "1099511627776"], []),
    "num-layers": (["-1", "0", "x", "100000000"], ["2"]),
    "head-layers": (["-1", "x", "100000000"], ["0"]),
    "normalizer-steps": (["-1", "x"], ["1000000000000", "16"]),
    "epochs": (["-1", "0", "x", "1000000000000"], []),
    "num-minibatches": (["-1", "0", "x", "1000000", "100", "5"], ["4"]),
    "threads": (["-1", "x", "1000000"], ["0"]),
    "checkpoint-every": (["-1", "0", "x"], ["1000000000"]),
    "eval-episodes": (["-1", "x", "10000000"], ["0"]),
    "seed": (["-1", "x", "1.5", "18446744073709551616"], ["4294967295"]),
}
FLOAT_FLAGS: dict[str, tuple[list[str], list[str]]] = {
    "gamma": (["-0.1", "1.5", "nan", "inf", "x"], ["0", "1"]),
    "lmbda": (["-0.1", "1.01", "nan", "-inf"], ["0", "1"]),
    "learning-rate": (["-1e-3", "2", "nan", "inf", "x"], ["0"]),
    "clip-epsilon": (["-0.2", "nan", "inf", "100"], []),
    "value-coef": (["-1", "nan", "inf", "1e7"], ["0"]),
    "entropy-coef": (["-1", "nan", "inf"], ["0.01"]),
    "max-grad-norm": (["-1", "nan", "inf"], []),
    "advantage-eps": (["-1", "nan", "inf"], []),
}
HUGE_TIMEOUT = 60


def flag_cases() -> list[Case]:
    cases = []
    for table in (INT_FLAGS, FLOAT_FLAGS):
        for flag, (bad, good) in table.items():
            for value in bad:
                huge = len(value.lstrip("-")) >= 7 and value.isdigit()
                words: list = [_names(flag)]
                if flag in ("num-workers", "rollout-steps") and value == "1000000":
                    words = [(flag.replace("-", "_"), flag, "total_steps", "total-steps")]
                tag = value or "empty"
                cases.append(
                    train_case(
                        f"flag.{flag}.{tag}",
                        [f"--{flag}={value}"],
                        words,
                        timeout=HUGE_TIMEOUT if huge else 120,
                    )
                )
            for value in good:
                extra = ["--normalize-advantage"] if flag == "advantage-eps" else []
                cases.append(
                    train_case(
                        f"flag.{flag}.valid.{value}", [f"--{flag}={value}", *extra], valid=True
                    )
                )

    # num_minibatches above what a rollout can give must fail before the first update
    def no_update(tmp: Path) -> str | None:
        rows = read_rows(tmp / "run" / "metrics.csv")
        return f"refused only after {len(rows)} update(s)" if rows else None

    cases.append(
        train_case(
            "flag.num-minibatches.gt.W.ceil.T.over.L.before.first.update",
            ["--num-minibatches=17"],
            [_names("num-minibatches")],
            check=no_update,
        )
    )
    other = [
        ("choice.recurrence.LSTM", ["--recurrence", "LSTM"], ["recurrence"]),
        ("choice.recurrence.transformer", ["--recurrence", "transformer"], ["recurrence"]),
        ("choice.collector.gym", ["--collector", "gym"], ["collector"]),
        ("bool.progress.with.value", ["--progress=1"], ["progress"]),
        ("bool.anneal-lr.yes", ["--anneal-lr", "yes"], [("yes", "unrecognized")]),
        ("device.cuda.unavailable", ["--device", "cuda"], ["cuda"]),
        ("device.nonsense", ["--device", "nonsense"], ["device"]),
        ("device.cuda99", ["--device", "cuda:99"], ["cuda"]),
        ("device.empty", ["--device", ""], ["device"]),
        ("log-level.VERBOSE", ["--log-level", "VERBOSE"], [("log_level", "log-level")]),
        ("log-level.number", ["--log-level", "10x"], [("log_level", "log-level")]),
        ("log-level.empty", ["--log-level", ""], [("log_level", "log-level")]),
        ("env.unknown", ["--env", "NoSuchEnv-v0"], ["NoSuchEnv-v0"]),
        ("env.missing.module", ["--env", "nosuchmodule_xyz:Foo-v0"], ["nosuchmodule_xyz"]),
        (
            "env.module.without.id",
            ["--env", "tests.adversarial.envs:adv/NoSuch-v0"],
            ["adv/NoSuch-v0"],
        ),
        ("env.colon.only", ["--env", ":"], ["env"]),
        ("env.empty", ["--env", ""], ["env"]),
        (
            "env.module.raises",
            ["--env", "tests.adversarial.no_such_module:X-v0"],
            ["tests.adversarial.no_such_module"],
        ),
        ("unknown.flag.typo", ["--totl-steps", "64"], ["--totl-steps"]),
        ("unknown.flag.gama", ["--gama", "0.9"], ["--gama"]),
        ("unknown.flag.positional", ["extra"], ["extra"]),
        ("ambiguous.abbrev.num", ["--num", "2"], ["--num"]),
        ("missing.value", ["--gamma"], ["gamma"]),
        ("preset.unknown", ["--preset", "nosuch"], ["nosuch"]),
        ("preset.empty", ["--preset", ""], ["preset"]),
        ("preset.path.traversal", ["--preset", "../_config"], ["preset"]),
        ("resume.nonexistent", ["--resume", "{tmp}/nope"], ["nope"]),
        ("resume.dir.without.checkpoint", ["--resume", "{tmp}"], [("checkpoint", "{tmp}")]),
    ]
    for cid, args, words in other:
        cases.append(train_case(cid, args, words))
    cases.append(train_case("valid.log-level.lowercase", ["--log-level", "debug"], valid=True))
    cases.append(train_case("valid.env.CartPole-v1", ["--env", "CartPole-v1"], valid=True))
    cases.append(
        train_case(
            "valid.env.module.form", ["--env", "tests.adversarial.envs:adv/Toy-v0"], valid=True
        )
    )
    cases.append(train_case("valid.collector.torchrl", ["--collector", "torchrl"], valid=True))
    cases.append(train_case("valid.recurrence.gru", ["--recurrence", "gru"], valid=True))
    cases.append(train_case("valid.recurrence.none", ["--recurrence", "none"], valid=True))
    cases.append(train_case("valid.preset.smoke", ["--preset", "smoke"], valid=True, base=[]))
    return cases


def output_cases() -> list[Case]:
    def make_file(tmp: Path) -> None:
        (tmp / "afile").write_text("not a directory\n")

    return [
        train_case(
            "output.under.a.file",
            ["--output", "/etc/passwd/x"],
            [("output", "/etc/passwd")],
            output=False,
        ),
        train_case(
            "output.uncreatable.proc",
            ["--output", "/proc/rppo_adv/x"],
            [("output", "/proc/rppo_adv")],
            output=False,
        ),
        train_case(
            "output.is.existing.file",
            ["--output", "{tmp}/afile"],
            [("output", "afile")],
            output=False,
            setup=make_file,
            check=lambda tmp: (
                None
                if (tmp / "afile").read_text() == "not a directory\n"
                else "the file given as --output was modified"
            ),
        ),
        train_case(
            "output.name.too.long",
            ["--output", "{tmp}/" + "a" * 300],
            [("output", "name")],
            output=False,
        ),
        train_case(
            "output.spaces.unicode",
            ["--output", "{tmp}/r\u00e4nn dir/x y"],
            valid=True,
            output=False,
            out_rel="r\u00e4nn dir/x y",
        ),
    ]


def _tiny_without(text: str | bytes) -> list[str]:
    """TINY without the flags of the keys a YAML text sets (flags would override them)."""
    keys: set[str] = set()
    if isinstance(text, str):
        keys = {m.replace("_", "-") for m in re.findall(r"^([A-Za-z][\w-]*)\s*:", text, re.M)}
    out: list[str] = []
    i = 0
    while i < len(TINY):
        flag = TINY[i]
        takes_value = i + 1 < len(TINY) and not TINY[i + 1].startswith("--")
        width = 2 if takes_value else 1
        if flag[2:].removeprefix("no-") not in keys:
            out += TINY[i : i + width]
        i += width
    return out


def _yaml_case(cid, text: str | bytes, words, *, valid=False, marker=None, codes=(2,)):
    """``--config cfg.yaml`` holding ``text``; ``valid="either"``: refusing clearly is fine too."""

    def setup(tmp: Path) -> None:
        path = tmp / "cfg.yaml"
        body = text.replace("{tmp}", str(tmp)) if isinstance(text, str) else text
        if isinstance(body, bytes):
            path.write_bytes(body)
        else:
            path.write_text(body)

    base = _tiny_without(text)
    args = ["--config", "{tmp}/cfg.yaml"]
    # a YAML that sets output must not be overridden by the harness's own --output flag
    sets_output = isinstance(text, str) and re.search(r"^output\s*:", text, re.M) is not None
    if valid == "either":
        ok = train_case(f"yaml.{cid}", args, valid=True, setup=setup, base=base)
        refuse = train_case(f"yaml.{cid}", args, words, setup=setup, base=base)

        def either(tmp: Path) -> Result:
            first = ok.fn(tmp)
            if first.outcome == CORRECT:
                return first
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            second = refuse.fn(tmp)
            return second if second.outcome == "clear error" else first

        return Case(ok.id, CAT_TRAIN, either, kind="proc", timeout=240)
    return train_case(
        f"yaml.{cid}",
        args,
        words,
        valid=valid,
        setup=setup,
        marker=marker,
        codes=codes,
        base=base,
        output=not sets_output,
    )


def yaml_cases() -> list[Case]:
    cfg = ("cfg.yaml", "config")
    cases = [
        _yaml_case("syntax.error", "total_steps: [64\nnum_workers: 2\n", [cfg]),
        _yaml_case("tab.indent", "total_steps:\n\t- 64\n", [cfg]),
        _yaml_case("output.int", "output: 7\n", ["output"]),
        _yaml_case("output.list", "output: [a, b]\n", ["output"]),
        _yaml_case("num_workers.str", 'num_workers: "four"\n', ["num_workers"]),
        _yaml_case("gamma.list", "gamma: [1]\n", ["gamma"]),
        _yaml_case("anneal_lr.str", 'anneal_lr: "yes"\n', ["anneal_lr"]),
        _yaml_case("progress.null", "progress: null\n", ["progress"]),
        _yaml_case("hidden_size.bool", "hidden_size: true\n", ["hidden_size"]),
        _yaml_case("total_steps.float", "total_steps: 6.4e1\n", ["total_steps"]),
        _yaml_case("seed.float", "seed: 1.5\n", ["seed"]),
        _yaml_case("seed.str", 'seed: "0"\n', ["seed"]),
        _yaml_case("seed.negative", "seed: -3\n", ["seed"]),
        _yaml_case("log_level.int", "log_level: 5\n", ["log_level"]),
        _yaml_case("log_level.bad", "log_level: VERBOSE\n", ["log_level"]),
        _yaml_case("device.int", "device: 3\n", ["device"]),
        _yaml_case("env.int", "env: 5\n", ["env"]),
        _yaml_case("recurrence.upper", "recurrence: LSTM\n", ["recurrence"]),
        _yaml_case("collector.int", "collector: 1\n", ["collector"]),
        _yaml_case("resume.int", "resume: 3\n", ["resume"]),
        _yaml_case("threads.str", "threads: many\n", ["threads"]),
        _yaml_case("gamma.str.number", 'gamma: "0.9"\n', ["gamma"]),
        # YAML 1.1 reads 3e-4 as a string: refusing it clearly or taking 3e-4 are both fine
        _yaml_case(
            "learning_rate.sci.without.dot",
            "learning_rate: 3e-4\n",
            ["learning_rate"],
            valid="either",
        ),
        _yaml_case("unknown.key", "totl_steps: 64\n", ["totl_steps"]),
        _yaml_case("nested.config.key", "config: other.yaml\n", ["config"]),
        _yaml_case("preset.key", "preset: smoke\n", ["preset"]),
        _yaml_case("int.key", "1: 2\n", ["1"]),
        _yaml_case("list", "- total_steps: 64\n- num_workers: 2\n", [cfg]),
        _yaml_case("scalar", "42\n", [cfg]),
        _yaml_case("string", "hello\n", [cfg]),
        _yaml_case("empty", "", [], valid=True),
        _yaml_case("comments.only", "# nothing here\n", [], valid=True),
        _yaml_case("dashed.keys", "hidden-size: 8\nnum-workers: 2\n", [], valid=True),
        _yaml_case("binary.garbage", bytes(range(256)) * 4, [cfg]),
        _yaml_case(
            "utf16.bom",
            "total_steps: 64\n".encode("utf-16"),
            [cfg],
        ),
        _yaml_case(
            "python.tag.code",
            '!!python/object/apply:os.system ["touch {tmp}/PWNED"]\n',
            [cfg],
            marker="PWNED",
        ),
        _yaml_case(
            "python.tag.value",
            'seed: !!python/object/apply:os.system ["touch {tmp}/PWNED"]\n',
            [cfg],
            marker="PWNED",
        ),
        _yaml_case("duplicate.keys", "hidden_size: 8\nhidden_size: x\n", ["hidden_size"]),
        _yaml_case(
            "anchor.bomb",
            "a: &a [1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a]\n"
            "c: &c [*b,*b,*b,*b,*b,*b,*b,*b]\nd: &d [*c,*c,*c,*c,*c,*c,*c,*c]\n",
            [("a", "b", "c", "d", "unknown")],
        ),
    ]

    def directory(tmp: Path) -> None:
        (tmp / "cfgdir").mkdir()

    cases.append(
        train_case(
            "yaml.directory", ["--config", "{tmp}/cfgdir"], [("cfgdir", "config")], setup=directory
        )
    )
    cases.append(train_case("yaml.nonexistent", ["--config", "{tmp}/nope.yaml"], ["nope.yaml"]))

    def unreadable(tmp: Path) -> None:
        (tmp / "fifo.yaml").symlink_to("/proc/self/mem")

    cases.append(
        train_case(
            "yaml.unreadable",
            ["--config", "{tmp}/fifo.yaml"],
            [("fifo.yaml", "config")],
            setup=unreadable,
        )
    )
    return cases


def eval_config_cases() -> list[Case]:
    def have_ckpt(tmp: Path) -> None:
        from tests.adversarial.cases_checkpoint import real_checkpoint

        (tmp / "ck").mkdir()
        (tmp / "ck" / "checkpoint.pt").write_bytes(real_checkpoint().read_bytes())

    ck = ["--checkpoint", "{tmp}/ck"]
    return [
        eval_case("episodes.0", [*ck, "--episodes", "0"], ["episodes"], setup=have_ckpt),
        eval_case("episodes.neg", [*ck, "--episodes=-1"], ["episodes"], setup=have_ckpt),
        eval_case("episodes.x", [*ck, "--episodes", "x"], ["episodes"], setup=have_ckpt),
        eval_case(
            "episodes.huge",
            [*ck, "--episodes", "100000000"],
            ["episodes"],
            setup=have_ckpt,
            timeout=60,
        ),
        eval_case("seed.neg", [*ck, "--seed=-1"], ["seed"], setup=have_ckpt),
        eval_case(
            "seed.huge.valid",
            [*ck, "--seed", "18446744073709551616", "--episodes", "1"],
            valid=True,
            setup=have_ckpt,
        ),
        eval_case("seed.x", [*ck, "--seed", "x"], ["seed"], setup=have_ckpt),
        eval_case("no.checkpoint.flag", ["--episodes", "1"], ["checkpoint"]),
        eval_case("checkpoint.nonexistent", ["--checkpoint", "{tmp}/nope.pt"], ["nope.pt"]),
        eval_case("checkpoint.empty.dir", ["--checkpoint", "{tmp}"], [("checkpoint", "{tmp}")]),
        eval_case("unknown.flag", [*ck, "--episods", "1"], ["--episods"], setup=have_ckpt),
        eval_case(
            "valid.stochastic",
            [*ck, "--episodes", "2", "--stochastic"],
            valid=True,
            setup=have_ckpt,
        ),
        eval_case(
            "valid.file.path",
            ["--checkpoint", "{tmp}/ck/checkpoint.pt", "--episodes", "1"],
            valid=True,
            setup=have_ckpt,
        ),
    ]


def all_cases() -> list[Case]:
    return [*flag_cases(), *output_cases(), *yaml_cases(), *eval_config_cases()]
