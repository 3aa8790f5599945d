"""Unit tests of rppo_td/_validation.py: every message names the key, expected and actual."""

from __future__ import annotations

import re

import pytest
import torch
from tensordict import TensorDict

from rppo_td._validation import (
    check_dtype,
    check_finite,
    check_floating,
    check_shape,
    get_key,
    rollout_shape,
)


def test_get_key_missing_names_the_key_and_what_is_there():
    td = TensorDict({"a": torch.zeros(2), "n": {"b": torch.zeros(2)}}, batch_size=[2])
    with pytest.raises(KeyError) as info:
        get_key(td, ("n", "c"), hint="Try harder.")
    # KeyError's str() is the repr of its message: read the message itself
    message = info.value.args[0]
    assert message.startswith("key ('n', 'c') is missing from the tensordict (has ")
    assert "('n', 'b')" in message and message.endswith("Try harder.")
    assert torch.equal(get_key(td, ("n", "b")), torch.zeros(2))


def test_get_key_rejects_non_tensor_leaf():
    td = TensorDict(batch_size=[2])
    td.set_non_tensor("info", "text")
    with pytest.raises(ValueError, match="key 'info' must hold a tensor, got NonTensorData"):
        get_key(td, "info")


def test_rollout_shape():
    assert rollout_shape(TensorDict(batch_size=[3, 4]), "X") == (3, 4)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "X expects a rollout with batch dims [W, T] (worker, time), got batch size [4]"
        ),
    ):
        rollout_shape(TensorDict(batch_size=[4]), "X")


def test_check_shape_never_broadcasts():
    check_shape("x", torch.zeros(2, 3, 1), (2, 3, 1))
    with pytest.raises(
        ValueError, match=re.escape("('next', 'reward') must have shape [2, 3, 1], got [2, 3]")
    ):
        check_shape(("next", "reward"), torch.zeros(2, 3), (2, 3, 1))
    with pytest.raises(ValueError, match=re.escape("'x' must have shape [2, 3], got [1, 3]")):
        check_shape("x", torch.zeros(1, 3), (2, 3))


def test_dtype_checks():
    with pytest.raises(
        ValueError, match=re.escape("'done' must have dtype torch.bool, got torch.uint8")
    ):
        check_dtype("done", torch.zeros(1, dtype=torch.uint8), torch.bool)
    with pytest.raises(
        ValueError, match=re.escape("'reward' must be a floating-point tensor, got torch.int64")
    ):
        check_floating("reward", torch.zeros(1, dtype=torch.int64))
    check_floating("reward", torch.zeros(1, dtype=torch.float16))


def test_check_finite():
    check_finite({})
    check_finite({"a": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"^'b', 'c' must be finite, found NaN or inf$"):
        check_finite(
            {
                "a": torch.zeros(3),
                "b": torch.tensor([float("nan")]),
                "c": torch.tensor([float("-inf")]),
            }
        )
