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


@pytest.mark.parametrize(
    ("dtype", "value"),
    [(torch.float32, 0.3), (torch.float16, 0.3), (torch.float64, 0.3), (torch.float64, 1e9 + 0.1)],
)
def test_masked_normalize_of_equal_real_steps_is_zero(dtype, value):
    """The mean of equal values is their value exactly: summed in float32 it was off by a
    rounding error that the division by a deviation of the same size made about 0.75."""
    mask = torch.tensor([[1] * 6, [1] * 3 + [0] * 3, [1] + [0] * 5, [1] * 4 + [0] * 2]).bool()
    x = torch.where(mask.unsqueeze(-1), torch.full((4, 6, 1), value, dtype=dtype), 7.0)
    assert masked_normalize(x, mask).abs().max() == 0


@pytest.mark.parametrize("eps", [1e-8, 0.0])
@pytest.mark.parametrize("real", [[True, True, False], [True, False, False]])
def test_no_spread_gives_zero_and_a_finite_gradient(real, eps):
    # equal real steps, or one: the gradient was NaN (the square root's at 0), and with
    # eps = 0 every position, padding included, was NaN (0 / 0)
    x = torch.tensor([[2.0, 2.0, 5.0]], requires_grad=True)
    out = masked_normalize(x, torch.tensor([real]), eps=eps)
    assert out.tolist() == [[0.0, 0.0, 0.0]]
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad[0, 2] == 0


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


def test_half_precision_is_summed_in_float32():
    # float16 sums overflowed past 65504: masked_mean of 10,000 values of 100 was inf, and
    # masked_normalize of advantages of size ~30 over 64 x 16 steps returned all zeros
    mask = torch.ones(100, 100, dtype=torch.bool)
    for dtype in (torch.float16, torch.bfloat16):
        mean = masked_mean(torch.full((100, 100), 100.0, dtype=dtype), mask)
        assert mean.dtype == dtype and mean.item() == 100.0
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 16, 1, generator=g) * 30).half()
    mask = torch.ones(64, 16, dtype=torch.bool)
    mask[:, 12:] = False
    y = masked_normalize(x, mask)
    assert y.dtype == torch.float16
    expected = masked_normalize(x.float(), mask)
    assert torch.allclose(y.float(), expected, atol=5e-3)
    assert y[~mask].eq(0).all()


def test_one_number_and_its_mask():
    # a 0-dim x and mask: a TypeError from view() inside the function
    assert masked_mean(torch.tensor(3.0), torch.tensor(True)).item() == 3.0
    assert masked_normalize(torch.tensor(3.0), torch.tensor(True)).item() == 0.0


@pytest.mark.parametrize("fn", [masked_mean, masked_normalize])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_non_float_x_is_refused_not_rounded(fn, dtype):
    # masked_mean of [1, 2] gave 1 and masked_normalize all zeros for int64
    x = torch.tensor([[1, 2, 0]]).to(dtype)
    with pytest.raises(ValueError, match=rf"'x' must be a floating-point tensor, got {dtype}"):
        fn(x, torch.tensor([[True, True, False]]))
