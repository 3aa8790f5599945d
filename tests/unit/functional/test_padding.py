"""Unit tests of rppo_td/functional/_padding.py."""

from __future__ import annotations

import torch

from rppo_td.functional import pad_sequences, padding_positions, unpad_sequences


def test_padding_positions():
    mask = torch.tensor([[True, True, False], [True, False, False]])
    assert padding_positions(mask).tolist() == [2, 4, 5]


def test_pad_golden_with_features_and_dtypes():
    # rollout [1, 4] with features [2]; sequences: steps (0, 1), (2), (3)
    flat_index = torch.tensor([[0, 1], [2, 0], [3, 0]])
    mask = torch.tensor([[True, True], [True, False], [True, False]])
    pads = padding_positions(mask)
    x = torch.arange(1, 9, dtype=torch.uint8).view(1, 4, 2)
    padded = pad_sequences(x, flat_index, pads)
    assert padded.dtype == torch.uint8
    assert padded.tolist() == [[[1, 2], [3, 4]], [[5, 6], [0, 0]], [[7, 8], [0, 0]]]
    # the input is untouched
    assert x.flatten().tolist() == list(range(1, 9))


def test_pad_without_padding():
    flat_index = torch.tensor([[1, 0]])
    out = pad_sequences(torch.tensor([[5.0, 6.0]]), flat_index, torch.zeros(0, dtype=torch.int64))
    assert out.tolist() == [[6.0, 5.0]]


def test_unpad_golden():
    padded = torch.tensor([[10, 11], [12, 0], [13, 0]])
    real = torch.tensor([0, 1, 2, 4])
    # real steps go back to flat rollout positions 2, 3, 0, 1
    out = unpad_sequences(padded, torch.tensor([2, 3, 0, 1]), real, 4)
    assert out.tolist() == [12, 13, 10, 11]
