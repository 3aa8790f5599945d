"""Right-padding and unpadding of per-step tensors by gather and scatter."""

from __future__ import annotations

import math

import torch

__all__ = ["pad_sequences", "padding_positions", "unpad_sequences"]


def padding_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """Flat positions of the padding in ``[N, Lp]``.

    Args:
        loss_mask: ``[N, Lp]`` bool.

    Returns:
        ``[P]`` int64, indices into ``N * Lp``.

    Example:
        >>> padding_positions(torch.tensor([[True, True], [True, False]]))
        tensor([3])
    """
    return (~loss_mask).flatten().nonzero().squeeze(1)


def pad_sequences(
    x: torch.Tensor,
    flat_index: torch.Tensor,
    pad_positions: torch.Tensor,
    *,
    batch_dims: int = 2,
) -> torch.Tensor:
    """Regroups per-step values into right-padded sequences, padding with zeros.

    One ``index_select`` (a gather, which needs no zero-filled output) and a zero fill of the
    padding rows only.

    Args:
        x: ``[W, T, *F]`` any dtype (``batch_dims`` leading dims are flattened to steps).
        flat_index: ``[B, Lp]`` int64, positions in the flattened steps (``sequence_layout``).
        pad_positions: ``[P]`` int64, flat padding positions in ``B * Lp``
            (``padding_positions``).
        batch_dims: how many leading dims of ``x`` index steps.

    Returns:
        ``[B, Lp, *F]``, the dtype of ``x``; zero where padded.

    Example:
        >>> from rppo_td.functional import chunk_episodes, sequence_layout
        >>> sid, off = chunk_episodes(torch.tensor([[True, False, True]]), None)
        >>> idx, mask = sequence_layout(sid, off)
        >>> pad_sequences(torch.tensor([[1, 2, 3]]), idx, padding_positions(mask))
        tensor([[1, 2],
                [3, 0]])
    """
    return pad_rows(x, flat_index.flatten(), pad_positions, flat_index.shape, batch_dims)


def pad_rows(
    x: torch.Tensor,
    flat_index: torch.Tensor,
    pad_positions: torch.Tensor,
    shape: torch.Size,
    batch_dims: int = 2,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``pad_sequences`` with the index already flat (``[B * Lp]``) and its shape given.

    The per-leaf inner step of ``SequenceLayout.gather``, which flattens the index once for
    all leaves. ``out``, when given, is a contiguous ``[B, Lp, *F]`` tensor of ``x``'s dtype
    written in place (no allocation).
    """
    feature = x.shape[batch_dims:]
    # one row per step with the features flattened (1-D for a single feature): index_select
    # takes its cheapest path on 1-D and 2-D contiguous tensors
    width = math.prod(feature)
    if width == 1:
        steps = x.reshape(-1)
    elif width > 1:
        steps = x.reshape(-1, width)
    else:
        steps = x.reshape(-1, *feature)
    if out is None:
        rows = steps.index_select(0, flat_index)
    else:
        rows = torch.index_select(steps, 0, flat_index, out=out.view(-1, *steps.shape[1:]))
    if pad_positions.numel():
        rows.index_fill_(0, pad_positions, 0)
    return rows.view(*shape, *feature)


def unpad_sequences(
    padded: torch.Tensor,
    flat_destination: torch.Tensor,
    real_positions: torch.Tensor,
    num_steps: int,
) -> torch.Tensor:
    """Scatters the real steps of padded sequences back to flat rollout order.

    Args:
        padded: ``[N, Lp, *F]`` any dtype.
        flat_destination: ``[R]`` int64, the flat rollout position (``w * T + t``) of each real
            step, in the order of ``real_positions``.
        real_positions: ``[R]`` int64, flat positions of the real steps in ``N * Lp``.
        num_steps: ``W * T``; must equal ``R`` for an exact inverse.

    Returns:
        ``[W * T, *F]``, the dtype of ``padded``.

    Example:
        >>> from rppo_td.functional import chunk_episodes, sequence_layout
        >>> sid, off = chunk_episodes(torch.tensor([[True, False, True]]), None)
        >>> idx, mask = sequence_layout(sid, off)
        >>> padded = pad_sequences(torch.tensor([[1, 2, 3]]), idx, padding_positions(mask))
        >>> real = mask.flatten().nonzero().squeeze(1)
        >>> unpad_sequences(padded, idx.flatten()[real], real, 3)
        tensor([1, 2, 3])
    """
    feature = padded.shape[2:]
    real = padded.reshape(-1, *feature).index_select(0, real_positions)
    out = real.new_empty((num_steps, *feature))
    return out.index_copy_(0, flat_destination, real)
