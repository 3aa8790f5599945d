"""Unit tests of rppo_td/functional/_masked.py."""

from __future__ import annotations

import re

import pytest
import torch

from rppo_td.functional import masked_mean, masked_normalize

MASK = torch.tensor([[True, True, False], [True, False, False]])


def test_masked_mean_golden():
    x = torch.tensor([[1.0, 2.0, 100.0], [6.0, -50.0, 7.0]])
    # (1 + 2 + 6) / 3
    torch.testing.assert_close(masked_mean(x, MASK), torch.tensor(3.0))
    # trailing feature dims follow the mask: [[1, 2], [3, 4]] and [5, 6] are real
    y = torch.arange(1.0, 13.0).view(2, 3, 2)
    torch.testing.assert_close(masked_mean(y, MASK), torch.tensor((1 + 2 + 3 + 4 + 7 + 8) / 6))


def test_masked_normalize_golden_and_ignores_padding():
    x = torch.tensor([[1.0, 2.0, 1e6], [6.0, -1e6, 3.0]])
    out = masked_normalize(x, MASK)
    # real steps 1, 2, 6: mean 3, population std sqrt((4 + 1 + 9) / 3)
    std = (14.0 / 3.0) ** 0.5
    expected = torch.tensor([[-2.0 / std, -1.0 / std, 0.0], [3.0 / std, 0.0, 0.0]])
    torch.testing.assert_close(out, expected)
    # whatever the padding holds, the result is the same
    other = torch.where(MASK, x, torch.randn(2, 3))
    torch.testing.assert_close(masked_normalize(other, MASK), out)
    real = out[MASK]
    torch.testing.assert_close(real.mean(), torch.tensor(0.0), atol=1e-6, rtol=0)
    torch.testing.assert_close(real.std(unbiased=False), torch.tensor(1.0), atol=1e-6, rtol=0)


def test_masked_normalize_single_real_step_is_zero():
    out = masked_normalize(torch.tensor([[5.0, 9.0]]), torch.tensor([[True, False]]))
    assert out.tolist() == [[0.0, 0.0]]


def test_mask_checks():
    with pytest.raises(
        ValueError,
        match=re.escape(
            "mask of shape [2, 3] must match the leading dims of x, got x of shape [3, 2]"
        ),
    ):
        masked_mean(torch.zeros(3, 2), MASK)
    with pytest.raises(
        ValueError, match=re.escape("mask must have dtype torch.bool, got torch.int64")
    ):
        masked_normalize(torch.zeros(2, 3), MASK.long())
