"""Forcing the sequence-at-a-time gather on the small rollouts of the properties."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rppo_td.functional import _padding


@contextlib.contextmanager
def gather_by_runs(on: bool) -> Iterator[None]:
    """While open, with ``on``, every narrow leaf is gathered a sequence at a time.

    ``pad_rows(runs=...)`` is taken only where a leaf's gather moves ``RUN_MIN_BYTES`` (2 MiB):
    never on the rollouts hypothesis draws. ``on=False`` leaves the bound as it is.
    """
    saved = _padding.RUN_MIN_BYTES
    if on:
        _padding.RUN_MIN_BYTES = 0
    try:
        yield
    finally:
        _padding.RUN_MIN_BYTES = saved
