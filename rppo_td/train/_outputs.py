"""What a run writes: metrics.csv, TensorBoard events, learning_curve.png, summary.json."""

from __future__ import annotations

import csv
import json
import logging
import os
from pathlib import Path
from typing import Any

__all__ = [
    "SUMMARY_KEYS",
    "METRIC_FIELDS",
    "MetricsLog",
    "plot_learning_curve",
    "write_json_atomic",
]

log = logging.getLogger(__name__)

METRIC_FIELDS = (
    "update",
    "env_steps",
    "wall_time_s",
    "fps",
    "episode_return_mean",
    "episode_length_mean",
    "episodes",
    "loss_policy",
    "loss_value",
    "loss_entropy",
    "loss_total",
    "entropy",
    "clip_fraction",
    "approx_kl",
    "explained_variance",
    "grad_norm",
    "learning_rate",
    "clip_epsilon",
)

# the fields summary.json, rppo-train's final output and rppo-eval's output have in common
SUMMARY_KEYS = (
    "eval_return_mean",
    "eval_return_std",
    "eval_episodes",
    "env_steps",
    "wall_time_s",
    "fps",
)


class MetricsLog:
    """Appends one row per update to ``metrics.csv`` and the same scalars to TensorBoard.

    A resumed run appends to the existing CSV; TensorBoard starts a new events file in the
    same directory, which TensorBoard merges by step.

    Args:
        directory: the run's output directory.
        tensorboard: also write TensorBoard events.
    """

    def __init__(self, directory: Path, *, tensorboard: bool = True) -> None:
        self.path = directory / "metrics.csv"
        fresh = not self.path.exists()
        self._file = self.path.open("a", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=METRIC_FIELDS)
        if fresh:
            self._csv.writeheader()
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(directory))

    def write(self, row: dict[str, Any]) -> None:
        """Writes one update's row (missing fields are left empty)."""
        self._csv.writerow({k: row.get(k, "") for k in METRIC_FIELDS})
        self._file.flush()
        if self._tb is not None:
            step = int(row["env_steps"])
            for key in METRIC_FIELDS[2:]:
                value = row.get(key)
                if isinstance(value, int | float) and value == value:  # skip NaN
                    self._tb.add_scalar(f"train/{key}", value, step)

    def close(self) -> None:
        """Flushes and closes both writers."""
        self._file.close()
        if self._tb is not None:
            self._tb.close()


def read_metrics(path: Path) -> list[dict[str, str]]:
    """The rows of a ``metrics.csv``."""
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def plot_learning_curve(directory: Path, *, title: str = "") -> Path | None:
    """Plots mean episode return against env steps from ``metrics.csv`` to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in read_metrics(directory / "metrics.csv") if r["episode_return_mean"]]
    out = directory / "learning_curve.png"
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([int(r["env_steps"]) for r in rows], [float(r["episode_return_mean"]) for r in rows])
    ax.set_xlabel("env steps")
    ax.set_ylabel("mean episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Writes ``data`` as indented JSON via a temporary file and ``os.replace``."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)
