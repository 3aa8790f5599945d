"""``TrainConfig``: every setting of a training run, with defaults that solve the built-in task."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rppo_td.envs import CARTPOLE_NOVEL_ID

__all__ = ["RUNTIME_FIELDS", "TrainConfig"]

# fields that may differ between a checkpoint and the run resuming it
RUNTIME_FIELDS = frozenset({"output", "resume", "device", "progress", "log_level", "threads"})


def _doc(text: str, **kwargs: Any) -> Any:
    return field(metadata={"help": text}, **kwargs)


@dataclass(kw_only=True)
class TrainConfig:
    """A training run. Every field is a CLI flag (``--total-steps``) and a YAML key.

    Defaults train an LSTM agent on ``rppo_td/CartPoleNoVel-v1`` to the 500-step maximum
    within 100k env steps (see ``benchmarks/learning.py``).
    """

    env: str = _doc(
        "gymnasium id, or module:EnvId to import a module first", default=CARTPOLE_NOVEL_ID
    )
    total_steps: int = _doc("env steps to train for (all workers together)", default=100_000)
    num_workers: int = _doc("parallel envs W", default=16)
    rollout_steps: int = _doc("steps T per env per update (a rollout is W x T)", default=32)
    sequence_length: int = _doc(
        "max BPTT sequence length L (episodes are cut into <= L)", default=16
    )
    recurrence: Literal["lstm", "gru", "none"] = _doc(
        "recurrent core; none is the control", default="lstm"
    )
    hidden_size: int = _doc("width of encoder, recurrent core and heads", default=64)
    num_layers: int = _doc("recurrent layers", default=1)
    head_layers: int = _doc("hidden layers in each of the policy and value heads", default=1)
    normalize_observations: bool = _doc(
        "standardise vector observations (running stats)", default=True
    )
    normalizer_steps: int = _doc(
        "env steps during which the observation statistics are updated, then frozen "
        "(0: all run long); frozen stats keep a solved policy's inputs from drifting as "
        "its observations narrow",
        default=0,
    )
    shared_critic: bool = _doc("share the encoder and core between policy and value", default=False)
    gamma: float = _doc("discount", default=0.98)
    gae_lambda: float = _doc("GAE lambda", default=0.8)
    epochs: int = _doc("PPO epochs per update", default=10)
    num_minibatches: int = _doc("minibatches per epoch (of whole sequences)", default=1)
    learning_rate: float = _doc("Adam learning rate", default=1e-3)
    anneal_lr: bool = _doc("decay the learning rate linearly to 0", default=True)
    clip_epsilon: float = _doc("PPO ratio clip", default=0.2)
    anneal_clip: bool = _doc("decay the clip range linearly to 0", default=True)
    value_coef: float = _doc("value loss coefficient", default=0.5)
    entropy_coef: float = _doc("entropy bonus coefficient", default=0.0)
    max_grad_norm: float = _doc("gradient-norm clip", default=0.5)
    normalize_advantage: bool = _doc(
        "standardise advantages per minibatch over real steps (masked_normalize); off by "
        "default: once the task is solved it scales noise up to unit size and the policy "
        "drifts",
        default=False,
    )
    advantage_eps: float = _doc(
        "added to the advantage std when normalising; a floor that keeps near-zero "
        "advantages (a solved task) from being blown up to unit scale",
        default=1e-8,
    )
    seed: int = _doc("seed of torch, numpy, the envs and the sampler", default=0)
    device: str = _doc("training device (cpu, cuda, ...)", default="cpu")
    threads: int = _doc("torch CPU threads (0 keeps torch's default)", default=1)
    collector: Literal["vector", "torchrl"] = _doc(
        "rollouts from a gymnasium SyncVectorEnv loop, or TorchRL's Collector", default="vector"
    )
    output: str = _doc("output directory (default runs/<env>-<recurrence>-s<seed>)", default="")
    resume: str = _doc("continue the run saved in this directory", default="")
    checkpoint_every: int = _doc("updates between checkpoints", default=20)
    eval_episodes: int = _doc("deterministic evaluation episodes at the end", default=20)
    progress: bool = _doc("show a progress bar", default=True)
    log_level: str = _doc("logging level", default="INFO")

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises ``ValueError`` naming the first bad field (and the env if unknown)."""
        ints = {
            "total_steps": 1,
            "num_workers": 1,
            "rollout_steps": 1,
            "sequence_length": 1,
            "hidden_size": 1,
            "num_layers": 1,
            "head_layers": 0,
            "epochs": 1,
            "num_minibatches": 1,
            "threads": 0,
            "checkpoint_every": 1,
            "eval_episodes": 0,
            "normalizer_steps": 0,
        }
        for name, low in ints.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        floats: dict[str, tuple[float, float]] = {
            "gamma": (0.0, 1.0),
            "gae_lambda": (0.0, 1.0),
            "clip_epsilon": (0.0, 10.0),
            "learning_rate": (0.0, 1.0),
            "value_coef": (0.0, 1e6),
            "entropy_coef": (0.0, 1e6),
            "max_grad_norm": (0.0, 1e6),
            "advantage_eps": (0.0, 1e6),
        }
        for name, (lo, hi) in floats.items():
            number = getattr(self, name)
            if (
                isinstance(number, bool)
                or not isinstance(number, int | float)
                or not (lo <= number <= hi)
            ):
                raise ValueError(f"{name} must be a number in [{lo}, {hi}], got {number!r}")
        for name in (
            "anneal_lr",
            "anneal_clip",
            "normalize_advantage",
            "progress",
            "shared_critic",
            "normalize_observations",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.recurrence not in ("lstm", "gru", "none"):
            raise ValueError(f"recurrence must be lstm, gru or none, got {self.recurrence!r}")
        if self.collector not in ("vector", "torchrl"):
            raise ValueError(f"collector must be vector or torchrl, got {self.collector!r}")
        if self.rollout_steps * self.num_workers > self.total_steps:
            raise ValueError(
                f"total_steps={self.total_steps} is less than one rollout "
                f"(num_workers * rollout_steps = {self.num_workers * self.rollout_steps})"
            )

    @property
    def steps_per_update(self) -> int:
        """``W * T``."""
        return self.num_workers * self.rollout_steps

    @property
    def num_updates(self) -> int:
        """Updates in the run: ``total_steps // (W * T)``."""
        return self.total_steps // self.steps_per_update

    def output_dir(self) -> Path:
        """``output``, or ``runs/<env>-<recurrence>-s<seed>`` when empty."""
        if self.output:
            return Path(self.output)
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.env.split(":")[-1])
        return Path("runs") / f"{name}-{self.recurrence}-s{self.seed}"

    def to_dict(self) -> dict[str, Any]:
        """Plain ``{field: value}`` (YAML- and JSON-serialisable)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], *, where: str = "config") -> TrainConfig:
        """Builds a config, refusing unknown keys with a ``KeyError`` naming them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise KeyError(f"{where}: unknown setting(s) {unknown}; known: {sorted(known)}")
        return cls(**values)

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)
