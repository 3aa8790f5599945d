"""Unit tests of rppo_td/functional/_minibatch.py (the balance bound is a property test)."""

from __future__ import annotations

import re

import pytest
import torch

from rppo_td.functional import balanced_minibatches


def test_docstring_case_balances_steps():
    lengths = torch.tensor([8, 1, 1, 8, 1, 1])
    groups = balanced_minibatches(lengths, 2, generator=torch.Generator().manual_seed(0))
    assert [int(lengths[g].sum()) for g in groups] == [10, 10]


def test_same_generator_state_same_groups():
    lengths = torch.randint(1, 9, (20,), generator=torch.Generator().manual_seed(1))
    first = balanced_minibatches(lengths, 4, generator=torch.Generator().manual_seed(7))
    second = balanced_minibatches(lengths, 4, generator=torch.Generator().manual_seed(7))
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    other = balanced_minibatches(lengths, 4, generator=torch.Generator().manual_seed(8))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


@pytest.mark.parametrize("balance", ["steps", "sequences"])
def test_as_many_minibatches_as_sequences(balance):
    # one long sequence among short ones: still one non-empty group per sequence
    lengths = torch.tensor([30, 1, 1, 1])
    groups = balanced_minibatches(lengths, 4, generator=torch.Generator(), balance=balance)
    assert sorted(len(g) for g in groups) == [1, 1, 1, 1]
    assert sorted(torch.cat(groups).tolist()) == [0, 1, 2, 3]


def test_one_minibatch_is_the_permutation():
    groups = balanced_minibatches(torch.tensor([3, 1, 2]), 1, generator=torch.Generator())
    assert len(groups) == 1 and sorted(groups[0].tolist()) == [0, 1, 2]
    assert groups[0].dtype == torch.int64


@pytest.mark.parametrize(
    ("num", "message"),
    [
        (4, "num_minibatches must be in [1, 3] (the number of sequences), got 4"),
        (0, "num_minibatches must be in [1, 3] (the number of sequences), got 0"),
        (True, "num_minibatches must be an int, got True"),
        (1.5, "num_minibatches must be an int, got 1.5"),
    ],
)
def test_bad_minibatch_counts(num, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        balanced_minibatches(torch.tensor([1, 2, 3]), num)


def test_bad_lengths_and_balance():
    with pytest.raises(ValueError, match=re.escape("lengths must have shape [N], got [2, 2]")):
        balanced_minibatches(torch.ones(2, 2, dtype=torch.int64), 1)
    with pytest.raises(ValueError, match="balance must be 'steps' or 'sequences', got 'time'"):
        balanced_minibatches(torch.tensor([1, 2]), 1, balance="time")
