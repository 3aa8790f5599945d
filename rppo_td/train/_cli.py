"""The command line generated from ``TrainConfig``, with YAML presets and config files."""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from rppo_td.envs import resolve_env_id
from rppo_td.train._config import (
    RENAMED,
    RUNTIME_FIELDS,
    TrainConfig,
    close_matches,
    did_you_mean,
    field_hints,
    renamed_settings,
    unknown_settings,
    whole_number,
)

__all__ = [
    "ShortErrorParser",
    "build_parser",
    "config_from_args",
    "integer_flag",
    "list_presets",
    "load_yaml",
]


def list_presets() -> list[str]:
    """Names of the YAML presets shipped in ``rppo_td/train/presets``."""
    folder = resources.files("rppo_td.train") / "presets"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_yaml(path: str | Path, *, preset: bool = False) -> dict[str, Any]:
    """Reads a preset (by name) or a config file into a dict, with clear errors."""
    if preset:
        given = str(path)
        path = given.lower().replace("-", "_")  # --preset poc-memory names poc_memory.yaml
        if path not in list_presets():
            raise ValueError(
                f"unknown preset {given!r}{did_you_mean(path, list_presets())}; available: "
                f"{list_presets()}"
            )
        text = (resources.files("rppo_td.train") / "presets" / f"{path}.yaml").read_text()
        where = f"preset {path!r}"
    else:
        file = Path(path)
        where = f"config file {str(file)!r}"
        if not file.is_file():
            problem = "is not a file" if file.exists() else "does not exist"
            raise ValueError(f"{where} {problem}")
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"{where} cannot be read as UTF-8 text ({err})") from None
    try:
        values = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or type(err).__name__
        raise ValueError(f"{where} is not valid YAML{at}: {problem}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ValueError(f"{where} must hold a mapping of settings, got {type(values).__name__}")
    settings: dict[str, Any] = {}
    for key, value in values.items():
        name = str(key).replace("-", "_")
        if name in settings:
            raise ValueError(f"{where} sets {name!r} twice (spelt with '_' and with '-')")
        settings[name] = _yaml_number(name, value)
    # named here, with the file, rather than after the layers are merged
    flags = sorted({"preset", "config"} & set(settings))
    if flags:
        raise ValueError(
            f"{where} names {flags}: --preset and --config are flags of the command line, not "
            "settings a file can hold (give them there, or copy the preset's settings in)"
        )
    unknown = unknown_settings(settings)
    if unknown:
        raise ValueError(
            f"{where}: unknown setting(s) {unknown}{did_you_mean(unknown, sorted(field_hints()))}"
            f"; known: {sorted(field_hints())} (see rppo-train --help)"
        )
    return settings


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping holding one key twice.

    YAML leaves a repeated key to the reader; PyYAML keeps the last value silently, so a
    file that sets ``total_steps`` twice would train on whichever came last.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is set twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _yaml_number(name: str, value: Any) -> Any:
    """``value``, a number where a number setting got YAML 1.1's text for one (``1e-3``).

    YAML 1.1 reads ``1e-3`` and ``1e5`` (no dot, no sign) as strings; the command line reads
    them as numbers. A count's ``1e5`` (or ``100000.0``) is 100000 (``whole_number``);
    ``1.5e0`` is left as it is, refused by the config's own check, which names the setting.
    """
    hint = field_hints().get(name)
    if hint is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value  # refused by the config's own check, which names the setting
    if hint is int and isinstance(value, str | float):  # !!float 1e5, 100000.0
        whole = whole_number(value)
        return value if whole is None else whole
    return value


def integer_flag(text: str) -> int:
    """An integer flag's value: digits, or a whole number in float notation (``1e5``).

    ``whole_number`` reads the text exactly, digits however many included.
    """
    whole = whole_number(text)
    if whole is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")
    return whole


class _Once(argparse.Action):
    """Stores a flag's value, refusing the flag given twice (the first would be dropped)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[no-untyped-def]
        if hasattr(namespace, self.dest):
            parser.error(
                f"{option_string} given twice ({getattr(namespace, self.dest)!r} and "
                f"{values!r}); give one (a preset's settings can be changed by --config or "
                "flags)"
            )
        setattr(namespace, self.dest, values)


class ShortErrorParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``--help`` shows the usage).

    Flags must be spelt whole (``allow_abbrev=False``): argparse's prefixes took ``--gam``
    for ``--gamma``, so a truncated flag trained silently, and a flag added later could
    change what a script's prefix meant. An unrecognised flag names the closest ones.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> typing.NoReturn:
        """Prints ``prog: error: message (see prog --help)`` to stderr and exits with 2."""
        if message.startswith("unrecognized arguments: "):
            message += _close_flags(self, message.removeprefix("unrecognized arguments: "))
        hint = f"(see {self.prog} --help)"
        message = message if message.endswith(hint) else f"{message} {hint}"  # said once
        self.exit(2, f"{self.prog}: error: {message}\n")


def _close_flags(parser: argparse.ArgumentParser, unrecognized: str) -> str:
    """``"; did you mean --x?"`` for the flags in ``unrecognized`` close to one of ``parser``'s."""
    known = [
        option
        for action in parser._actions
        if action.help != argparse.SUPPRESS
        for option in action.option_strings
        if option.startswith("--")
    ]
    flags = [word.split("=", 1)[0] for word in unrecognized.split() if word.startswith("--")]
    hints = close_matches(flags, known)
    return f"; did you mean {' or '.join(hints)}?" if hints else ""


def _parse_type(hint: Any):
    """``(argparse type, choices)`` of a field annotation."""
    if typing.get_origin(hint) is typing.Literal:
        choices = typing.get_args(hint)
        return type(choices[0]), list(choices)
    return (integer_flag if hint is int else hint), None  # --total-steps 1e5


def build_parser(prog: str = "rppo-train") -> argparse.ArgumentParser:
    """One flag per ``TrainConfig`` field (``--total-steps``), plus ``--preset``/``--config``.

    Only flags given on the command line appear in the parsed namespace, so they can override
    a preset, a config file or a resumed checkpoint's settings.
    """
    parser = ShortErrorParser(
        prog=prog,
        description="Recurrent PPO on a gymnasium env. Settings come from the defaults, then "
        "--preset, then --config, then the flags given here.",
        argument_default=argparse.SUPPRESS,
    )
    parser.add_argument(
        "--preset",
        action=_Once,
        help=f"a shipped YAML preset: {', '.join(list_presets())}",
    )
    parser.add_argument(
        "--config", action=_Once, help="a YAML file of settings (keys as the flags, _ or -)"
    )
    hints = field_hints()
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        kind, choices = _parse_type(hints[f.name])
        low, high = f.metadata.get("low"), f.metadata.get("high")
        above = f.metadata.get("above")
        bounds = ""
        if low is not None:
            bounds = f"; >= {low}" if high is None else f"; {low} to {high}"
        elif above is not None:
            bounds = f"; > {above}" if high is None else f"; > {above}, at most {high}"
        if f.metadata.get("choices"):  # checked by the config, whatever the case
            bounds = f"; one of {', '.join(map(str, f.metadata['choices']))}"
        text = f.metadata.get("help", "")
        if "(default " in text:  # the help says what the default means (--output)
            help_text = f"{text[:-1]}{bounds})" if bounds else text
        else:
            shown = "none" if f.default == "" else repr(f.default)
            help_text = f"{text} (default: {shown}{bounds})"
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, help=help_text)
        else:
            parser.add_argument(
                flag,
                type=kind,
                choices=choices,
                help=help_text,
                metavar=f.name.upper() if choices is None else None,
            )
    for old, new in RENAMED.items():  # still accepted, not shown
        kind, _ = _parse_type(hints[new])
        parser.add_argument(
            "--" + old.replace("_", "-"), dest=old, type=kind, help=argparse.SUPPRESS
        )
    return parser


def config_from_args(argv: list[str] | None = None) -> tuple[TrainConfig, dict[str, Any]]:
    """Parses ``argv`` into a validated config; exits with a usage error on bad values.

    Returns:
        ``(config, given)``: the merged config and the settings given explicitly (preset,
        config file and flags), which a resumed run checks against its checkpoint.
    """
    parser = build_parser()
    args = vars(parser.parse_args(argv))
    sources: dict[str, str] = {}  # where each setting was last given
    try:
        given: dict[str, Any] = {}
        if "preset" in args:
            name = args.pop("preset")
            layer = load_yaml(name, preset=True)
            given.update(layer)
            sources.update(dict.fromkeys(layer, f"preset {name!r}"))
        if "config" in args:
            file = args.pop("config")
            layer = load_yaml(file)
            given.update(layer)
            sources.update(dict.fromkeys(layer, f"config file {str(file)!r}"))
        given.update(args)
        sources.update({key: "--" + key.replace("_", "-") for key in args})
        given = renamed_settings(given, where="settings")
        if given.get("resume"):
            # the other settings are the checkpoint's: each one given is checked alone here,
            # then against the checkpoint's by the trainer, never against the defaults
            TrainConfig.check_each(given, where="settings")
            runtime = {key: value for key, value in given.items() if key in RUNTIME_FIELDS}
            config = TrainConfig.from_dict(runtime, where="settings")
        else:
            config = TrainConfig.from_dict(given, where="settings")
            resolve_env_id(config.env)
    except (ValueError, KeyError) as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
        parser.error(said_where(str(message), sources))
    return config, given


def said_where(message: str, sources: dict[str, str]) -> str:
    """``message`` about a setting, saying where the setting was given.

    A message that starts with a setting's name (``burn_in must be ...``, ``burn_in=5 ...``)
    names its flag instead where the flag gave it (``--burn-in must be ...``), and ends with
    ``(set by preset 'x')`` or ``(set by config file 'x.yaml')`` where one of those did.
    ``sources``: setting (as given, old names included) -> where it was given.
    """
    match = re.match(r"([a-z][a-z0-9_]*)(?=[= ])", message)
    if match is None:
        return message
    name = match.group(1)
    where = {RENAMED.get(key, key): value for key, value in sources.items()}
    source = sources.get(name) or where.get(name)
    if source is None:
        return message
    if source.startswith("--"):
        return source + message[len(name) :]
    return f"{message} (set by {source})"
