"""Unit tests of rppo_td/transforms/_padder.py: SequencePadder and its inverse."""

from __future__ import annotations

import re

import pytest
import torch
from tensordict import TensorDict

from rppo_td import EpisodeSplitter, SequenceChunker, SequencePadder, SequenceSampler
from tests.unit._data import small_rollout


def _chunked(length=2, **kwargs):
    return SequenceChunker(sequence_length=length)(EpisodeSplitter()(small_rollout(**kwargs)))


def test_golden_layout():
    td = _chunked(2)
    padded = SequencePadder()(td)
    # worker 0: fragments [0, 1], [2, 3], [4]; worker 1: [0..4] cut into [0, 1], [2, 3], [4]
    assert padded.batch_size == (6, 2)
    assert padded["loss_mask"].tolist() == [[True, True]] * 2 + [[True, False]] + [
        [True, True]
    ] * 2 + [[True, False]]
    assert padded["worker_index"].tolist() == [[0, 0], [0, 0], [0, 0], [1, 1], [1, 1], [1, 0]]
    assert padded["time_index"].tolist() == [[0, 1], [2, 3], [4, 0], [0, 1], [2, 3], [4, 0]]
    assert torch.equal(padded["observation"][3, 1], td["observation"][1, 1])
    assert torch.equal(padded["recurrent_state_c"][4, 0], td["recurrent_state_c"][1, 2])
    assert padded["pixels"].dtype == torch.uint8 and padded["pixels"].shape == (6, 2, 1, 2, 2)
    assert not padded["pixels"][2, 1].any()


def test_forward_does_not_mutate_and_inv_round_trips():
    td = _chunked(3)
    before = td.clone()
    padded = SequencePadder()(td)
    assert (td == before).all()
    assert set(td.keys(True, True)) == set(before.keys(True, True))
    back = SequencePadder().inv(padded)
    assert back.batch_size == td.batch_size
    assert (back == td).all()
    assert set(back.keys(True, True)) == set(td.keys(True, True))


def test_inv_scatters_values_computed_on_sequences():
    td = _chunked(2)
    padded = SequencePadder()(td)
    # a value computed per padded position (as a model would) goes back to its (w, t)
    padded["new_value"] = (padded["worker_index"] * 100 + padded["time_index"]).float()
    back = SequencePadder().inv(padded)
    expected = torch.arange(2).view(2, 1) * 100 + torch.arange(5).view(1, 5)
    assert torch.equal(back["new_value"], expected.float())


def test_inv_passes_non_padded_through():
    td = small_rollout()
    out = SequencePadder().inv(td)
    assert out.batch_size == td.batch_size
    assert set(out.keys(True, True)) == set(td.keys(True, True))
    assert (out == td).all()


def test_inv_needs_every_step_once():
    padded = SequencePadder()(_chunked(2))
    with pytest.raises(
        ValueError,
        match=re.escape(
            "SequencePadder.inv needs all the sequences of one rollout, every step once: they "
            "were padded from a rollout of 10 steps ('rollout_steps'), and these hold 5 real "
            "steps over 5 distinct (worker, time) pairs within [2, 5]"
        ),
    ):
        SequencePadder().inv(padded[torch.tensor([0, 2, 3])])
    with pytest.raises(ValueError, match="hold 12 real steps over 10 distinct"):
        SequencePadder().inv(torch.cat([padded, padded[:1]]))


def test_inv_checks():
    padded = SequencePadder()(_chunked(2))
    with pytest.raises(
        ValueError,
        match=re.escape(
            "SequencePadder.inv expects padded sequences with batch dims [N, Lp], got [6]"
        ),
    ):
        SequencePadder().inv(padded[:, 0])
    bad = padded.clone()
    bad["time_index"] = bad["time_index"].int()
    with pytest.raises(
        ValueError, match=re.escape("'time_index' must have dtype torch.int64, got torch.int32")
    ):
        SequencePadder().inv(bad)
    with pytest.raises(KeyError) as info:
        SequencePadder().inv(padded.exclude("worker_index"))
    assert info.value.args[0].startswith("key 'worker_index' is missing")


def test_forward_checks():
    with pytest.raises(KeyError) as info:
        SequencePadder()(EpisodeSplitter()(small_rollout()))
    assert "'sequence_id' is missing" in info.value.args[0]
    assert "Run EpisodeSplitter and SequenceChunker before SequencePadder." in info.value.args[0]
    padded = SequencePadder()(_chunked(2))
    with pytest.raises(
        ValueError, match="SequencePadder got a tensordict that already holds 'loss_mask'"
    ):
        SequencePadder()(padded)
    td = _chunked(2)
    td["sequence_offset"] = td["sequence_offset"].unsqueeze(-1)
    with pytest.raises(
        ValueError, match=re.escape("'sequence_offset' must have shape [2, 5], got [2, 5, 1]")
    ):
        SequencePadder()(td)


def test_non_tensor_leaf_is_refused():
    td = _chunked(2)
    td.set_non_tensor(("meta", "env_name"), "CartPole-v1")
    with pytest.raises(
        ValueError, match=re.escape("key ('meta', 'env_name') holds NonTensorData, not a tensor")
    ):
        SequencePadder()(td)


def test_single_step_rollout():
    td = SequenceChunker(sequence_length=4)(
        EpisodeSplitter()(small_rollout(num_workers=1, num_steps=1))
    )
    padded = SequencePadder()(td)
    assert padded.batch_size == (1, 1)
    assert (SequencePadder().inv(padded) == td).all()


def test_empty_feature_tensor_dims():
    td = TensorDict(
        {
            "next": {"done": torch.zeros(1, 3, 1, dtype=torch.bool)},
            "scalar": torch.arange(3.0).view(1, 3),
        },
        batch_size=[1, 3],
    )
    padded = SequencePadder()(SequenceChunker(sequence_length=2)(EpisodeSplitter()(td)))
    assert padded["scalar"].tolist() == [[0.0, 1.0], [2.0, 0.0]]


def test_rollout_sliced_in_time_after_chunking_is_refused():
    # slicing td[:, k:] leaves sequences that start mid-way (offset > 0): padding them would
    # give a loss_mask that is not a True prefix, so the padder refuses instead
    done = torch.zeros(2, 8, 1, dtype=torch.bool)
    done[:, 3] = True
    td = TensorDict({"x": torch.arange(16.0).view(2, 8, 1), "next": {"done": done}}, [2, 8])
    td = SequenceChunker(sequence_length=3)(EpisodeSplitter()(td))
    assert SequencePadder()(td[:, 4:].clone()).batch_size == torch.Size([4, 3])
    # td[:, 2:] starts worker 0 at offset 2 of a sequence, which must start at offset 0
    with pytest.raises(
        ValueError, match=r"at worker 0, time 0 it is 2 where 0 was expected.*sliced in time"
    ):
        SequencePadder()(td[:, 2:].clone())


def test_pad_to_golden_and_checks():
    td = _chunked(2)
    padded = SequencePadder(pad_to=4)(td)
    assert padded.batch_size == (6, 4)
    assert padded["loss_mask"].tolist()[2] == [True, False, False, False]
    assert padded["time_index"].tolist()[1] == [2, 3, 0, 0]
    assert (SequencePadder().inv(padded) == td).all()
    assert SequencePadder(pad_to=2)(td).batch_size == (6, 2)  # pad_to = Lp: unchanged
    with pytest.raises(
        ValueError,
        match=re.escape("SequencePadder got pad_to=1, but the longest sequence has 2 steps"),
    ):
        SequencePadder(pad_to=1)(td)
    for bad in (0, -1, 2.0, True, "4"):
        message = f"pad_to must be an int >= 1 or None, got {bad!r}"
        with pytest.raises(ValueError, match=re.escape(message)):
            SequencePadder(pad_to=bad)
    assert repr(SequencePadder(pad_to=4)).startswith("SequencePadder(pad_to=4, in_keys=")


# ---- the output's leaves are gathered when first read (rppo_td._lazy) ----------------------
def _pending(td):
    from rppo_td._lazy import Pending, raw_leaves

    return {key for key, value in raw_leaves(td) if type(value) is Pending}


def test_output_is_a_plain_tensordict_whose_rollout_leaves_wait_to_be_read():
    td = _chunked(2)
    padded = SequencePadder()(td)
    assert type(padded) is TensorDict and type(padded["next"]) is TensorDict
    rollout_keys = set(td.keys(True, True))
    assert _pending(padded) == rollout_keys
    assert "observation" in padded.keys() and ("next", "reward") in padded.keys(True)  # noqa: SIM118
    value = padded["observation"]
    assert _pending(padded) == rollout_keys - {"observation"}
    assert padded["observation"] is value  # gathered once, then kept
    # writing a key replaces its pending leaf; deleting one drops it
    padded["action"] = torch.zeros(padded.shape, dtype=torch.int64)
    del padded["pixels"]
    assert _pending(padded) == rollout_keys - {"observation", "action", "pixels"}
    assert not padded["action"].any() and "pixels" not in padded.keys()  # noqa: SIM118


def test_read_in_inference_mode_gives_an_ordinary_tensor():
    padded = SequencePadder()(_chunked(2))
    with torch.inference_mode():
        value = padded["observation"]
    assert not value.is_inference()
    value.add_(1.0)  # usable outside inference mode, as an eager padder's output


def test_leaves_that_cannot_be_tracked_are_padded_at_once():
    with torch.inference_mode():
        assert _pending(SequencePadder()(_chunked(2))) == set()


def test_a_leaf_that_requires_grad_keeps_the_graph_of_padding_time():
    td = _chunked(2)
    td["observation"] = td["observation"].clone().requires_grad_(True)
    padded = SequencePadder()(td)
    assert "observation" in _pending(padded)
    with torch.no_grad():  # read later under no_grad: still the graph an eager padder made
        value = padded["observation"]
    assert value.requires_grad
    value.sum().backward()  # the graph runs back to the rollout
    # every real step once: a gradient of 1 on every step of the rollout
    assert torch.equal(td["observation"].grad, torch.ones_like(td["observation"]))
    with torch.no_grad():  # padded without grad: no graph, as an eager padder's
        assert not SequencePadder()(td)["observation"].requires_grad


@pytest.mark.parametrize("gather_epoch", [None, False])  # True shares one graph (documented)
@pytest.mark.parametrize("reuse_memory", [False, True])
def test_padder_then_sampler_backward_per_minibatch_with_a_grad_leaf(gather_epoch, reuse_memory):
    # every minibatch indexed the padder's one gather, whose graph the first backward freed
    td = _chunked(3)
    leaf = td["observation"].clone().requires_grad_(True)
    td["observation"] = leaf
    # a one-number float leaf with a graph beside ones without: stacked together, the graph
    # passed to every leaf of the stack
    td["state_value"] = td["state_value"].clone().requires_grad_(True)
    weights = torch.rand(leaf.shape)
    sampler = SequenceSampler(
        3, generator=torch.Generator().manual_seed(0), gather_epoch=gather_epoch,
        reuse_memory=reuse_memory,
    )  # fmt: skip
    for source in (td, SequencePadder()(td)):
        leaf.grad = None
        for minibatch in sampler(source):
            assert not minibatch["next", "reward"].requires_grad  # no graph leaks across leaves
            assert minibatch["state_value"].requires_grad
            rows = minibatch["observation"]
            steps = minibatch["worker_index"] * td.batch_size[1] + minibatch["time_index"]
            picked = weights.flatten(0, 1)[steps] * minibatch["loss_mask"].unsqueeze(-1)
            (rows * picked).sum().backward()  # one backward per minibatch
        # each real step once: d/d leaf of sum(leaf * weights) over every step is the weights
        torch.testing.assert_close(leaf.grad, weights)


def test_a_write_to_the_rollout_after_padding_is_refused_by_name():
    td = _chunked(2)
    padded = SequencePadder()(td)
    td["next", "reward"].mul_(2.0)
    with pytest.raises(ValueError, match=re.escape("('next', 'reward')") + ".*modified in place"):
        padded.clone()
    # the other leaves are still read as padded
    assert torch.equal(padded["observation"], SequencePadder()(_chunked(2))["observation"])


def test_inv_and_a_device_move_read_the_pending_leaves():
    td = _chunked(2)
    padded = SequencePadder()(td)
    assert (SequencePadder().inv(padded) == td).all()
    moved = SequencePadder()(td).to("cpu")
    assert torch.equal(moved["recurrent_state_h"], padded["recurrent_state_h"])


def test_a_shared_memory_leaf_is_gathered_at_padding_time():
    # another process refilling a shared buffer writes past this process's version counter:
    # such a leaf cannot be left pending (a NumPy view's write stands in for the other process)
    from rppo_td._lazy import Pending, raw_leaves

    rollout = SequenceChunker(sequence_length=2)(EpisodeSplitter()(small_rollout()))
    rollout.get("observation").share_memory_()
    padded = SequencePadder()(rollout)
    pending = {key for key, value in raw_leaves(padded) if type(value) is Pending}
    assert "observation" not in pending and pending  # the other leaves stay lazy
    expected = SequencePadder()(rollout).clone()
    rollout.get("observation").numpy()[:] = 7.0
    assert torch.equal(padded["observation"], expected["observation"])
