"""Checkpoints that load without running code, and the compatibility check of a resumed run.

A run directory holds ``checkpoint.pt``: model, optimizer, config, counters and RNG states,
all tensors and plain Python data, so ``torch.load(weights_only=True)`` reads it and a crafted
file cannot run code. The env copies that an exact resume needs can only be pickled; they live
apart, in ``envs-<update>.pkl``, which ``checkpoint.pt`` names with its SHA-256. Only
``rppo-train --resume`` reads that file (after checking the hash); ``rppo-eval`` never does.

Every file is written to ``<name>.tmp``, flushed to disk and renamed over the old one, so a
crash leaves either the old checkpoint or the new one, never half a file. The env file is
written before the checkpoint that names it, and older env files are deleted only after.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import random
import re
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rppo_td._validation import first_line
from rppo_td.train._config import RUNTIME_FIELDS, TrainConfig

log = logging.getLogger(__name__)

__all__ = [
    "CHECKPOINT_NAME",
    "FORMAT_VERSION",
    "CheckpointError",
    "check_resumable",
    "checkpoint_file",
    "env_state_name",
    "env_state_files",
    "load_checkpoint",
    "load_env_state",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
    "write_atomic",
]

CHECKPOINT_NAME = "checkpoint.pt"
# 3: the policy head gained its ReLU (head_layers nonlinear layers, as the value head has);
# format-2 networks load into the same parameter names but would compute another policy.
# 4: the observation normaliser stopped centring unless center_observations is set; a
# format-3 run was centred, so it loads (and resumes) with center_observations: true
FORMAT_VERSION = 4
_CENTRED_FORMAT = 3
ENV_STATE_PREFIX = "envs-"
ENV_STATE_SUFFIX = ".pkl"

# what every checkpoint holds, with the type each entry must have
_REQUIRED: dict[str, type | tuple[type, ...]] = {
    "config": dict,
    "model": dict,
    "optimizer": dict,
    "collector": dict,
    "rng": dict,
    "counters": dict,
    "recent_returns": list,
    "recent_lengths": list,
}
_COUNTERS: dict[str, type | tuple[type, ...]] = {
    "update": int,
    "env_steps": int,
    "wall_time_s": (int, float),
    "collect_time_s": (int, float),
    "learn_time_s": (int, float),
    "episodes": int,
}


class CheckpointError(ValueError):
    """A file that is not a readable rppo_td checkpoint; the message names the file."""


def rng_state(generator: torch.Generator) -> dict[str, Any]:
    """torch, numpy and python global RNG states and the sampler's, as tensors and ints."""
    name, keys, position, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "torch": torch.get_rng_state(),
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "position": int(position),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "python": random.getstate(),
        "sampler": generator.get_state(),
    }


def set_rng_state(state: dict[str, Any], generator: torch.Generator) -> None:
    """Restores ``rng_state()``."""
    torch.set_rng_state(state["torch"])
    numpy = state["numpy"]
    np.random.set_state(
        (
            numpy["name"],
            numpy["keys"].numpy().astype(np.uint32),
            numpy["position"],
            numpy["has_gauss"],
            numpy["cached_gaussian"],
        )
    )
    random.setstate(state["python"])
    generator.set_state(state["sampler"])


def write_atomic(path: Path, write: Callable[[Any], None]) -> None:
    """Calls ``write(file)`` on ``<path>.tmp``, syncs it and renames it to ``path``.

    The temporary file is removed if anything fails (an interrupt included). A write that
    fails (a full disk) raises an ``OSError`` naming ``path``, also from ``torch.save``.
    """
    tmp = path.with_name(path.name + ".tmp")
    try:
        with tmp.open("wb") as f:
            try:
                write(f)
            except RuntimeError as err:
                # torch.save reports a failed write (a full disk) as its own RuntimeError,
                # raised while handling the OSError that says why: that one is raised
                cause = err.__cause__ or err.__context__
                if isinstance(cause, OSError):
                    raise OSError(cause.errno, cause.strerror, str(path)) from err
                raise
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def env_state_name(update: int) -> str:
    """``envs-<update>.pkl``, the env copies saved with the checkpoint of ``update``."""
    return f"{ENV_STATE_PREFIX}{update:08d}{ENV_STATE_SUFFIX}"


def env_state_files(directory: Path, suffix: str = "") -> list[Path]:
    """The env copies in ``directory``: the names ``env_state_name`` gives, plus ``suffix``.

    Matched by their exact form, so that a user's own ``envs-mine.pkl`` there is never taken
    for one (and deleted by ``--overwrite``, a resume's clean-up or a checkpoint's pruning).
    """
    form = rf"{re.escape(ENV_STATE_PREFIX)}\d{{8,}}{re.escape(ENV_STATE_SUFFIX + suffix)}"
    return [
        path
        for path in directory.glob(f"{ENV_STATE_PREFIX}*{ENV_STATE_SUFFIX}{suffix}")
        if re.fullmatch(form, path.name)
    ]


def save_checkpoint(
    directory: Path, payload: dict[str, Any], *, env_state: bytes | None = None
) -> Path:
    """Writes ``directory/checkpoint.pt`` (and the env copies, if given) atomically.

    Args:
        directory: the run's output directory.
        payload: tensors and plain Python data only (``torch.load(weights_only=True)``
            must read it back); ``counters["update"]`` names the env file.
        env_state: pickled env copies, or None to save none (a resume then restarts the
            envs from a reset).

    Returns:
        The checkpoint's path.
    """
    reference = None
    if env_state is not None:
        name = env_state_name(int(payload["counters"]["update"]))
        write_atomic(directory / name, lambda f: f.write(env_state))
        reference = {"file": name, "sha256": hashlib.sha256(env_state).hexdigest()}
    path = directory / CHECKPOINT_NAME
    data = {"format_version": FORMAT_VERSION, **payload, "env_state": reference}
    write_atomic(path, lambda f: torch.save(data, f))
    for old in env_state_files(directory):
        if reference is None or old.name != reference["file"]:
            try:
                old.unlink(missing_ok=True)
            except OSError as err:
                # the checkpoint is saved already: a stale file left is no reason to stop
                # (the run's error then named the checkpoint before as the one kept)
                log.warning(
                    "could not remove %s, which the checkpoint no longer uses: %s", old, err
                )
    return path


def checkpoint_file(path: str | Path) -> Path:
    """The checkpoint file ``path`` names: itself, or ``checkpoint.pt`` in a directory.

    A leading ``~`` is the user's home (a path from a YAML file or Python: no shell expands it).
    """
    file = Path(path).expanduser()
    return file / CHECKPOINT_NAME if file.is_dir() else file


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Reads a checkpoint written by ``save_checkpoint`` without running code from it.

    ``torch.load(weights_only=True)`` refuses anything but tensors and plain data, so a
    crafted file cannot run code; the content is then checked field by field. A format-3
    checkpoint (before ``center_observations``) is read as format 4 with
    ``center_observations: true`` in its config, the normalisation it was trained with.

    Args:
        path: ``checkpoint.pt`` or the run directory holding it.

    Raises:
        CheckpointError: no such file, or one that cannot be read, is empty, truncated,
            corrupt, crafted, from another format version or missing a field; the message
            names the file.
    """
    file = checkpoint_file(path)
    where = repr(str(file))
    if not file.is_file():
        raise CheckpointError(f"no checkpoint at {where}")
    if file.stat().st_size == 0:
        raise CheckpointError(f"{where} is empty, not an rppo_td checkpoint")
    try:
        with file.open("rb") as f:
            head = f.read(4)
    except OSError as err:  # no read permission, say
        raise CheckpointError(f"{where} cannot be read ({err.strerror or err})") from None
    if head != _ZIP_MAGIC:  # summary.json, metrics.csv, a pickle of something else
        raise CheckpointError(
            f"{where} is not an rppo_td checkpoint: checkpoints are the zip archives "
            f"torch.save writes, and this file starts with {head!r}"
        )
    _check_checksums(file, where)
    try:
        with warnings.catch_warnings():
            # torch warns about what it refuses to unpickle; the error below says it once
            warnings.simplefilter("ignore")
            data = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # torch.load raises many types for bad bytes
        text = str(err).strip()
        if isinstance(err, pickle.UnpicklingError) and text.startswith("Weights only load"):
            raise CheckpointError(
                f"{where} is not an rppo_td checkpoint: it holds objects other than tensors "
                "and plain data, refused without unpickling them"
            ) from None
        # torch's first sentence (the rest guesses at causes and runs on)
        detail = first_line(err, limit=200, sentence=True)
        raise CheckpointError(
            f"{where} is not a readable rppo_td checkpoint (truncated or corrupt: {detail})"
        ) from None
    _check_content(data, where)
    if data["format_version"] == _CENTRED_FORMAT:
        data["config"] = {"center_observations": True, **data["config"]}
        data["format_version"] = FORMAT_VERSION
    return data


_ZIP_MAGIC = b"PK\x03\x04"  # a zip archive's first local file header


def _check_checksums(file: Path, where: str) -> None:
    """Refuses a checkpoint whose bytes changed after it was written (a disk or copy fault).

    ``torch.save`` writes a zip archive with a CRC-32 of every entry, but ``torch.load``
    does not check them: damaged weights would load as other weights, silently. An archive
    cut short is left to ``torch.load``, which refuses it.
    """
    try:
        archive = zipfile.ZipFile(file)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return  # truncated: torch.load's error says so
    with archive:
        try:
            damaged = archive.testzip()
        except Exception as err:  # a damaged entry header or size: zipfile's many types
            raise CheckpointError(
                f"{where} is corrupt: {first_line(err, limit=160)}; use an intact copy or "
                "start a new run"
            ) from None
    if damaged is not None:
        raise CheckpointError(
            f"{where} is corrupt: the checksum of its entry {damaged!r} does not match its "
            "bytes (changed after it was written); use an intact copy or start a new run"
        )


def _check_content(data: Any, where: str) -> None:
    if not isinstance(data, dict):
        raise CheckpointError(
            f"{where} is not an rppo_td checkpoint: it holds a {type(data).__name__}, not a dict"
        )
    version = data.get("format_version")
    if version not in (FORMAT_VERSION, _CENTRED_FORMAT):
        raise CheckpointError(
            f"{where} is not an rppo_td checkpoint of format {FORMAT_VERSION} "
            f"(format_version: {version!r})"
            + (
                "; format 2 was written before the policy head gained its ReLU layer, so "
                "its network would act differently now: retrain it with this version"
                if version == 2
                else ""
            )
        )
    for key, kind in _REQUIRED.items():
        if not isinstance(data.get(key), kind):
            raise CheckpointError(
                f"{where} is not a complete rppo_td checkpoint: {key!r} must be a "
                f"{_type_names(kind)}, got {type(data.get(key)).__name__}"
            )
    for key, kind in _COUNTERS.items():
        value = data["counters"].get(key)
        number = value if isinstance(value, int | float) and not isinstance(value, bool) else -1
        if not isinstance(value, kind) or number < 0:
            raise CheckpointError(
                f"{where} is not a complete rppo_td checkpoint: counters[{key!r}] must be a "
                f"non-negative {_type_names(kind)}, got {value!r}"
            )
    damaged = _first_non_finite({"model": data["model"], "optimizer": data["optimizer"]})
    if damaged is not None:
        # training never steps into them (a step whose gradient is not finite is skipped):
        # bytes changed on the disk or in a copy (torch.load checks no CRC)
        raise CheckpointError(
            f"{where} is damaged: {damaged} holds NaN or inf, which training never writes"
        )
    reference = data.get("env_state")
    if reference is not None and not (
        isinstance(reference, dict)
        and isinstance(reference.get("file"), str)
        and isinstance(reference.get("sha256"), str)
    ):
        raise CheckpointError(f"{where}: 'env_state' must name a file and its sha256")


def _first_non_finite(tree: Any, path: str = "") -> str | None:
    """The path (``model['core.weight']``) of the first float tensor with NaN or inf, or None."""
    if isinstance(tree, torch.Tensor):
        return path if tree.is_floating_point() and not bool(tree.isfinite().all()) else None
    if isinstance(tree, dict):
        items: Any = tree.items()
    elif isinstance(tree, list | tuple):
        items = enumerate(tree)
    else:
        return None
    for key, value in items:
        found = _first_non_finite(value, f"{path}[{key!r}]" if path else str(key))
        if found is not None:
            return found
    return None


def _type_names(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(k.__name__ for k in kinds)


def load_env_state(
    directory: Path, reference: dict[str, str] | None
) -> tuple[Any | None, str | None]:
    """Unpickles the env copies a checkpoint names, after checking their SHA-256.

    Unpickling runs code: only ``--resume`` calls this, on runs the user trusts.

    Returns:
        ``(envs, None)``, or ``(None, why)`` when the checkpoint saved none, or the file is
        missing or does not match its hash (the caller then restarts the envs and says why).
    """
    if reference is None:
        return None, "the checkpoint saved no env state"
    file = directory / Path(reference["file"]).name
    if not file.is_file():
        return None, f"{file.name}, the env state the checkpoint names, is missing"
    blob = file.read_bytes()
    if hashlib.sha256(blob).hexdigest() != reference["sha256"]:
        return None, (
            f"{file.name} does not match the SHA-256 the checkpoint holds for it (changed or "
            "damaged since it was written)"
        )
    return pickle.loads(blob), None  # a file whose hash the checkpoint holds


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
    resumed = saved.replace(**runtime)
    resumed.check_combinations()  # in full, whatever the saved config's resume holds
    return resumed
