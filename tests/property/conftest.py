"""Fixtures of the property modules."""

from __future__ import annotations

import pytest

from rppo_td._native import native_kernels


@pytest.fixture(scope="module", params=["torch", "native"])
def both_kernel_paths(request):
    """A module's properties twice: the torch path, then numba's kernels at every size.

    Used as ``pytestmark = pytest.mark.usefixtures("both_kernel_paths")``.
    """
    with native_kernels(request.param == "native"):
        yield request.param
