"""Unit tests of rppo_td/sampling/_sampler.py: SequenceSampler."""

from __future__ import annotations

import gc
import re
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict, tensorclass

from rppo_td import EpisodeSplitter, SequenceChunker, SequencePadder, SequenceSampler
from rppo_td.sampling._sampler import row_slices
from tests.unit._data import small_rollout


def _chunked():
    # 6 sequences: lengths 2, 2, 1 (worker 0) and 2, 2, 1 (worker 1)
    return SequenceChunker(sequence_length=2)(EpisodeSplitter()(small_rollout()))


def test_docstring_case():
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]).bool()
    sampler = SequenceSampler(num_minibatches=2, generator=torch.Generator().manual_seed(0))
    out = [
        (tuple(mb.batch_size), int(mb["loss_mask"].sum()))
        for mb in sampler(TensorDict({"loss_mask": mask}, batch_size=[4, 4]))
    ]
    assert out == [((2, 4), 5), ((2, 4), 5)]


def test_yields_whole_padded_sequences():
    padded = SequencePadder()(_chunked())
    minibatches = list(SequenceSampler(3, generator=torch.Generator().manual_seed(3))(padded))
    assert len(minibatches) == 3
    assert sum(mb.batch_size[0] for mb in minibatches) == 6
    for mb in minibatches:
        assert mb.batch_size[1] == 2
        assert set(mb.keys(True, True)) == set(padded.keys(True, True))


def test_each_call_is_a_new_epoch_from_the_generator():
    padded = SequencePadder()(_chunked())
    sampler = SequenceSampler(6, generator=torch.Generator().manual_seed(0))
    orders = [
        tuple(int(mb["worker_index"][0, 0] * 10 + mb["time_index"][0, 0]) for mb in sampler(padded))
        for _ in range(5)
    ]
    assert all(sorted(order) == [0, 2, 4, 10, 12, 14] for order in orders)
    assert len(set(orders)) > 1


def test_global_generator_when_none():
    padded = SequencePadder()(_chunked())
    torch.manual_seed(0)
    first = [mb["time_index"].tolist() for mb in SequenceSampler(2)(padded)]
    torch.manual_seed(0)
    assert [mb["time_index"].tolist() for mb in SequenceSampler(2)(padded)] == first


@pytest.mark.parametrize(
    ("num", "message"),
    [
        (0, "num_minibatches must be >= 1, got 0"),
        (True, "num_minibatches must be an int, got True"),
        (2.0, "num_minibatches must be an int, got 2.0"),
    ],
)
def test_constructor_checks(num, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        SequenceSampler(num)


def test_bad_balance():
    with pytest.raises(ValueError, match="balance must be 'steps' or 'sequences', got 'count'"):
        SequenceSampler(2, balance="count")


@pytest.mark.parametrize("padded", [True, False])
def test_more_minibatches_than_sequences(padded):
    td = SequencePadder()(_chunked()) if padded else _chunked()
    with pytest.raises(ValueError, match="num_minibatches=7 exceeds the 6 sequences available"):
        list(SequenceSampler(7)(td))


def test_input_checks():
    padded = SequencePadder()(_chunked())
    with pytest.raises(
        ValueError,
        match=re.escape(
            "SequenceSampler expects padded sequences with batch dims [N, Lp], got batch size "
            "[6, 2, 1]"
        ),
    ):
        SequenceSampler(2)(padded.unsqueeze(-1))
    bad = padded.clone()
    bad["loss_mask"] = bad["loss_mask"].long()
    with pytest.raises(
        ValueError, match=re.escape("'loss_mask' must have dtype torch.bool, got torch.int64")
    ):
        SequenceSampler(2)(bad)
    with pytest.raises(KeyError) as info:
        SequenceSampler(2)(EpisodeSplitter()(small_rollout()))
    assert "'sequence_id' is missing" in info.value.args[0]
    assert "Run EpisodeSplitter and SequenceChunker before SequenceSampler." in info.value.args[0]
    with pytest.raises(
        ValueError,
        match=re.escape(
            "SequenceSampler expects a rollout with batch dims [W, T] (worker, time), "
            "got batch size [5]"
        ),
    ):
        SequenceSampler(2)(_chunked()[0])


def test_reuse_memory_takes_two_buffers_in_turn_and_never_overwrites_a_kept_minibatch():
    td = SequenceChunker(sequence_length=2)(EpisodeSplitter()(small_rollout()))
    sampler = SequenceSampler(
        3, generator=torch.Generator().manual_seed(0), reuse_memory=True, gather_epoch=False
    )
    # a loop that drops each minibatch: the buffers alternate, so the one it still holds
    # while asking for the next is never written
    pointers = []
    for mb in sampler(td):
        pointers.append(mb["observation"].data_ptr())
    assert pointers[0] == pointers[2] != pointers[1]
    # kept minibatches (a list, over two epochs) keep the values they were yielded with
    kept = []
    for _ in range(2):
        for mb in sampler(td):
            kept.append((mb, mb.clone()))
    assert all((mb == copy).all() for mb, copy in kept)
    # so does the loop variable's minibatch and one leaf kept alone
    leaves = []
    for mb in sampler(td):
        leaves.append((mb["observation"], mb["observation"].clone()))
    assert all(torch.equal(leaf, copy) for leaf, copy in leaves)


def test_reuse_memory_leaves_a_buffer_sent_to_another_process():
    td = SequenceChunker(sequence_length=2)(EpisodeSplitter()(small_rollout()))
    sampler = SequenceSampler(
        3, generator=torch.Generator().manual_seed(0), reuse_memory=True, gather_epoch=False
    )
    sent = set()
    with mock.patch("rppo_td._buffers.MIN_BYTES", 0):  # pool every leaf, however small
        for mb in sampler(td):
            # what torch.multiprocessing does to a tensor it sends: its storage moves to
            # shared memory; the sender then drops it while the receiver still reads it
            sent.add(mb["observation"].share_memory_().data_ptr())
        del mb
        gc.collect()
        for _ in range(2):
            for mb in sampler(td):
                assert mb["observation"].data_ptr() not in sent


def test_reuse_memory_buffer_serves_the_next_epoch_once_nothing_holds_it():
    td = SequenceChunker(sequence_length=2)(EpisodeSplitter()(small_rollout()))
    sampler = SequenceSampler(
        2, generator=torch.Generator().manual_seed(0), reuse_memory=True, gather_epoch=False
    )
    with mock.patch("rppo_td._buffers.MIN_BYTES", 0):  # pool every leaf, however small
        first = next(iter(sampler(td)))
        pointer, kept = first["observation"].data_ptr(), first.clone()
        # held: the next epoch writes elsewhere, and the held minibatch keeps its values
        assert next(iter(sampler(td)))["observation"].data_ptr() != pointer
        assert (first == kept).all()
        del first
        gc.collect()
        assert next(iter(sampler(td)))["observation"].data_ptr() == pointer


@pytest.mark.parametrize("padded", [False, True])
def test_an_epoch_gathered_at_once_is_slices_of_one_gather(padded):
    td = _chunked()
    td = SequencePadder()(td) if padded else td
    sampler = SequenceSampler(3, generator=torch.Generator().manual_seed(0), gather_epoch=True)
    minibatches = list(sampler(td))
    storages = {mb["observation"].untyped_storage().data_ptr() for mb in minibatches}
    assert len(storages) == 1
    # the slices share no row: writing into one leaves the others as they were
    others = [mb.clone() for mb in minibatches[1:]]
    minibatches[0]["observation"].fill_(7.0)
    for mb, before in zip(minibatches[1:], others, strict=True):
        assert (mb == before).all()
        assert mb["observation"].is_contiguous()
    # the next epoch leaves this one's minibatches as they were
    kept = [mb.clone() for mb in minibatches]
    list(sampler(td))
    for mb, before in zip(minibatches, kept, strict=True):
        assert (mb == before).all()


@pytest.mark.parametrize("padded", [False, True])
def test_gather_epoch_by_size(padded):
    td = _chunked()
    td = SequencePadder()(td) if padded else td

    def storages():
        sampler = SequenceSampler(3, generator=torch.Generator().manual_seed(0))
        minibatches = list(sampler(td))
        return {mb["observation"].untyped_storage().data_ptr() for mb in minibatches}

    assert len(storages()) == 1  # a small epoch: gathered at once
    with mock.patch.object(SequenceSampler, "epoch_gather_bytes", 0):
        assert len(storages()) == 3  # past the bound: minibatch by minibatch


@pytest.mark.parametrize("bad", [1, "yes", 0.0])
def test_gather_epoch_refuses_non_bools(bad):
    with pytest.raises(ValueError, match=r"gather_epoch must be True, False or None, got"):
        SequenceSampler(2, gather_epoch=bad)


@pytest.mark.parametrize("bad", [1, "no", None, 0.0])
def test_reuse_memory_refuses_non_bools(bad):
    # "no" turned the overwriting mode on
    with pytest.raises(ValueError, match=rf"reuse_memory must be True or False, got {bad!r}"):
        SequenceSampler(2, reuse_memory=bad)


@pytest.mark.parametrize("gather_epoch", [None, True, False])
@pytest.mark.parametrize("padded", [False, True])
def test_the_data_is_read_when_the_minibatches_are_asked_for(gather_epoch, padded):
    td = _chunked()
    td = SequencePadder()(td) if padded else td
    sampler = SequenceSampler(
        3, generator=torch.Generator().manual_seed(0), gather_epoch=gather_epoch
    )
    epoch = sampler(td)
    # changed after the call, before the first minibatch: seen in every mode
    td["observation"].mul_(0)
    td["state_value"].fill_(5.0)
    td["extra"] = torch.ones(td.batch_size)
    for mb in epoch:
        assert not mb["observation"].any()
        assert (mb["state_value"] == 5.0)[mb["loss_mask"]].all()
        # from a rollout the gather pads with zeros; padded input is indexed as it is
        expected = torch.ones_like(mb["extra"]) if padded else mb["loss_mask"].float()
        assert (mb["extra"] == expected).all()


@pytest.mark.parametrize("padded", [False, True])
def test_leaves_that_require_grad_get_a_graph_per_minibatch_by_default(padded):
    td = _chunked()
    observation = torch.randn((*td.batch_size, 3), requires_grad=True)
    td["observation"] = observation
    if padded:
        td = SequencePadder()(td.detach())
        observation = td["observation"].requires_grad_()
    sampler = SequenceSampler(3, generator=torch.Generator().manual_seed(0))
    for mb in sampler(td):
        (mb["observation"] ** 2).sum().backward()  # one backward per minibatch
    # every real step once, through its own minibatch's graph
    expected = 2 * observation.detach()
    if padded:
        expected = expected * td["loss_mask"].unsqueeze(-1)
    torch.testing.assert_close(observation.grad, expected)


def test_the_epoch_bound_counts_the_keys_the_gather_adds():
    td = _chunked().select("sequence_id", "sequence_offset")
    positions = SequencePadder()(td).numel()
    data = sum(v.numel() * v.element_size() for v in td.values()) * positions // td.numel()

    def storages(bound):
        with mock.patch.object(SequenceSampler, "epoch_gather_bytes", bound):
            sampler = SequenceSampler(3, generator=torch.Generator().manual_seed(0))
            return {mb["loss_mask"].untyped_storage().data_ptr() for mb in sampler(td)}

    added = positions * (1 + 3 * 8)  # loss_mask, worker_index, time_index, rollout_steps
    assert len(storages(data + added)) == 1
    assert len(storages(data + added - 1)) == 3


def test_ids_and_offsets_on_two_devices_are_refused():
    td = _chunked()
    td["sequence_offset"] = td["sequence_offset"].to("meta")
    with pytest.raises(ValueError, match="sequence_offset is on meta, but sequence_id is on cpu"):
        list(SequenceSampler(2)(td))


def _with_agents(workers=3, steps=10, agents=3):
    """A rollout with TorchRL's multi-agent layout: ``("agents",)`` of batch ``[W, T, n]``."""
    g = torch.Generator().manual_seed(1)
    done = torch.rand(workers, steps, 1, generator=g) < 0.2
    group = TensorDict(
        {
            "observation": torch.randn(workers, steps, agents, 5, generator=g),
            "deep": TensorDict(
                {"x": torch.randn(workers, steps, agents, 2, 4, generator=g)},
                batch_size=[workers, steps, agents, 2],
            ),
        },
        batch_size=[workers, steps, agents],
    )
    td = TensorDict(
        {"agents": group, "state_value": torch.randn(workers, steps, 1, generator=g),
         "next": {"done": done}},
        batch_size=[workers, steps],
    )  # fmt: skip
    return SequenceChunker(sequence_length=4)(EpisodeSplitter()(td))


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("gather_epoch", [None, False, True])
@pytest.mark.parametrize("reuse_memory", [False, True])
def test_nested_groups_keep_their_own_batch_dims(padded, gather_epoch, reuse_memory):
    # the group's [W, T, n_agents] came out [B, Lp]: unbind(-1) then split Lp, not the agents
    td = _with_agents()
    source = SequencePadder()(td) if padded else td
    if padded:
        assert source["agents"].batch_size[2:] == torch.Size([3])
        assert source["agents", "deep"].batch_size[2:] == torch.Size([3, 2])
        assert (SequencePadder().inv(source) == td).all()  # the rollout back, groups included
        assert SequencePadder().inv(source)["agents"].batch_size == td["agents"].batch_size
    sampler = SequenceSampler(
        2, generator=torch.Generator().manual_seed(0), gather_epoch=gather_epoch,
        reuse_memory=reuse_memory,
    )  # fmt: skip
    for minibatch in sampler(source):
        b, lp = minibatch.batch_size
        assert minibatch["agents"].batch_size == torch.Size([b, lp, 3])
        assert minibatch["agents", "deep"].batch_size == torch.Size([b, lp, 3, 2])
        steps = minibatch["worker_index"] * 10 + minibatch["time_index"]
        mask = minibatch["loss_mask"]
        expected = td["agents", "observation"].flatten(0, 1)[steps[mask]]
        assert torch.equal(minibatch["agents", "observation"][mask], expected)


@tensorclass
class _Reading:
    value: torch.Tensor


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("gather_epoch", [None, False, True])
def test_empty_levels_and_tensorclasses_keep_their_place_and_type(padded, gather_epoch):
    # an empty sub-tensordict was dropped, and a tensorclass came back a plain TensorDict
    workers, steps = 3, 10
    td = _with_agents(workers, steps)
    td["empty"] = TensorDict(batch_size=[workers, steps])
    td["deep", "empty"] = TensorDict(batch_size=[workers, steps, 2])
    reading = torch.randn(workers, steps, 2)
    td["reading"] = _Reading(value=reading.clone(), batch_size=[workers, steps])
    td["agents", "empty"] = TensorDict(batch_size=[workers, steps, 3])
    source = SequencePadder()(td) if padded else td
    if padded:
        assert type(source["reading"]) is _Reading
        assert source["deep", "empty"].batch_size[2:] == torch.Size([2])
        back = SequencePadder().inv(source)
        assert type(back["reading"]) is _Reading
        assert set(back.keys(include_nested=True)) == set(td.keys(include_nested=True))
        assert back["deep", "empty"].batch_size == td["deep", "empty"].batch_size
        assert torch.equal(back["reading"].value, reading)
    generator = torch.Generator().manual_seed(0)
    sampler = SequenceSampler(2, generator=generator, gather_epoch=gather_epoch)
    for minibatch in sampler(source):
        b, lp = minibatch.batch_size
        assert minibatch["empty"].batch_size == torch.Size([b, lp])
        assert minibatch["empty"].is_empty()
        assert minibatch["deep", "empty"].batch_size == torch.Size([b, lp, 2])
        assert minibatch["agents", "empty"].batch_size == torch.Size([b, lp, 3])
        assert type(minibatch["reading"]) is _Reading
        mask = minibatch["loss_mask"]
        at = (minibatch["worker_index"] * steps + minibatch["time_index"])[mask]
        assert torch.equal(minibatch["reading"].value[mask], reading.flatten(0, 1)[at])


@given(st.lists(st.integers(0, 3), min_size=1, max_size=200))
@settings(max_examples=30, deadline=None)
def test_row_slices_are_the_rows_in_order_across_split_blocks(sizes):
    # the minibatches are split from the epoch's rows a block of them at a time (a split of
    # 1e5 minibatches at once held a view per leaf and minibatch: gigabytes)
    rows = sum(sizes)
    td = TensorDict(
        {"a": torch.arange(rows * 2).view(rows, 2), ("n", "b"): torch.arange(rows)}, [rows]
    )
    start = 0
    slices = list(row_slices(td, sizes))
    assert len(slices) == len(sizes)
    for size, piece in zip(sizes, slices, strict=True):
        assert (piece == td[start : start + size]).all() and piece.batch_size == (size,)
        start += size


@pytest.mark.parametrize("padded", [False, True])
def test_an_epoch_of_more_minibatches_than_a_split_block_is_each_row_once(padded):
    # minibatches past the first block of 64 were split from the epoch's first rows again
    # (a wrong offset): an epoch gathered at once gives the minibatches gathered one by one
    td = SequenceChunker(sequence_length=1)(EpisodeSplitter()(small_rollout(4, 50)))
    td = SequencePadder()(td) if padded else td

    def epoch(gather_epoch):
        generator = torch.Generator().manual_seed(0)
        return list(SequenceSampler(150, generator=generator, gather_epoch=gather_epoch)(td))

    at_once, one_by_one = epoch(True), epoch(False)
    assert len(at_once) == len(one_by_one) == 150
    for ours, theirs in zip(at_once, one_by_one, strict=True):
        assert (ours == theirs).all()
    steps = torch.cat([(mb["worker_index"] * 50 + mb["time_index"]).flatten() for mb in at_once])
    assert sorted(steps.tolist()) == list(range(200))


def test_row_slices_split_a_block_of_minibatches_at_a_time():
    # all minibatches split at once held a view per leaf and minibatch before the first was
    # used (1e5 minibatches: +1.2 GiB and seconds before the first one)
    td = TensorDict({"a": torch.arange(2000).view(1000, 2), ("n", "b"): torch.arange(1000)}, [1000])
    split = torch.Tensor.split_with_sizes
    pieces: list[int] = []

    def counted(self, sizes, *args, **kwargs):
        pieces.append(len(sizes))
        return split(self, sizes, *args, **kwargs)

    with mock.patch.object(torch.Tensor, "split_with_sizes", counted):
        slices = row_slices(td, [1] * 1000)
        first = next(slices)
        assert 0 < sum(pieces) <= 2 * 128  # a block (64) for each of the two leaves, not all
        assert torch.equal(first["a"], td["a"][:1])
        assert sum(1 for _ in slices) == 999
    assert sum(pieces) == 2 * 1000
