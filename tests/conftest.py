"""Shared pytest configuration: hypothesis profiles, the ``gpu`` marker, narrow warning filters.

Hypothesis profiles (chosen by the ``HYPOTHESIS_PROFILE`` environment variable, default ``ci``,
so the README's test command and ``.ci/run`` run the same thing):

- ``ci``: at least 200 examples per property, no deadline (CI machines are noisy), failing
  examples printed with a reproduction blob.
- ``dev``: few examples, quick local runs (``HYPOTHESIS_PROFILE=dev python -m pytest``).

The suite runs on every core through pytest-xdist (``-n auto`` in ``pyproject.toml``): about
7 minutes on 2 free cores (398 s of tests on 2026-12-07), against about 12.5 in one process
(``-n 0``, also the way to run a single test without starting workers).
"""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "dev",
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def pytest_configure(config: pytest.Config) -> None:
    # torchrl 0.14.1 defines its own WeightUpdaterBase subclasses (VanillaWeightUpdater,
    # MultiProcessedWeightUpdater, ...) inside torchrl.collectors, and the base class warns
    # about each subclass at import time; we cannot avoid importing torchrl.collectors, so
    # ignore exactly that deprecation message.
    config.addinivalue_line(
        "filterwarnings",
        r"ignore:Creating \w+ which inherits from WeightUpdaterBase is deprecated"
        ":DeprecationWarning",
    )
    # When a property fails, hypothesis' pytest plugin imports libcst to suggest an @example
    # patch, and libcst's import warns through mypy_extensions; under filterwarnings=error
    # that turns a readable failure into an INTERNALERROR. Ignore only that message.
    config.addinivalue_line(
        "filterwarnings",
        "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
