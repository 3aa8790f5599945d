"""Unit tests of rppo_td/functional/_padding.py."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

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


@given(
    dtype=st.sampled_from([torch.uint8, torch.bool, torch.int16, torch.float16, torch.float32]),
    rows=st.integers(1, 12),
    width=st.integers(-1, 40),
    offset=st.integers(0, 5),
    data=st.data(),
)
@settings(max_examples=60, deadline=None)
def test_zero_rows_through_wide_views_equals_a_plain_fill(dtype, rows, width, offset, data):
    """Padding rows are zeroed exactly, whatever the row's byte width and storage offset.

    ``width`` 0 stands for 1-D rows ``[R]``, -1 for rows of no feature ``[R, 0]``.
    """
    from rppo_td.functional._padding import _zero_rows

    flat = torch.randint(1, 100, (offset + rows * max(width, 1),)).to(dtype)
    if width < 0:  # rows of no feature: [R, 0]
        x = flat[:0].view(rows, 0) if rows == 0 else torch.empty(rows, 0, dtype=dtype)
    elif width:
        x = flat[offset : offset + rows * width].view(rows, width)
    else:
        x = flat[offset:][:rows]
    positions = torch.tensor(
        sorted(data.draw(st.sets(st.integers(0, rows - 1), max_size=rows))), dtype=torch.int64
    )
    expected, before = x.clone(), flat.clone()
    expected[positions] = 0
    _zero_rows(x, positions)
    assert torch.equal(x, expected)
    used = x.numel()
    # the storage around the rows is untouched
    assert torch.equal(flat[:offset], before[:offset])
    assert torch.equal(flat[offset + used :], before[offset + used :])
