"""``TrainConfig``: every setting of a training run, with defaults that solve the built-in task."""

from __future__ import annotations

import dataclasses
import decimal
import difflib
import functools
import logging
import math
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy

from rppo_td.envs import CARTPOLE_NOVEL_ID

__all__ = ["RENAMED", "RUNTIME_FIELDS", "TrainConfig", "renamed_settings"]

# the smallest PPO clip an update uses: RecurrentPPOLoss takes a clip in (0, 1)
CLIP_FLOOR = 1e-3

log = logging.getLogger(__name__)

# fields that may differ between a checkpoint and the run resuming it
RUNTIME_FIELDS = frozenset(
    {"output", "resume", "overwrite", "device", "progress", "log_level", "threads", "env_processes"}
)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# settings renamed to the library's (TorchRL's) names: old name -> new name; the old names are
# still read (config files, presets, flags, the configs inside older checkpoints)
RENAMED = {"gae_lambda": "lmbda"}


def _doc(
    text: str,
    *,
    default: Any,
    low: float | None = None,
    high: float | None = None,
    above: float | None = None,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """A field with its help, default, bounds and choices in one place.

    ``low`` and ``high`` are inclusive; ``above`` is an exclusive lower bound (in place of
    ``low``).
    """
    metadata = {"help": text, "low": low, "high": high, "above": above, "choices": choices}
    return field(default=default, metadata=metadata)


def renamed_settings(values: dict[str, Any], *, where: str) -> dict[str, Any]:
    """``values`` with every old name of ``RENAMED`` replaced by the new one, with a warning.

    Raises:
        ValueError: a setting given under both names.
    """
    values = dict(values)
    for old, new in RENAMED.items():
        if old not in values:
            continue
        if new in values:
            raise ValueError(
                f"{where}: {old!r} is the old name of {new!r}; give one of them, not both"
            )
        log.warning("%s: setting %r is now called %r", where, old, new)
        values[new] = values.pop(old)
    return values


@functools.cache
def field_hints() -> dict[str, Any]:
    """``TrainConfig``'s field types (resolved once)."""
    return typing.get_type_hints(TrainConfig)


def unknown_settings(values: dict[str, Any]) -> list[str]:
    """The names in ``values`` that are neither a ``TrainConfig`` field nor an old name of one."""
    return sorted(set(values) - set(field_hints()) - set(RENAMED))


def close_matches(names: list[str], known: list[str]) -> list[str]:
    """The closest of ``known`` to each of ``names`` that has a close one, each once."""
    close: list[str] = []
    for name in names:
        close += [m for m in difflib.get_close_matches(name, known, n=1) if m not in close]
    return close


def did_you_mean(names: str | list[str], known: list[str]) -> str:
    """``" (did you mean 'x'?)"`` for the names close to one of ``known`` (``""``: none)."""
    close = close_matches([names] if isinstance(names, str) else names, known)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def _known_settings(values: dict[str, Any], *, where: str) -> dict[str, Any]:
    """``values`` under today's names, refusing an unknown setting with a ``KeyError``."""
    values = renamed_settings(values, where=where)
    unknown = unknown_settings(values)
    if unknown:
        known = sorted(field_hints())
        raise KeyError(
            f"{where}: unknown setting(s) {unknown}{did_you_mean(unknown, known)}; known: {known}"
        )
    return values


def _check_field(f: dataclasses.Field, hint: Any, value: Any) -> None:
    """Raises ``ValueError`` unless ``value`` has the field's type, bounds and choices."""
    name, meta = f.name, f.metadata
    if typing.get_origin(hint) is typing.Literal:
        choices: tuple[Any, ...] | None = typing.get_args(hint)
    else:
        choices = meta.get("choices")
    if choices is not None:
        if value not in choices or isinstance(value, bool):
            raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
        return
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")
        return
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string, got {value!r} ({type(value).__name__})")
        return
    low, high = meta.get("low"), meta.get("high")
    if hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        what = "an integer"
    else:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        ok = ok and _finite(value)
        what = "a finite number"
    above = meta.get("above")
    ok = ok and (low is None or value >= low) and (high is None or value <= high)
    ok = ok and (above is None or value > above)
    if not ok:
        if above is not None:
            bound = f" > {above}" if high is None else f" in ({above}, {high}]"
        else:
            bound = f" >= {low}" if high is None else f" in [{low}, {high}]"
        raise ValueError(f"{name} must be {what}{bound}, got {_brief(value)}")


# floats from 2**53 on are 2 or more apart: such a float may not be the number meant
_EXACT_FLOAT_INT = 2**53


def whole_number(value: object) -> int | None:
    """``value`` as an ``int`` where it is a whole number written as a float, else ``None``.

    ``1e5`` and ``100000.0`` (a float, or the text of one: YAML 1.1 reads ``1e5`` as a
    string) are the count 100000. Text is read exactly (``"1e20"`` is 10**20; ``"2.5"`` and
    ``"4503599627370495.5"`` are not whole, though the latter rounds to a whole float); a float
    must be below 2**53 in magnitude (beyond, it may be the rounding of another number).
    Text of digits is its integer; ``nan``, ``inf``, other text, bools and ints (counts
    already) give ``None``.
    """
    if isinstance(value, str):
        try:
            exact = decimal.Decimal(value.strip())
        except decimal.InvalidOperation:
            return None
        if not exact.is_finite() or exact != exact.to_integral_value():
            return None
        return int(exact)
    if not isinstance(value, float) or not _finite(value) or not value.is_integer():
        return None
    return int(value) if abs(value) < _EXACT_FLOAT_INT else None


def _finite(value: float) -> bool:
    """``math.isfinite``, False for an int beyond float's range (YAML's ``1000...0``)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _brief(value: Any) -> str:
    """``repr(value)``, an int of more than 30 digits by its sign and digit count."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"{'-' if value < 0 else ''}an integer of {len(str(abs(value)))} digits"
    return repr(value)


@dataclass(kw_only=True)
class TrainConfig:
    """A training run. Every field is a CLI flag (``--total-steps``) and a YAML key.

    Defaults train an LSTM agent on ``rppo_td/CartPoleNoVel-v1`` to the 500-step maximum
    within 100k env steps (see ``benchmarks/learning.py``).

    Example:
        >>> config = TrainConfig(total_steps=2_000, num_workers=4, rollout_steps=16)
        >>> config.validate()
        >>> config.steps_per_update, config.num_updates
        (64, 31)
        >>> try:
        ...     TrainConfig(burn_in=10).validate()  # the default rollout has 8 steps
        ... except ValueError as err:
        ...     print(err)
        burn_in=10 asks for more steps than a rollout holds: ... use burn_in <= 7 ...
    """

    env: str = _doc(
        "gymnasium id, or module:EnvId to import a module first", default=CARTPOLE_NOVEL_ID
    )
    total_steps: int = _doc(
        "env steps to train for (all workers together), rounded down to whole updates "
        "(num_workers * rollout_steps each)",
        default=100_000,
        low=1,
        high=10**15,  # beyond, tqdm's float arithmetic overflowed mid-run
    )
    num_workers: int = _doc("parallel envs W", default=128, low=1, high=100_000)
    rollout_steps: int = _doc("steps T per env per update (a rollout is W x T)", default=8, low=1)
    sequence_length: int = _doc(
        "max BPTT sequence length L (episodes are cut into <= L)", default=16, low=1
    )
    recurrence: Literal["lstm", "gru", "none"] = _doc(
        "recurrent core; none is the control", default="lstm"
    )
    start_state: Literal["stored", "refreshed", "zero"] = _doc(
        "state each sequence starts from: stored at collection, refreshed before each epoch "
        "by the current network, or zero",
        default="stored",
    )
    burn_in: int = _doc(
        "steps of the same episode run (no gradient, no loss) before each sequence",
        default=0,
        low=0,
        high=100_000,
    )
    hidden_size: int = _doc(
        "width of encoder, recurrent core and heads", default=64, low=1, high=65_536
    )
    num_layers: int = _doc("recurrent layers", default=1, low=1, high=128)
    head_layers: int = _doc(
        "hidden layers in each of the policy and value heads", default=1, low=0, high=64
    )
    forget_bias: float = _doc(
        "added to the LSTM forget gate's initial bias (0: PyTorch's init; 3 to 5 keep a cue "
        "from the first update, which memory tasks learn faster with); LSTM only",
        default=0.0,
        low=-100.0,
        high=100.0,
    )
    encoder_skip: bool = _doc(
        "the heads also read the encoder's features of the current step (beside the core's "
        "output), leaving the core to carry only what must be remembered; no effect without "
        "recurrence",
        default=False,
    )
    normalize_observations: bool = _doc(
        "scale float and integer vector (Box) observations by running stats (their root mean "
        "square about zero, or with center_observations their standard deviation); discrete "
        "(one-hot encoded) and uint8 image observations pass through unchanged",
        default=True,
    )
    center_observations: bool = _doc(
        "the observation normaliser subtracts the running mean too; off by default, since a "
        "position's running mean follows the policy and moves the point it treats as zero "
        "(masked CartPole: the cart drifts off the track); runs saved before this setting "
        "(checkpoint format 3) were centred",
        default=False,
    )
    image_layout: Literal["auto", "channels_first", "channels_last"] = _doc(
        "channel axis of uint8 image observations: auto reads it from the shape (the end "
        "that is 1, 3 or 4) and refuses a shape where both ends are, such as [3, 4, 4]; "
        "another value on an env without uint8 images is refused",
        default="auto",
    )
    normalizer_steps: int = _doc(
        "env steps during which the observation statistics are updated, then frozen "
        "(0: all run long); they take whole rollouts, so they freeze after the first "
        "update that reaches this count; frozen stats keep a solved policy's inputs from "
        "drifting as its observations narrow",
        default=0,
        low=0,
    )
    shared_critic: bool = _doc("share the encoder and core between policy and value", default=False)
    gamma: float = _doc("discount", default=0.99, low=0.0, high=1.0)
    lmbda: float = _doc(
        "GAE lambda (TorchRL's name; formerly gae_lambda)", default=0.8, low=0.0, high=1.0
    )
    epochs: int = _doc("PPO epochs per update", default=4, low=1, high=100_000)
    target_kl: float = _doc(
        "stop an update after the first epoch whose mean KL from the collecting policy "
        "(kl_k3, an estimate that is never negative, unlike kl_approx) exceeds this; 0: every "
        "update runs all epochs",
        default=0.0,
        low=0.0,
        high=1e6,
    )
    num_minibatches: int = _doc("minibatches per epoch (of whole sequences)", default=1, low=1)
    learning_rate: float = _doc(
        "Adam learning rate (4e-3 solved 146 of masked CartPole's seeds 0-149, 3e-3 141; "
        "docs/results.md)",
        default=4e-3,
        low=0.0,
        high=1.0,
    )
    anneal_lr: bool = _doc("decay the learning rate linearly to 0", default=True)
    clip_epsilon: float = _doc(
        "PPO ratio clip; the update uses at least 0.001, the smallest the loss takes (a "
        "smaller value, and an annealed clip, stop there)",
        default=0.2,
        low=0.0,
        high=0.99,
    )
    anneal_clip: bool = _doc("decay the clip range linearly to 0", default=True)
    anneal_steps: int = _doc(
        "env steps (all ranks together, as total_steps) over which anneal_lr and "
        "anneal_clip decay to 0 (0: total_steps), in whole updates: anneal_steps // "
        "(num_workers * rollout_steps * ranks); more than total_steps ends the run part way "
        "down, as a longer run would be at that point",
        default=0,
        low=0,
    )
    reward_scale: float = _doc(
        "rewards are multiplied by this for learning (logged returns stay the env's)",
        default=1.0,
        low=1e-9,
        high=1e6,
    )
    value_coef: float = _doc(
        "value loss coefficient; the default, 8, lets the critic's gradient dominate the "
        "clipped gradient norm (max_grad_norm), so the actor's steps shrink while the value "
        "estimates are poor (masked CartPole at 128 x 8, seeds 10-29: 18 of 20 solved at 2, 4 "
        "or 8, 14 at 0.5; docs/results.md)",
        default=8.0,
        low=0.0,
        high=1e6,
    )
    entropy_coef: float = _doc("entropy bonus coefficient", default=0.0, low=0.0, high=1e6)
    novelty_bonus: float = _doc(
        "reward added for each step that reaches an observation not seen before in its "
        "episode (EpisodicNoveltyBonus: an exploration bonus for memory tasks, where looking "
        "back at a cue is a detour before it pays); learning only, the logged returns and the "
        "evaluation stay the env's; 0: off",
        default=0.0,
        low=0.0,
        high=1e6,
    )
    novelty_steps: int = _doc(
        "env steps (all ranks together, as total_steps) over which novelty_bonus falls "
        "linearly to 0 (0: total_steps); the bonus moves once per update, so the horizon is "
        "novelty_steps // (num_workers * rollout_steps * ranks) updates, rounded down as "
        "total_steps is",
        default=0,
        low=0,
    )
    max_grad_norm: float = _doc(
        "gradient-norm clip (0 would stop all learning)", default=0.5, low=1e-9, high=1e6
    )
    normalize_advantage: bool = _doc(
        "standardise advantages per minibatch over real steps (masked_normalize); off by "
        "default: once the task is solved it scales noise up to unit size and the policy "
        "drifts",
        default=False,
    )
    advantage_eps: float = _doc(
        "added to the advantage std when normalising; a floor that keeps near-zero "
        "advantages (a solved task) from being blown up to unit scale (> 0: without it, "
        "advantages that differ only by rounding are scaled to unit deviation)",
        default=1e-8,
        above=0.0,
        high=1e6,
    )
    seed: int = _doc(
        "seed of torch, numpy, the envs and the sampler", default=0, low=0, high=2**32 - 1
    )
    device: str = _doc("training device (cpu, cuda, ...)", default="cpu")
    threads: int = _doc("torch CPU threads (0 keeps torch's default)", default=1, low=0, high=4096)
    env_processes: int = _doc(
        "worker processes N that step the W envs through TorchRL's ParallelEnv (W/N envs "
        "each; N must divide num_workers; --collector vector only); 0 keeps today's "
        "in-process stepping. Same rollouts for the same seed; a resume restarts the envs",
        default=0,
        low=0,
        high=100_000,
    )
    collector: Literal["vector", "torchrl"] = _doc(
        "rollouts from a gymnasium SyncVectorEnv loop, or TorchRL's Collector", default="vector"
    )
    output: str = _doc("output directory (default runs/<env>-<recurrence>-s<seed>)", default="")
    resume: str = _doc(
        "continue the run saved in this directory (or its checkpoint.pt); an exact resume "
        "also unpickles the env copies saved beside the checkpoint, so resume only runs you "
        "trust",
        default="",
    )
    overwrite: bool = _doc(
        "start afresh in an output directory that holds a run, deleting that run's files "
        "(without it such a directory is refused)",
        default=False,
    )
    checkpoint_every: int = _doc("updates between checkpoints", default=20, low=1)
    eval_episodes: int = _doc(
        "deterministic evaluation episodes at the end", default=20, low=0, high=10_000
    )
    progress: bool = _doc("show a progress bar", default=True)
    log_level: str = _doc("logging level", default="INFO", choices=LOG_LEVELS)

    def __post_init__(self) -> None:
        # numpy scalars (a sweep over np.arange, a value read from an array) as Python's
        # own, so that they pass the checks and are written to YAML and JSON as numbers; a
        # whole number for a float setting as a float (learning_rate: 1 is 1.0 in summary.json)
        # and a whole float for a count as an int (total_steps=1e5)
        hints = field_hints()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, numpy.generic):
                value = value.item()
            if hints[f.name] is float and type(value) is int and _finite(value):
                value = float(value)  # (one beyond float's range is refused by validate)
            if hints[f.name] is int and isinstance(value, float):
                whole = whole_number(value)
                value = value if whole is None else whole  # 1.5 is refused by validate
            setattr(self, f.name, value)
        if isinstance(self.log_level, str):
            self.log_level = self.log_level.upper()
        self.validate()

    def non_default_settings(self) -> dict[str, Any]:
        """The settings whose value is not the default (``resume`` left out), by name.

        What ``Trainer`` takes as asked for when a run resumed from Python gives no ``given``.
        """
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "resume" and getattr(self, f.name) != f.default
        }

    def validate(self) -> None:
        """Raises ``ValueError`` naming the first bad field, its expected and actual value.

        Every field is checked against its annotation (``int``, ``float``, ``bool``, ``str`` or
        a ``Literal``) and the bounds and choices in its metadata, then the settings are checked
        against each other (one rollout fits the budget, the minibatches fit a rollout).
        """
        hints = field_hints()
        for f in dataclasses.fields(self):
            _check_field(f, hints[f.name], getattr(self, f.name))
        if self.resume and self.overwrite:
            raise ValueError(
                "resume and overwrite contradict each other: --resume continues the run in "
                "its directory, --overwrite deletes it; give one"
            )
        if not self.resume:
            # with resume the other settings are the checkpoint's: those given are compared
            # with it, and the config resumed (the checkpoint's, with the runtime settings
            # given) is checked in full (check_combinations); checked here against the
            # defaults, TrainConfig(resume=..., total_steps=256) of a run of 128-step
            # rollouts was less than a default rollout
            self.check_combinations()

    def check_combinations(self) -> None:
        """Raises ``ValueError`` where settings contradict each other (``validate``'s end)."""
        if self.rollout_steps * self.num_workers > self.total_steps:
            raise ValueError(
                f"total_steps={self.total_steps} is less than one rollout "
                f"(num_workers * rollout_steps = {self.num_workers * self.rollout_steps})"
            )
        if self.env_processes > self.num_workers or (
            self.env_processes and self.num_workers % self.env_processes
        ):
            raise ValueError(
                f"env_processes={self.env_processes} must divide num_workers="
                f"{self.num_workers} (each process steps num_workers / env_processes envs)"
            )
        if self.env_processes and self.collector != "vector":
            raise ValueError(
                f"env_processes={self.env_processes} needs collector='vector', got "
                f"collector={self.collector!r}"
            )
        if self.recurrence == "none" and self.start_state != "stored":
            raise ValueError(
                f"start_state={self.start_state!r} needs a recurrent core; recurrence='none' "
                "has no state (use start_state='stored')"
            )
        if self.recurrence == "none" and self.burn_in:
            raise ValueError(
                f"burn_in={self.burn_in} needs a recurrent core; recurrence='none' has no "
                "state (use burn_in=0)"
            )
        if self.burn_in >= self.rollout_steps:
            raise ValueError(
                f"burn_in={self.burn_in} asks for more steps than a rollout holds: burn-in "
                "steps come from the same rollout, before a sequence's first step, so at most "
                f"rollout_steps - 1 = {self.rollout_steps - 1} precede one; use burn_in <= "
                f"{self.rollout_steps - 1} (or more rollout_steps)"
            )
        if self.forget_bias and self.recurrence != "lstm":
            raise ValueError(
                f"forget_bias={self.forget_bias} sets an LSTM's forget gate; "
                f"recurrence={self.recurrence!r} has none (use forget_bias=0 or recurrence='lstm')"
            )
        schedules = {  # their horizons, where the schedule is on (else unused_settings warns)
            "anneal_steps": self.anneal_lr or self.anneal_clip,
            "novelty_steps": bool(self.novelty_bonus),
        }
        for name in (name for name, on in schedules.items() if on):
            horizon = getattr(self, name)
            if horizon and horizon < self.steps_per_update:
                raise ValueError(
                    f"{name}={horizon} is shorter than one update: the schedule moves once "
                    f"per update of num_workers * rollout_steps = {self.steps_per_update} "
                    f"steps; use {name}=0 (total_steps) or >= {self.steps_per_update}"
                )
        fewest = self.num_workers * -(-self.rollout_steps // self.sequence_length)
        if self.num_minibatches > fewest:
            raise ValueError(
                f"num_minibatches={self.num_minibatches} can exceed the sequences of a rollout: "
                f"num_workers * ceil(rollout_steps / sequence_length) = {self.num_workers} * "
                f"ceil({self.rollout_steps} / {self.sequence_length}) = {fewest} is the fewest "
                f"a rollout can hold; use num_minibatches <= {fewest}"
            )

    def unused_settings(self) -> list[str]:
        """One line per setting changed from its default that this config leaves unused.

        Accepted (a preset or a sweep may carry them), but a user who set one expects an
        effect; the trainer logs each as a warning. Refused combinations are ``validate``'s.

        Example:
            >>> (line,) = TrainConfig(novelty_steps=4096).unused_settings()
            >>> line.endswith("the novelty bonus, which is off (novelty_bonus=0)")
            True
        """
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        changed = {name for name, value in defaults.items() if getattr(self, name) != value}
        rules = [
            (
                "burn_in",
                self.start_state == "refreshed",
                "adds nothing to start_state='refreshed' (the refreshed state already ran "
                "through every earlier step of the episode)",
            ),
            (
                "start_state",
                self.sequence_length >= self.rollout_steps and self.start_state == "refreshed",
                f"changes nothing while sequence_length={self.sequence_length} >= rollout_steps="
                f"{self.rollout_steps}: every sequence starts at its rollout's first step or an "
                "episode start, whose states are the stored ones",
            ),
            (
                "burn_in",
                self.sequence_length >= self.rollout_steps and self.start_state != "refreshed",
                f"changes nothing while sequence_length={self.sequence_length} >= rollout_steps="
                f"{self.rollout_steps}: no sequence has earlier steps of its episode in the "
                "rollout",
            ),
            (
                "num_layers",
                self.recurrence == "none",
                "stacks recurrent layers, and recurrence='none' has none",
            ),
            (
                "encoder_skip",
                self.recurrence == "none",
                "feeds the heads the encoder's features beside the core's output, and "
                "recurrence='none' has no core: the heads read those features already",
            ),
            (
                "target_kl",
                self.epochs == 1,
                "stops an update after an epoch whose KL is above it, and epochs=1 runs one "
                "epoch: there is none left to stop",
            ),
            (
                "center_observations",
                not self.normalize_observations,
                "shapes the observation normaliser, which is off (normalize_observations=False)",
            ),
            (
                "normalizer_steps",
                not self.normalize_observations,
                "freezes the observation normaliser, which is off (normalize_observations=False)",
            ),
            (
                "novelty_steps",
                not self.novelty_bonus,
                "sets the horizon of the novelty bonus, which is off (novelty_bonus=0)",
            ),
            (
                "anneal_steps",
                not self.anneal_lr and not self.anneal_clip,
                "sets the horizon of the annealing, which is off (anneal_lr and anneal_clip False)",
            ),
            (
                "clip_epsilon",
                self.clip_epsilon < CLIP_FLOOR,
                f"is below {CLIP_FLOOR}, the smallest clip the loss takes: the update uses "
                f"{CLIP_FLOOR}",
            ),
            (
                "learning_rate",
                self.learning_rate == 0,
                "leaves the network as it is (the updates take steps of size 0; only the "
                "observation statistics and the optimizer's moments change)",
            ),
            (
                "advantage_eps",
                not self.normalize_advantage,
                "is the advantage normalisation's epsilon, which is off "
                "(normalize_advantage=False)",
            ),
        ]
        return [
            f"{name}={getattr(self, name)!r} {why}"
            for name, unused, why in rules
            if unused and name in changed
        ]

    @property
    def steps_per_update(self) -> int:
        """``W * T``."""
        return self.num_workers * self.rollout_steps

    @property
    def num_updates(self) -> int:
        """Updates in the run: ``total_steps // (W * T)``."""
        return self.total_steps // self.steps_per_update

    @property
    def anneal_updates(self) -> int:
        """Updates of one process over which the schedules fall to 0: ``anneal_steps // (W * T)``.

        ``num_updates`` when ``anneal_steps`` is 0.
        """
        return self.horizon_updates(self.anneal_steps)

    def horizon_updates(self, steps: int, ranks: int = 1) -> int:
        """Updates in a schedule's horizon of ``steps`` env steps (0: ``num_updates``).

        ``steps`` and ``total_steps`` count every rank's steps together: with ``ranks``
        data-parallel ranks an update is ``ranks * W * T`` steps (at least one update).
        """
        per_update = self.steps_per_update * ranks
        return max(1, (steps or self.total_steps) // per_update)

    def output_dir(self) -> Path:
        """``output``, or ``runs/<env>-<recurrence>-s<seed>`` when empty."""
        if self.output:
            return Path(self.output).expanduser()  # a YAML file's ~/runs/x: no shell expands it
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.env.split(":")[-1])
        return Path("runs") / f"{name}-{self.recurrence}-s{self.seed}"

    def to_dict(self) -> dict[str, Any]:
        """Plain ``{field: value}`` (YAML- and JSON-serialisable)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, where: str = "config") -> TrainConfig:
        """Builds a config, refusing unknown keys with a ``KeyError`` naming them.

        Renamed settings are read under their old names (``renamed_settings``). Anything but
        a mapping of setting names is refused with a ``TypeError`` naming ``where``.
        """
        if not isinstance(values, Mapping):
            raise TypeError(
                f"{where} must be a mapping of setting names to values, got {type(values).__name__}"
            )
        return cls(**_known_settings(dict(values), where=where))

    @staticmethod
    def check_each(values: dict[str, Any], *, where: str = "config") -> None:
        """Checks each setting of ``values`` alone (its type, bounds and choices).

        For the settings given to a resumed run, which are compared with its checkpoint's
        rather than combined with the defaults (``--total-steps 512`` of a run of 128-step
        rollouts is no less than one of its rollouts, whatever the default rollout).

        Raises:
            KeyError: an unknown setting.
            ValueError: a setting's value, as ``validate`` names it.
        """
        values = _known_settings(values, where=where)
        hints = field_hints()
        for f in dataclasses.fields(TrainConfig):
            if f.name in values:
                _check_field(f, hints[f.name], values[f.name])

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)
