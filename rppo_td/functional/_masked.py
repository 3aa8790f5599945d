"""Reductions over real steps only: padding never enters a mean or a variance."""

from __future__ import annotations

import math
import numbers

import torch

from rppo_td._validation import check_floating, check_tensors

__all__ = ["masked_mean", "masked_normalize"]


def _expand_mask(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    check_tensors({"x": x, "mask": mask})
    # an integer mean would be rounded (1.5 -> 1), an integer normalisation all zeros
    check_floating("x", x)
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must have dtype torch.bool, got {mask.dtype}")
    if mask.device != x.device:
        raise ValueError(f"mask is on {mask.device}, but x is on {x.device}")
    if x.shape[: mask.ndim] != mask.shape:
        raise ValueError(
            f"mask of shape {list(mask.shape)} must match the leading dims of x, "
            f"got x of shape {list(x.shape)}"
        )
    return mask.reshape((*mask.shape, *([1] * (x.ndim - mask.ndim)))).expand_as(x)


def _accumulator(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 where it is half precision: float16 sums overflow past 65504."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is True.

    An all-False mask gives NaN, as ``torch.mean`` of an empty tensor does (not 0, which would
    pass for a mean); nothing is synchronised to check it, so the NaN shows in the loss.
    Half-precision ``x`` is summed in float32 (a float16 sum overflows past 65504) and the mean
    returned in ``x``'s dtype.

    Args:
        x: ``[N, Lp, *F]`` float.
        mask: ``[N, Lp]`` bool (``loss_mask``), or the leading dims of ``x`` exactly
            (it then covers the trailing dims).

    Returns:
        A scalar tensor.

    Example:
        >>> masked_mean(torch.tensor([[1.0, 3.0, 0.0]]), torch.tensor([[True, True, False]]))
        tensor(2.)
    """
    full = _expand_mask(x, mask)
    return (torch.where(full, _accumulator(x), 0.0).sum() / full.sum()).to(x.dtype)


def masked_normalize(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Standardises ``x`` with the mean and standard deviation of its real steps.

    Padding positions are returned as zero. Normalising over padded zeros would bias both
    statistics towards zero, the more so the more padding a batch holds. An all-False mask
    leaves nothing to normalise: every position is padding, so the result is all zero. Real
    steps that are all equal (one real step included) give 0, with ``eps = 0`` too, and a
    finite gradient (``(x - mean) / eps`` there: the deviation is not differentiable at 0,
    and its square root's inf derivative is not used). The statistics are
    computed in float64 (float32 on MPS) whatever ``x``'s dtype: float16 sums overflow, and
    float32 rounding left equal steps at about 0.75 instead of 0. The result has ``x``'s
    dtype.

    Args:
        x: ``[N, Lp, *F]`` float, e.g. ``advantage`` ``[N, Lp, 1]``.
        mask: ``[N, Lp]`` bool, or the leading dims of ``x`` exactly
            (it then covers the trailing dims).
        eps: added to the standard deviation, a finite real number ``>= 0``.

    Returns:
        ``[N, Lp, *F]`` float.

    Example:
        >>> x = torch.tensor([[1.0, 3.0, 0.0]])
        >>> masked_normalize(x, torch.tensor([[True, True, False]]))
        tensor([[-1.,  1.,  0.]])
    """
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not 0 <= eps < math.inf:
        raise ValueError(f"eps must be a finite real number >= 0, got {eps!r}")
    full = _expand_mask(x, mask)
    # in float64: the mean of real steps that are all equal is then their value exactly
    # (float32 sums left it off by a rounding error, which the division by a deviation of
    # the same size blew up to about 0.75 at every step)
    values = x.float() if x.device.type == "mps" else x.double()  # MPS has no float64
    count = full.sum().clamp(min=1)
    mean = torch.where(full, values, 0.0).sum() / count
    # one corrective pass: float64 input has no wider type to sum in
    mean = mean + torch.where(full, values - mean, 0.0).sum() / count
    centred = torch.where(full, values - mean, 0.0)
    # population variance over real steps; a single real step leaves x - mean = 0. Where it
    # is 0 the square root's gradient is inf (times 0: NaN), so it is taken of 1 there
    variance = centred.square().sum() / count
    spread = variance > 0
    std = torch.where(spread, torch.where(spread, variance, 1.0).sqrt(), 0.0)
    # no spread and eps = 0: every position's centred value is 0, and so is the result
    # (0 / 0 gave NaN, padding included)
    denominator = std + eps
    return (centred / torch.where(denominator > 0, denominator, 1.0)).to(x.dtype)
