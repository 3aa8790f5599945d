"""Atomic checkpoints and the compatibility check of a resumed run."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rppo_td.train._config import RUNTIME_FIELDS, TrainConfig

__all__ = [
    "CHECKPOINT_NAME",
    "check_resumable",
    "load_checkpoint",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
]

CHECKPOINT_NAME = "checkpoint.pt"
FORMAT_VERSION = 1


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    """torch, numpy and python global RNG states, and the sampler's generator."""
    return {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
        "sampler": generator.get_state(),
    }


def set_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    """Restores ``rng_state()``."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    generator.set_state(state["sampler"])


def save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    """``torch.save`` to ``<path>.tmp`` then ``os.replace``: a crash never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"format_version": FORMAT_VERSION, **payload}, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Loads a checkpoint written by ``save_checkpoint`` (a directory means its checkpoint.pt).

    The file holds pickled env copies for an exact resume, so it is loaded with
    ``weights_only=False``: only load checkpoints you trust.

    Raises:
        ValueError: no such file, or not an rppo_td checkpoint.
    """
    file = Path(path)
    if file.is_dir():
        file = file / CHECKPOINT_NAME
    if not file.is_file():
        raise ValueError(f"no checkpoint at {str(file)!r}")
    data = torch.load(file, map_location="cpu", weights_only=False)
    if not isinstance(data, dict) or data.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{str(file)!r} is not an rppo_td checkpoint (format {FORMAT_VERSION})")
    return data


def check_resumable(saved: TrainConfig, given: dict[str, Any]) -> TrainConfig:
    """The saved config with the runtime settings of ``given``; refuses any other change.

    Args:
        saved: the checkpoint's config.
        given: settings given explicitly for the resuming run.

    Raises:
        ValueError: a setting other than ``RUNTIME_FIELDS`` differs, naming each one.
    """
    changed = {
        k: (getattr(saved, k), v)
        for k, v in given.items()
        if k not in RUNTIME_FIELDS and getattr(saved, k) != v
    }
    if changed:
        diffs = ", ".join(
            f"{k}: checkpoint {a!r}, requested {b!r}" for k, (a, b) in changed.items()
        )
        raise ValueError(
            f"cannot resume: the checkpoint was written with another config ({diffs}). Resume "
            "with the same settings, or start a new run in another --output directory."
        )
    runtime = {k: v for k, v in given.items() if k in RUNTIME_FIELDS and k != "resume"}
    return saved.replace(**runtime)
