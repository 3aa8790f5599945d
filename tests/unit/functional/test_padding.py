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


@given(
    workers=st.integers(1, 4),
    steps=st.integers(1, 12),
    length=st.one_of(st.none(), st.integers(1, 6)),
    extra=st.integers(0, 3),
    dtype=st.sampled_from([torch.bool, torch.uint8, torch.int64, torch.float32]),
    feature=st.sampled_from([(), (1,), (3,), (2, 2)]),
    offset=st.integers(0, 3),
    into_out=st.booleans(),
    data=st.data(),
)
@settings(max_examples=150, deadline=None)
def test_runs_gather_equals_the_row_gather(
    workers, steps, length, extra, dtype, feature, offset, into_out, data
):
    """``pad_rows(runs=sequence_runs(...))`` gives the row gather's padded values exactly.

    Any rows of the layout, in any order, widened by ``extra`` padding columns (so runs near
    the rollout's end pass its last step and are moved), leaves at a storage offset, into
    ``out`` or fresh memory.
    """
    from rppo_td.functional import chunk_episodes, pad_rows, sequence_layout, sequence_runs

    start = torch.tensor(
        data.draw(st.lists(st.booleans(), min_size=workers * steps, max_size=workers * steps))
    ).view(workers, steps)
    start[:, 0] = True
    flat_index, mask = sequence_layout(*chunk_episodes(start, length))
    flat_index = torch.nn.functional.pad(flat_index, (0, extra))
    mask = torch.nn.functional.pad(mask, (0, extra))
    rows = data.draw(st.permutations(range(flat_index.shape[0])))
    rows = torch.tensor(rows[: data.draw(st.integers(0, len(rows)))], dtype=torch.int64)
    flat_index, mask = flat_index[rows], mask[rows]
    size = workers * steps * max(1, torch.Size(feature).numel())
    storage = torch.randint(1, 100, (offset + size,)).to(dtype)
    x = storage[offset:].view(workers, steps, *feature)
    pads = padding_positions(mask)
    shape = flat_index.shape
    expected = pad_rows(x, flat_index.flatten(), pads, shape)
    runs = sequence_runs(flat_index, mask, workers * steps)
    if shape[1] < 2 or workers * steps < shape[1]:
        assert runs is None
        return
    out = torch.full((*shape, *feature), 7).to(dtype) if into_out else None
    got = pad_rows(x, flat_index.flatten(), pads, shape, out=out, runs=runs)
    assert got.shape == expected.shape
    assert torch.equal(got, expected)
    if into_out:
        assert got.data_ptr() == out.data_ptr()
    # the moved runs are exactly those that would pass the last step
    starts, moved_positions, _ = runs
    assert bool((starts + shape[1] <= workers * steps).all())
    passing = (flat_index[:, :1] + shape[1] > workers * steps) & mask
    assert sorted(moved_positions.tolist()) == passing.flatten().nonzero().flatten().tolist()


def test_dtypes_without_torch_gather_kernels_are_moved_as_their_bytes():
    # uint16/32/64 and float8 raised torch's NotImplementedError ("index_select" or
    # "index_fill_cpu" not implemented), though the docstring says any dtype
    import pytest

    from rppo_td.functional import chunk_episodes, sequence_layout

    sid, off = chunk_episodes(torch.tensor([[True, False, True, False, False]]), 2)
    idx, mask = sequence_layout(sid, off)
    pads = padding_positions(mask)
    real = mask.flatten().nonzero().squeeze(1)
    names = ["uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2"]
    dtypes = [getattr(torch, name) for name in names if hasattr(torch, name)]
    if not dtypes:
        pytest.skip("this torch has none of these dtypes")
    for dtype in dtypes:
        for feature in ((), (3,)):
            n = 5 * (feature[0] if feature else 1)
            x = torch.arange(1, n + 1).view(1, 5, *feature).to(torch.float32).to(dtype)
            padded = pad_sequences(x, idx, pads)
            assert padded.dtype == dtype
            as_float = padded.to(torch.float32)
            assert torch.equal(as_float[mask], x.to(torch.float32)[0][idx[mask]])
            assert as_float[~mask].eq(0).all()
            back = unpad_sequences(padded, idx.flatten()[real], real, 5)
            assert back.dtype == dtype
            assert torch.equal(back.to(torch.float32), x.to(torch.float32).view(5, *feature))


def test_unpad_keeps_the_graph():
    # moving odd dtypes as their bytes (view(dtype)) must not cut float inputs from autograd
    from rppo_td.functional import chunk_episodes, sequence_layout

    sid, off = chunk_episodes(torch.tensor([[True, False, True]]), None)
    idx, mask = sequence_layout(sid, off)
    x = torch.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    padded = pad_sequences(x, idx, padding_positions(mask))
    real = mask.flatten().nonzero().squeeze(1)
    back = unpad_sequences(padded, idx.flatten()[real], real, 3)
    (back * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    assert x.grad.tolist() == [[1.0, 2.0, 3.0]]
