"""Reductions over real steps only: padding never enters a mean or a variance."""

from __future__ import annotations

import torch

__all__ = ["masked_mean", "masked_normalize"]


def _expand_mask(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    if x.shape[: mask.ndim] != mask.shape:
        raise ValueError(
            f"mask of shape {list(mask.shape)} must match the leading dims of x, "
            f"got x of shape {list(x.shape)}"
        )
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must have dtype torch.bool, got {mask.dtype}")
    return mask.view(*mask.shape, *([1] * (x.ndim - mask.ndim))).expand_as(x)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` over the positions where ``mask`` is True.

    Args:
        x: ``[N, Lp, *F]`` float.
        mask: ``[N, Lp]`` bool (``loss_mask``); at least one True.

    Returns:
        A scalar tensor.

    Example:
        >>> masked_mean(torch.tensor([[1.0, 3.0, 0.0]]), torch.tensor([[True, True, False]]))
        tensor(2.)
    """
    full = _expand_mask(x, mask)
    return torch.where(full, x, 0.0).sum() / full.sum().clamp(min=1)


def masked_normalize(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Standardises ``x`` with the mean and standard deviation of its real steps.

    Padding positions are returned as zero. Normalising over padded zeros would bias both
    statistics towards zero, the more so the more padding a batch holds.

    Args:
        x: ``[N, Lp, *F]`` float, e.g. ``advantage`` ``[N, Lp, 1]``.
        mask: ``[N, Lp]`` bool.
        eps: added to the standard deviation.

    Returns:
        ``[N, Lp, *F]`` float.

    Example:
        >>> x = torch.tensor([[1.0, 3.0, 0.0]])
        >>> masked_normalize(x, torch.tensor([[True, True, False]]))
        tensor([[-1.,  1.,  0.]])
    """
    full = _expand_mask(x, mask)
    count = full.sum().clamp(min=1)
    mean = torch.where(full, x, 0.0).sum() / count
    centred = torch.where(full, x - mean, 0.0)
    # population variance over real steps; a single real step leaves x - mean = 0
    std = (centred.square().sum() / count).sqrt()
    return centred / (std + eps)
