"""Unit tests of rppo_td/_validation.py: every message names the key, expected and actual."""

from __future__ import annotations

import math
import re

import pytest
import torch
from tensordict import TensorDict

from rppo_td._validation import (
    check_device,
    check_dtype,
    check_finite,
    check_floating,
    check_generator,
    check_key_list,
    check_not_meta,
    check_not_padded,
    check_shape,
    check_tensors,
    check_time_dim,
    check_unit_interval,
    check_values,
    done_consistent,
    get_key,
    implies,
    none_true,
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
    # the hint fits the shape: a flattened [W * T] is reshaped, never unsqueezed (which would
    # join the workers' rows into one), and [C, W, T] keeps time last
    with pytest.raises(ValueError, match=re.escape("td.reshape(W, T), never unsqueeze(0)")):
        rollout_shape(TensorDict(batch_size=[60]), "X")
    with pytest.raises(ValueError, match=re.escape("[C, W, T]: td.reshape(-1, T)")):
        rollout_shape(TensorDict(batch_size=[2, 3, 4]), "X")


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


def test_check_values_one_read_then_names_the_culprit():
    ok = torch.tensor(True)
    check_values({"a": torch.zeros(3)}, [(ok, "never")])
    check_values({}, [])
    with pytest.raises(ValueError, match=r"^second$"):
        check_values({"a": torch.zeros(3)}, [(ok, "first"), (torch.tensor(False), "second")])
    # a NaN is reported before a failed condition, and a lazy message is called on failure only
    calls = []

    def lazy():
        calls.append(1)
        return "lazy"

    with pytest.raises(ValueError, match=r"^'a' must be finite"):
        check_values({"a": torch.tensor([math.nan])}, [(torch.tensor(False), lazy)])
    assert calls == []
    with pytest.raises(ValueError, match=r"^lazy$"):
        check_values({}, [(torch.tensor(False), lazy)])
    # finite values whose float64 sum overflows are not refused
    big = torch.full((2,), torch.finfo(torch.float64).max, dtype=torch.float64)
    check_values({"big": big})


def test_none_true_and_implies():
    assert bool(none_true(torch.zeros(0, dtype=torch.bool)))
    assert bool(none_true(torch.zeros(3, 2, dtype=torch.bool)))
    assert not bool(none_true(torch.tensor([[False, True]])[:, 1:]))
    a = torch.tensor([True, False, True])
    condition, message = implies("a", a, "b", torch.tensor([True, True, False]))
    assert not bool(condition)
    assert message() == (
        "'a' is True where 'b' is False (at 1 step, the first at index [2]); 'a' must imply 'b'"
    )


def test_done_consistent():
    term = torch.tensor([True, False, False])
    trunc = torch.tensor([False, True, False])
    done = term | trunc
    for flags in [(("t", term), ("u", trunc)), (("t", term), None), (None, ("u", trunc))]:
        conditions = done_consistent(("d", done), *flags)
        assert all(bool(c) for c, _ in conditions)
    extra = done.clone()
    extra[2] = True
    ((condition, message),) = done_consistent(("d", extra), ("t", term), ("u", trunc))
    assert not bool(condition)
    assert message().startswith("'d' is True where neither 't' nor 'u' is (at 1 step")
    # with one flag only, done may hold other ends
    assert bool(done_consistent(("d", extra), ("t", term), None)[0][0])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (1.01, "gamma must be in [0, 1], got 1.01"),
        (math.nan, "gamma must be in [0, 1], got nan"),
        ("0.5", "gamma must be a real number in [0, 1], got '0.5' (str)"),
        (True, "gamma must be a real number in [0, 1], got True (bool)"),
        (None, "gamma must be a real number in [0, 1], got None (NoneType)"),
    ],
)
def test_check_unit_interval(value, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        check_unit_interval("gamma", value)


def test_check_unit_interval_accepts_real_numbers():
    import numpy as np

    for value in (0, 1, 0.5, np.float32(0.25), np.float64(1.0)):
        check_unit_interval("gamma", value)


def test_check_time_dim():
    assert check_time_dim(-2, 3) == 1
    assert check_time_dim(2, 3) == 2
    assert check_time_dim(-3, 3, last_allowed=False) == 0
    with pytest.raises(ValueError, match=re.escape("time_dim=3 is out of range for 3 dims")):
        check_time_dim(3, 3)
    with pytest.raises(ValueError, match="a trailing 1, is a feature dim"):
        check_time_dim(-1, 3, last_allowed=False)
    with pytest.raises(ValueError, match="time_dim must be an int, got True"):
        check_time_dim(True, 3)


def test_argument_kinds():
    with pytest.raises(TypeError, match="keys must be a sequence of keys"):
        check_key_list("keys", "observation")
    with pytest.raises(TypeError, match="keys must be a sequence of keys"):
        check_key_list("keys", 3)
    assert check_key_list("keys", ("a", ("b", "c"))) == ["a", ("b", "c")]
    with pytest.raises(
        TypeError, match=re.escape("generator must be a torch.Generator or None, got int")
    ):
        check_generator(0)
    with pytest.raises(TypeError, match=re.escape("x must be a torch.Tensor, got list")):
        check_tensors({"x": [1.0]})
    with pytest.raises(ValueError, match=re.escape("'b' is on meta, but 'a' is on cpu")):
        check_device({"a": torch.zeros(1), "b": torch.zeros(1, device="meta")})
    with pytest.raises(ValueError, match=re.escape("'m' is a meta tensor")):
        check_not_meta({"m": torch.zeros(1, device="meta")})
    td = TensorDict({"loss_mask": torch.ones(2, 3, dtype=torch.bool)}, batch_size=[2, 3])
    with pytest.raises(ValueError, match="X got a tensordict that already holds 'loss_mask'"):
        check_not_padded(td, "loss_mask", "X")


def test_first_line_of_an_error():
    from rppo_td._validation import first_line

    err = RuntimeError("  Could not run op. It is only there for: CPU, CUDA.\nand more\n")
    assert first_line(err) == "Could not run op. It is only there for: CPU, CUDA."
    assert first_line(err, sentence=True) == "Could not run op"
    assert first_line(err, limit=9) == "Could not"
    # an empty message (two callers once indexed an empty splitlines() here)
    assert first_line(RuntimeError()) == first_line(RuntimeError("  \n")) == "RuntimeError"
    # a heading is followed by its first item: torch's load_state_dict error said only
    # "Error(s) in loading state_dict for Linear:", naming no key
    linear = torch.nn.Linear(2, 3)
    with pytest.raises(RuntimeError) as caught:
        linear.load_state_dict({"weight": torch.zeros(4, 2), "bias": torch.zeros(3)})
    assert first_line(caught.value).startswith(
        "Error(s) in loading state_dict for Linear: size mismatch for weight:"
    )
