"""The library refuses what it cannot handle (issue 8): one regression test per case.

Every case here used to give a silent wrong result or a traceback from torch internals that
named neither key nor argument. Each test checks the error type and that the message names the
key or argument (and, where it helps, the expected and actual value); empty inputs check the
documented empty result instead.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rppo_td import (
    GAE,
    DeviceMover,
    EpisodeSplitter,
    RolloutKeys,
    SequenceChunker,
    SequenceLayout,
    SequencePadder,
    SequenceReplaySampler,
    SequenceSampler,
)
from rppo_td import functional as F
from tests.unit._data import small_rollout


def _message(info: pytest.ExceptionInfo) -> str:
    """The message itself (a KeyError's str() is its repr)."""
    return info.value.args[0]


def _chunked(length: int = 2, td: TensorDict | None = None) -> TensorDict:
    td = small_rollout() if td is None else td
    return SequenceChunker(sequence_length=length)(EpisodeSplitter()(td))


def _gae_inputs(num_workers: int = 2, num_steps: int = 5) -> dict[str, torch.Tensor]:
    shape = (num_workers, num_steps, 1)
    return {
        "reward": torch.ones(shape),
        "state_value": torch.zeros(shape),
        "next_state_value": torch.zeros(shape),
        "terminated": torch.zeros(shape, dtype=torch.bool),
        "done": torch.zeros(shape, dtype=torch.bool),
    }


def _gae(**inputs):
    return F.generalized_advantage_estimate(**inputs, gamma=0.9, lmbda=0.9)


# ---- 1. terminated / truncated where done is False ------------------------------------------
def test_functional_gae_refuses_terminated_without_done():
    # before: the sum ran across the episode end and bootstrapped nothing
    inputs = _gae_inputs()
    inputs["terminated"][0, 1] = True
    with pytest.raises(
        ValueError,
        match=re.escape(
            "'terminated' is True where 'done' is False (at 1 step, the first at index "
            "[0, 1, 0]); 'terminated' must imply 'done'"
        ),
    ):
        _gae(**inputs)


@pytest.mark.parametrize("flag", ["terminated", "truncated"])
def test_gae_transform_refuses_a_flag_without_done(flag):
    td = small_rollout()
    td["next", flag][1, 2] = True  # worker 1 never ends: done is False there
    with pytest.raises(ValueError) as info:
        GAE(gamma=0.9, lmbda=0.9)(td)
    assert _message(info).startswith(
        f"('next', {flag!r}) is True where ('next', 'done') is False (at 1 step, the first at "
        "index [1, 2, 0])"
    )
    assert "advantage" not in td


def test_gae_transform_refuses_done_without_a_flag_when_truncated_is_present():
    td = small_rollout()
    td["next", "done"][1, 2] = True
    with pytest.raises(ValueError) as info:
        GAE(gamma=0.9, lmbda=0.9)(td)
    assert _message(info).startswith(
        "('next', 'done') is True where neither ('next', 'terminated') nor "
        "('next', 'truncated') is (at 1 step, the first at index [1, 2, 0])"
    )


@pytest.mark.parametrize("flag", ["terminated", "truncated"])
def test_splitter_refuses_a_flag_without_done(flag):
    # before: the splitter read done only and split where GAE did not
    td = small_rollout()
    td["next", flag][1, 2] = True
    with pytest.raises(ValueError) as info:
        EpisodeSplitter()(td)
    assert _message(info).startswith(
        f"('next', {flag!r}) is True where ('next', 'done') is False (at 1 step, the first at "
        "index [1, 2])"
    )
    assert "episode_id" not in td


def test_splitter_with_terminated_only_needs_it_to_imply_done():
    td = small_rollout().exclude(("next", "truncated"))
    EpisodeSplitter()(td.clone())  # done holds the truncation too: fine
    td["next", "terminated"][1, 4] = True
    with pytest.raises(ValueError, match=re.escape("('next', 'terminated') is True where")):
        EpisodeSplitter()(td)


# ---- 2. padded sequences where a [W, T] rollout is expected ---------------------------------
@pytest.mark.parametrize(
    ("make", "who"),
    [
        (lambda: GAE(gamma=0.9, lmbda=0.9), "GAE"),
        (lambda: EpisodeSplitter(), "EpisodeSplitter"),
        (lambda: SequenceChunker(sequence_length=2), "SequenceChunker"),
    ],
)
def test_rollout_transforms_refuse_padded_sequences(make, who):
    # before: GAE cut at every sequence end (advantages depending on L), the splitter and
    # chunker numbered padding
    padded = SequencePadder()(_chunked(2, GAE(gamma=0.9, lmbda=0.9)(small_rollout())))
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"{who} got a tensordict that already holds 'loss_mask': it is padded already "
            f"([N, Lp] sequences); {who} works on [W, T] rollouts"
        ),
    ):
        make()(padded)


# ---- 3. a rollout that holds the padder's own keys ------------------------------------------
@pytest.mark.parametrize("field", ["worker_index", "time_index", "rollout_steps"])
def test_padder_and_lazy_sampler_refuse_rollouts_holding_their_keys(field):
    # before: the padder overwrote the key, and inv then dropped it
    td = _chunked()
    td[field] = torch.full((2, 5), 7)
    for who, run in (
        ("SequencePadder", lambda: SequencePadder()(td)),
        ("SequenceSampler", lambda: list(SequenceSampler(2)(td))),
    ):
        with pytest.raises(ValueError) as info:
            run()
        assert _message(info) == (
            f"{who} got a rollout that already holds {field!r}, a key it writes "
            f"(RolloutKeys.{field}): exclude it first (td.exclude({field!r})) or give {who} "
            f"another name for it, keys=RolloutKeys({field}=...)"
        )
    # the suggested rename works and the round trip keeps the rollout's own key
    keys = RolloutKeys(**{field: "padder_" + field})
    padded = SequencePadder(keys=keys)(td)
    back = SequencePadder(keys=keys).inv(padded)
    assert torch.equal(back[field], td[field])


# ---- 4. SequencePadder.inv on anything but all sequences of one rollout ---------------------
def test_inv_refuses_the_sequences_of_all_but_the_last_worker():
    # before: they formed a valid [1, 5] rectangle and came back as a smaller rollout
    padded = SequencePadder()(_chunked())
    first_worker = padded["worker_index"][:, 0] == 0
    with pytest.raises(
        ValueError,
        match=re.escape(
            "they were padded from a rollout of 10 steps ('rollout_steps'), and these hold 5 "
            "real steps over 5 distinct (worker, time) pairs within [1, 5]"
        ),
    ):
        SequencePadder().inv(padded[first_worker])


def test_inv_refuses_sequences_cut_in_time():
    # before: a [1, 4] sequence cut to its first two positions came back as a [1, 2] rollout
    td = TensorDict(
        {"x": torch.arange(4.0).view(1, 4), "next": {"done": torch.zeros(1, 4, 1).bool()}},
        batch_size=[1, 4],
    )
    padded = SequencePadder()(_chunked(4, td))
    with pytest.raises(ValueError, match="padded from a rollout of 4 steps"):
        SequencePadder().inv(padded[:, :2])


def test_inv_refuses_sequences_of_two_rollouts():
    padded = SequencePadder()(_chunked())
    other = SequencePadder()(_chunked(2, small_rollout(num_workers=3)))
    with pytest.raises(
        ValueError,
        match=re.escape(
            "these come from rollouts of different sizes ('rollout_steps' holds 10 and 15 steps)"
        ),
    ):
        SequencePadder().inv(torch.cat([padded[:3], other[3:6]]))


def test_inv_accepts_all_sequences_shuffled_concatenated_and_stored():
    td = _chunked()
    padded = SequencePadder()(td)
    shuffled = padded[torch.randperm(padded.batch_size[0], generator=torch.Generator())]
    assert (SequencePadder().inv(shuffled) == td).all()
    assert (SequencePadder().inv(torch.cat([padded[3:], padded[:3]])) == td).all()
    buffer = ReplayBuffer(storage=LazyTensorStorage(padded.batch_size[0]))
    buffer.extend(padded)
    assert (SequencePadder().inv(buffer.storage[:]) == td).all()
    minibatches = list(SequenceSampler(2, generator=torch.Generator())(padded))
    assert (SequencePadder().inv(torch.cat(minibatches)) == td).all()
    with pytest.raises(ValueError, match="needs all the sequences of one rollout"):
        SequencePadder().inv(minibatches[0])


def test_inv_needs_rollout_steps_and_sound_indices():
    padded = SequencePadder()(_chunked())
    with pytest.raises(KeyError) as info:
        SequencePadder().inv(padded.exclude("rollout_steps"))
    assert _message(info).startswith("key 'rollout_steps' is missing")
    assert "inv needs it to check that it has all the sequences of one rollout" in _message(info)
    bad = padded.clone()
    bad["worker_index"][0, 0] = -1  # before: bincount's RuntimeError
    with pytest.raises(
        ValueError, match=re.escape("'worker_index' and 'time_index' must be >= 0 on real steps")
    ):
        SequencePadder().inv(bad)
    bad = padded.clone()
    bad["loss_mask"][2, 1] = True  # a padding position marked real: not a prefix any more
    bad["loss_mask"][2, 0] = False
    with pytest.raises(ValueError, match=re.escape("'loss_mask' must be a True prefix")):
        SequencePadder().inv(bad)
    bad = padded.clone()
    bad["loss_mask"][2, 1] = True  # still a prefix, but the position is padding
    with pytest.raises(
        ValueError, match=re.escape("'loss_mask' is True where 'rollout_steps' is 0")
    ):
        SequencePadder().inv(bad)
    with pytest.raises(ValueError, match="without a real step"):
        SequencePadder().inv(padded[:0])


def test_inv_refuses_non_tensor_leaves():
    # before: items() skipped them and inv dropped them silently
    padded = SequencePadder()(_chunked())
    padded.set_non_tensor("note", "x")
    with pytest.raises(ValueError, match=re.escape("key 'note' holds NonTensorData")):
        SequencePadder().inv(padded)


# ---- 5. functional argument checks -----------------------------------------------------------
@pytest.mark.parametrize("time_dim", [3, -4, 7])
def test_segment_sum_time_dim_out_of_range(time_dim):
    # before: time_dim % ndim wrapped silently (7 -> 1)
    x = torch.ones(2, 3, 1)
    with pytest.raises(ValueError, match=re.escape(f"time_dim={time_dim} is out of range")):
        F.discounted_segment_sum(x, torch.ones_like(x, dtype=torch.bool), 0.5, time_dim=time_dim)


@pytest.mark.parametrize("time_dim", [-1, 2, 3, -4, 1.0, True])
def test_gae_time_dim_must_point_at_time(time_dim):
    # before: -1 ran the recursion along the trailing 1 (every step its own segment)
    with pytest.raises(ValueError, match="time_dim"):
        F.generalized_advantage_estimate(**_gae_inputs(), gamma=1.0, lmbda=1.0, time_dim=time_dim)
    out, _ = F.generalized_advantage_estimate(**_gae_inputs(), gamma=1.0, lmbda=1.0, time_dim=1)
    assert out[0, :, 0].tolist() == [5.0, 4.0, 3.0, 2.0, 1.0]


@pytest.mark.parametrize(
    ("x", "carry_on", "decay", "message"),
    [
        (torch.ones(2, 3, 1).long(), None, 0.5, "'x' must be a floating-point tensor"),
        (None, torch.ones(2, 3, 1), 0.5, "'carry_on' must have dtype torch.bool"),
        (
            None,
            torch.ones(2, 3, dtype=torch.bool),
            0.5,
            "'carry_on' must have shape [2, 3, 1], got [2, 3]",
        ),
        (None, None, 1.5, "decay must be in [0, 1], got 1.5"),
        (None, None, -0.1, "decay must be in [0, 1], got -0.1"),
        (None, None, math.nan, "decay must be in [0, 1], got nan"),
        (None, None, "0.5", "decay must be a real number in [0, 1], got '0.5' (str)"),
        (None, None, True, "decay must be a real number in [0, 1], got True (bool)"),
        ([[1.0]], None, 0.5, "x must be a torch.Tensor, got list"),
    ],
)
def test_segment_sum_argument_checks(x, carry_on, decay, message):
    x = torch.ones(2, 3, 1) if x is None else x
    carry_on = torch.ones(2, 3, 1, dtype=torch.bool) if carry_on is None else carry_on
    error = TypeError if isinstance(x, list) else ValueError
    with pytest.raises(error, match=re.escape(message)):
        F.discounted_segment_sum(x, carry_on, decay)


def test_segment_sum_refuses_nan_that_would_spread_across_segments():
    # before: one NaN in the last segment made every output NaN (the blocked cumsum)
    x = torch.ones(1, 4, 1)
    x[0, 3] = math.nan
    keep = torch.ones(1, 4, 1, dtype=torch.bool)
    keep[0, 1] = False
    with pytest.raises(ValueError, match=re.escape("'x' must be finite, found NaN or inf")):
        F.discounted_segment_sum(x, keep, 0.5)


def test_segment_sum_keeps_gradients():
    x = torch.ones(1, 4, 1, requires_grad=True)
    y = F.discounted_segment_sum(x, torch.ones(1, 4, 1, dtype=torch.bool), 0.5)
    y.sum().backward()
    assert x.grad[0, :, 0].tolist() == [1.0, 1.5, 1.75, 1.875]


def test_unpad_refuses_a_wrong_step_count_or_destinations():
    # before: new_empty left the extra rows (or a repeated destination's row) uninitialised
    padded = torch.arange(4.0).view(2, 2)
    every = torch.arange(4)
    with pytest.raises(ValueError, match=re.escape("num_steps (6), flat_destination (4)")):
        F.unpad_sequences(padded, every, every, 6)
    with pytest.raises(
        ValueError,
        match=re.escape("flat_destination must hold every position in [0, 4) exactly once"),
    ):
        F.unpad_sequences(padded, torch.tensor([0, 0, 2, 3]), every, 4)
    with pytest.raises(ValueError, match="flat_destination must hold every position"):
        F.unpad_sequences(padded, torch.tensor([0, 1, 2, 9]), every, 4)
    with pytest.raises(ValueError, match=re.escape("real_positions must hold indices in [0, 4)")):
        F.unpad_sequences(padded, every, torch.tensor([0, 1, 2, 9]), 4)
    with pytest.raises(ValueError, match=re.escape("'real_positions' must have dtype torch.int64")):
        F.unpad_sequences(padded, every, every.int(), 4)
    with pytest.raises(ValueError, match="num_steps must be an int"):
        F.unpad_sequences(padded, every, every, 4.0)
    assert F.unpad_sequences(padded, every, every, 4).tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("fn", [F.episode_ids, lambda start: F.chunk_episodes(start, 2)])
def test_episode_numbering_refuses_a_first_column_that_is_not_a_start(fn):
    # before: ids -1, and ids running from one worker's row into the next
    with pytest.raises(ValueError, match=re.escape("start[:, 0] must be all True")):
        fn(torch.tensor([[True, False, True], [False, False, True]]))
    with pytest.raises(ValueError, match=re.escape("start must have shape [W, T], got [2, 3, 1]")):
        fn(torch.ones(2, 3, 1, dtype=torch.bool))
    with pytest.raises(
        ValueError, match=re.escape("'start' must have dtype torch.bool, got torch.int64")
    ):
        fn(torch.tensor([[1, 0, 1]]))


def test_padding_functions_check_their_arguments():
    x = torch.arange(3.0).view(1, 3)
    none = torch.zeros(0, dtype=torch.int64)
    # before: IndexError: index out of range in self
    with pytest.raises(ValueError, match=re.escape("flat_index must hold indices in [0, 3)")):
        F.pad_sequences(x, torch.tensor([[0, 5]]), none)
    with pytest.raises(ValueError, match=re.escape("pad_positions must hold indices in [0, 2)")):
        F.pad_sequences(x, torch.tensor([[0, 1]]), torch.tensor([2]))
    with pytest.raises(ValueError, match=re.escape("'flat_index' must have dtype torch.int64")):
        F.pad_sequences(x, torch.tensor([[0, 1]], dtype=torch.int32), none)
    with pytest.raises(ValueError, match=re.escape("batch_dims must be in [1, x.ndim = 2]")):
        F.pad_sequences(x, torch.tensor([[0, 1]]), none, batch_dims=0)
    with pytest.raises(ValueError, match=re.escape("flat_index must have shape [B, Lp]")):
        F.pad_sequences(x, torch.tensor([0, 1]), none)
    # before: ~ of an int mask is bitwise not: every position came out as padding
    with pytest.raises(
        ValueError, match=re.escape("'loss_mask' must have dtype torch.bool, got torch.int64")
    ):
        F.padding_positions(torch.tensor([[1, 1], [1, 0]]))


def test_gae_inputs_must_be_tensors_of_one_shape():
    inputs = _gae_inputs()
    inputs["reward"] = inputs["reward"].tolist()
    with pytest.raises(TypeError, match=re.escape("reward must be a torch.Tensor, got list")):
        _gae(**inputs)
    inputs = _gae_inputs()
    inputs["reward"] = inputs["reward"][:1]
    with pytest.raises(
        ValueError,
        match=re.escape(
            "'state_value' must have shape [1, 5, 1], got [2, 5, 1]: every GAE input has the "
            "shape of 'reward'"
        ),
    ):
        _gae(**inputs)


# ---- 6. GAE never lets gradients through its targets -----------------------------------------
@pytest.mark.parametrize("name", ["reward", "state_value", "next_state_value"])
def test_functional_gae_outputs_are_detached(name):
    inputs = _gae_inputs()
    inputs[name] = torch.randn(2, 5, 1).requires_grad_()
    advantage, target = _gae(**inputs)
    assert not advantage.requires_grad and not target.requires_grad


def test_gae_transform_outputs_are_detached():
    td = small_rollout()
    td["state_value"] = td["state_value"].requires_grad_()
    td["next", "state_value"] = td["next", "state_value"].requires_grad_()
    out = GAE(gamma=0.9, lmbda=0.9)(td)
    assert not out["advantage"].requires_grad
    assert not out["value_target"].requires_grad
    assert td["state_value"].requires_grad  # the input is left as it was


# ---- 7. empty rollouts, zero-width features, all-False masks, meta tensors, str keys ---------
@pytest.mark.parametrize("cut", [lambda td: td[:0], lambda td: td[:, :0]], ids=["W0", "T0"])
def test_empty_rollouts_get_empty_keys_or_a_clear_refusal(cut):
    td = cut(small_rollout())
    td = GAE(gamma=0.9, lmbda=0.9)(td)
    assert td["advantage"].shape == (*td.batch_size, 1)
    td = EpisodeSplitter()(td)  # before: IndexError from episode_starts at T = 0
    td = SequenceChunker(sequence_length=2)(td)
    assert td["episode_id"].shape == td["sequence_id"].shape == td.batch_size
    # before: RuntimeError "zeros: Dimension size must be non-negative"
    for who, run in (
        ("SequencePadder", lambda: SequencePadder()(td)),
        ("SequenceSampler", lambda: list(SequenceSampler(1)(td))),
    ):
        with pytest.raises(ValueError, match=f"{who} got an empty rollout"):
            run()
    flat_index, mask = F.sequence_layout(td["sequence_id"], td["sequence_offset"])
    assert flat_index.shape == mask.shape == (0, 0)


def test_zero_width_features_round_trip():
    # before: reshape(-1, 0) is ambiguous: RuntimeError in the padder and the lazy sampler
    td = _chunked()
    td["empty"] = torch.zeros(2, 5, 0)
    td["empty_image"] = torch.zeros(2, 5, 3, 0, 2, dtype=torch.uint8)
    padded = SequencePadder()(td)
    assert padded["empty_image"].shape == (*padded.batch_size, 3, 0, 2)
    assert (SequencePadder().inv(padded) == td).all()
    shapes = [mb["empty"].shape[2:] for mb in SequenceSampler(2, reuse_memory=True)(td)]
    assert shapes == [torch.Size([0])] * 2


def test_masked_statistics_over_an_all_false_mask():
    # before: masked_mean returned 0 as if it were a mean
    x, mask = torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool)
    assert math.isnan(float(F.masked_mean(x, mask)))  # like torch.mean of nothing
    assert torch.equal(F.masked_normalize(x, mask), torch.zeros(2, 3))  # all padding
    with pytest.raises(
        ValueError, match=re.escape("eps must be a finite real number >= 0, got -1.0")
    ):
        F.masked_normalize(x, mask, eps=-1.0)
    with pytest.raises(ValueError, match=re.escape("mask must have dtype torch.bool")):
        F.masked_mean(x, mask.long())
    with pytest.raises(TypeError, match=re.escape("x must be a torch.Tensor, got list")):
        F.masked_mean([[1.0]], mask)


@pytest.mark.parametrize(
    ("mask", "message"),
    [
        (torch.zeros(4, 3, dtype=torch.bool), "'loss_mask' has a row without a real step"),
        (torch.tensor([[True, False], [False, True]]), "'loss_mask' must be a True prefix"),
    ],
)
def test_samplers_refuse_rows_that_are_not_sequences(mask, message):
    # before: an all-False mask raised split_with_sizes' RuntimeError; a non-prefix row passed
    padded = TensorDict({"loss_mask": mask}, batch_size=mask.shape)
    with pytest.raises(ValueError, match=re.escape(message)):
        list(SequenceSampler(2)(padded))
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(mask.shape[0]),
        sampler=SequenceReplaySampler(2, generator=torch.Generator()),
    )
    buffer.extend(padded)
    with pytest.raises(ValueError, match=re.escape(message)):
        buffer.sample(1)


def test_balanced_minibatches_with_zero_length_sequences_last():
    # before: the last cut fell short of N (split_with_sizes' RuntimeError)
    groups = F.balanced_minibatches(torch.tensor([0, 0, 0, 0]), 2, generator=torch.Generator())
    assert sorted(torch.cat(groups).tolist()) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match=re.escape("lengths must be >= 0 (real steps per")):
        F.balanced_minibatches(torch.tensor([1, -1, 2]), 2, generator=torch.Generator())


@pytest.mark.parametrize(
    ("run", "key"),
    [
        (lambda: GAE(gamma=0.9, lmbda=0.9)(small_rollout().to("meta")), "('next', 'reward')"),
        (lambda: EpisodeSplitter()(small_rollout().to("meta")), "('next', 'done')"),
        (
            lambda: SequenceChunker(sequence_length=4)(
                EpisodeSplitter()(small_rollout()).to("meta")
            ),
            "'episode_id'",
        ),
        (lambda: SequencePadder()(_chunked().to("meta")), "'sequence_id'"),
        (lambda: list(SequenceSampler(1)(_chunked().to("meta"))), "'sequence_id'"),
    ],
)
def test_meta_tensors_are_refused_where_values_are_read(run, key):
    # before: Tensor.item() / "Cannot copy out of meta tensor" from torch
    with pytest.raises(
        ValueError, match=re.escape(f"{key} is a meta tensor (shape only, no data)")
    ):
        run()


def test_device_mover_refuses_a_str_for_keys_and_bad_devices():
    # before: list("observation") moved the keys 'o', 'b', ... (KeyError for 'o')
    with pytest.raises(
        TypeError,
        match=re.escape(
            "keys must be a sequence of keys, e.g. ['observation'], got the str 'observation'"
        ),
    ):
        DeviceMover("cpu", keys="observation")
    with pytest.raises(ValueError, match="device 'gpu0' is not a torch device"):
        DeviceMover("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device 'cuda' is not available"):
            DeviceMover("cuda")


# ---- 8. numbers, generators, keys --------------------------------------------------------------
@pytest.mark.parametrize("value", [True, "0.9", "abc", math.nan, torch.tensor(0.9), None])
def test_discounts_must_be_real_numbers_in_the_unit_interval(value):
    # before: True and "0.9" were accepted (float()), "abc" raised float()'s own ValueError
    with pytest.raises(ValueError, match=r"^gamma must be"):
        GAE(gamma=value, lmbda=0.9)
    with pytest.raises(ValueError, match=r"^lmbda must be"):
        F.generalized_advantage_estimate(**_gae_inputs(), gamma=0.9, lmbda=value)


@pytest.mark.parametrize("value", [2.0, "2", True])
def test_num_minibatches_must_be_an_int(value):
    # before: 2.0 passed the check and failed in split_with_sizes; "a" raised int()'s error
    with pytest.raises(ValueError, match="num_minibatches must be an int"):
        F.balanced_minibatches(torch.tensor([1, 2, 3]), value)
    with pytest.raises(ValueError, match="num_minibatches must be an int"):
        SequenceSampler(value)


def test_generators_must_be_generators():
    # before: AttributeError: 'int' object has no attribute 'device'
    message = "generator must be a torch.Generator or None, got int"
    with pytest.raises(TypeError, match=message):
        F.balanced_minibatches(torch.tensor([1, 2]), 1, generator=0)
    with pytest.raises(TypeError, match=message):
        SequenceSampler(1, generator=3)
    with pytest.raises(TypeError, match=message):
        SequenceReplaySampler(1, generator=3)
    with pytest.raises(
        ValueError, match=re.escape("lengths must be an integer tensor, got torch.float32")
    ):
        F.balanced_minibatches(torch.tensor([1.0, 2.0]), 1)


def test_rollout_keys_are_checked():
    # before: a list key failed deep in tensordict ("Only NestedKeys are supported. Got key ()")
    with pytest.raises(TypeError, match=re.escape("RolloutKeys.reward must be a str or a")):
        RolloutKeys(reward=["next", "reward"])
    with pytest.raises(TypeError, match=re.escape("RolloutKeys.done must be")):
        RolloutKeys(done=())
    # before: GAE overwrote the values with the advantages, the padder an observation
    with pytest.raises(
        ValueError,
        match=re.escape(
            "RolloutKeys fields state_value='state_value' and advantage='state_value' are the "
            "same key: writing advantage would overwrite the other"
        ),
    ):
        RolloutKeys(advantage="state_value")
    with pytest.raises(ValueError, match="one inside the other"):
        RolloutKeys(episode_id=("ids",), sequence_id=("ids", "sequence"))
    RolloutKeys(terminated=("next", "done"))  # two read keys may coincide


def test_a_key_holding_a_sub_tensordict_is_named():
    with pytest.raises(ValueError, match="key 'next' must hold a tensor, got TensorDict"):
        GAE(gamma=0.9, lmbda=0.9, keys=RolloutKeys(reward="next"))(small_rollout())


def test_layout_gather_checks_its_index():
    # before: IndexError: index out of range in self
    td = _chunked()
    layout = SequenceLayout.from_rollout(td, RolloutKeys(), "test")
    with pytest.raises(ValueError, match=re.escape("index must hold sequence numbers in [0, 6)")):
        layout.gather(td, RolloutKeys(), torch.tensor([0, 99]))
    with pytest.raises(ValueError, match="index must be"):
        layout.gather(td, RolloutKeys(), torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match=re.escape("needs the [2, 5] rollout it was built from")):
        layout.gather(td[:1], RolloutKeys(), torch.tensor([0]))
    # before: a leaf of the name the gather writes was replaced; from_rollout refused it
    clock = td.clone()
    clock["time_index"] = torch.arange(10).view(2, 5) + 100
    with pytest.raises(ValueError, match=re.escape("already holds 'time_index', a key it writes")):
        layout.gather(clock, RolloutKeys())
    padded = td.clone()
    padded["loss_mask"] = torch.ones(2, 5, dtype=torch.bool)
    with pytest.raises(ValueError, match="loss_mask"):
        layout.gather(padded, RolloutKeys())
    # before: RuntimeError: shape '[...]' is invalid for input of size ...
    small = layout.empty_buffer(td, 2)
    with pytest.raises(ValueError, match=re.escape("must be at least [3, ")):
        layout.gather(td, RolloutKeys(), torch.tensor([0, 1, 2]), out=small)
    whole = layout.gather(td, RolloutKeys(), torch.tensor([0, 1]), out=small)
    assert whole["loss_mask"].shape[0] == 2


def test_replay_buffer_iterates_epochs():
    # before: AttributeError: property 'ran_out' has no setter (ReplayBuffer.__iter__ sets it)
    padded = SequencePadder()(_chunked())
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(padded.batch_size[0]),
        sampler=SequenceReplaySampler(3, generator=torch.Generator()),
        batch_size=1,
    )
    buffer.extend(padded)
    for _ in range(2):
        minibatches = list(buffer)
        assert len(minibatches) == 3
        assert sum(int(mb["loss_mask"].sum()) for mb in minibatches) == 10


def test_leaves_on_another_device_than_the_ids_are_named():
    # before: index_select's "Expected all tensors to be on the same device"
    td = _chunked()
    td.clear_device_()
    td["elsewhere"] = torch.zeros(2, 5, device="meta")
    with pytest.raises(
        ValueError, match=re.escape("key 'elsewhere' is on meta, not on cpu like the sequence ids")
    ):
        SequencePadder()(td)
    padded = SequencePadder()(_chunked())
    padded.clear_device_()
    padded["elsewhere"] = torch.zeros(*padded.batch_size, device="meta")
    with pytest.raises(
        ValueError, match=re.escape("key 'elsewhere' is on meta, not on cpu like 'loss_mask'")
    ):
        SequencePadder().inv(padded)
    inputs = _gae_inputs()
    inputs["state_value"] = inputs["state_value"].to("meta")
    with pytest.raises(
        ValueError, match=re.escape("'state_value' is on meta, but 'reward' is on cpu")
    ):
        _gae(**inputs)


def test_gae_value_network_must_be_callable():
    with pytest.raises(TypeError, match="value_network must be a TensorDict module"):
        GAE(gamma=0.9, lmbda=0.9, value_network="critic")


def test_padding_positions_refuses_meta():
    with pytest.raises(ValueError, match=re.escape("'loss_mask' is a meta tensor")):
        F.padding_positions(torch.ones(2, 3, dtype=torch.bool, device="meta"))


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("who", ["padder", "sampler"])
def test_a_lazy_stack_of_workers_with_leaves_of_other_shapes_is_refused_by_key(nested, who):
    from tensordict import LazyStackedTensorDict

    steps, done = 6, torch.zeros(6, 1, dtype=torch.bool)
    rows = [torch.zeros(steps, width) for width in (1, 2)]  # one worker's is [T, 1], one [T, 2]
    if nested:
        parts = [TensorDict({"o": row}, [steps]) for row in rows]
        td = TensorDict(
            {
                "x": LazyStackedTensorDict.lazy_stack(parts, 0),
                ("next", "done"): done.expand(2, -1, -1),
            },
            [2, steps],
        )
        key = ("x", "o")
    else:
        parts = [TensorDict({"o": row, ("next", "done"): done}, [steps]) for row in rows]
        td, key = LazyStackedTensorDict.lazy_stack(parts, 0), "o"
    td = SequenceChunker(sequence_length=4)(EpisodeSplitter()(td))
    message = re.escape(f"the rollout's {key!r} has different shapes") + r".*\[\[6, 1\], \[6, 2\]\]"
    with pytest.raises(ValueError, match=message):
        if who == "padder":
            SequencePadder()(td)
        else:
            list(SequenceSampler(2)(td))


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: GAE(gamma=0.9, lmbda=0.9).set_keys(value_target=("observation", "vt")), "vt"),
        (lambda: EpisodeSplitter().set_keys(episode_id=("observation", "ep")), "ep"),
    ],
)
def test_an_output_key_nested_under_a_tensor_is_refused_by_name(make, field):
    # tensordict's own error named neither the transform nor the key
    td = small_rollout()
    transform = make()
    with pytest.raises(
        ValueError,
        match=re.escape(
            f"{type(transform).__name__} writes ('observation', '{field}'), but the rollout's "
            "'observation' is a tensor, not a tensordict"
        ),
    ):
        transform(td)
    assert td.get("advantage", None) is None  # nothing half-written


@pytest.mark.parametrize("value", [None, {"observation": torch.zeros(2, 3)}, torch.zeros(2, 3)])
def test_transforms_and_the_sampler_take_a_tensordict_only(value):
    # a dict or None failed with "'dict' object has no attribute 'batch_dims'" from inside
    from torchrl.envs import Compose

    for name, call in [
        ("GAE", GAE(gamma=0.9, lmbda=0.9)),
        ("EpisodeSplitter", EpisodeSplitter()),
        ("SequencePadder", SequencePadder()),
        ("EpisodeSplitter", Compose(EpisodeSplitter(), SequencePadder())),
        ("DeviceMover", DeviceMover("cpu")),
        ("SequencePadder.inv", SequencePadder().inv),
        ("SequenceSampler", lambda td: list(SequenceSampler(2)(td))),
    ]:
        with pytest.raises(
            TypeError, match=f"{name} takes a TensorDict .*got {type(value).__name__}"
        ):
            call(value)


def test_a_value_network_that_is_no_tensordict_module_is_named():
    # nn.Linear failed with torch's "Multiple dispatch failed for 'torch.nn.linear'"
    td = small_rollout().exclude("state_value", ("next", "state_value"))
    for network, message in [
        (torch.nn.Linear(3, 1), r"GAE's value_network \(Linear, without in_keys\) failed on a"),
        (lambda x: x["observation"], r"value_network \(function, .*returned Tensor, not a"),
    ]:
        with pytest.raises(TypeError, match=message):
            GAE(gamma=0.9, lmbda=0.9, value_network=network)(td.clone())
    # with V(o_t) given, only the next values are computed: the same refusal
    half = small_rollout().exclude(("next", "state_value"))
    with pytest.raises(TypeError, match=r"value_network \(Linear, without in_keys\) failed"):
        GAE(gamma=0.9, lmbda=0.9, value_network=torch.nn.Linear(3, 1))(half)
    # a TensorDict module's own TypeError is its own, not relabelled
    from tensordict.nn import TensorDictModule

    def broken(observation):
        raise TypeError("broken inside")

    module = TensorDictModule(broken, in_keys=["observation"], out_keys=["state_value"])
    with pytest.raises(TypeError, match=r"^broken inside$"):
        GAE(gamma=0.9, lmbda=0.9, value_network=module)(td.clone())
    # a plain callable writing the value into the tensordict still works
    out = GAE(
        gamma=0.9,
        lmbda=0.9,
        value_network=lambda x: x.set("state_value", x["observation"][..., :1]),
    )(td.clone())
    assert out["advantage"].shape == (*td.batch_size, 1)


def test_padded_sequences_with_a_renamed_mask_are_told_to_name_it():
    # the sampler said only "exclude 'worker_index' first", which is refused again later
    padded = SequencePadder(keys=RolloutKeys(loss_mask="m"))(_chunked())
    with pytest.raises(ValueError, match=r"as padded sequences do: if their mask is not 'loss_"):
        list(SequenceSampler(2)(padded))
    minibatches = list(SequenceSampler(2, keys=RolloutKeys(loss_mask="m"))(padded))
    assert sum(int(mb["m"].sum()) for mb in minibatches) == padded["m"].sum()
    # a rollout holding one of the keys only gets no such hint
    with pytest.raises(ValueError, match=r"keys=RolloutKeys\(worker_index=...\)$"):
        list(SequenceSampler(2)(_chunked().set("worker_index", torch.zeros(2, 5))))
