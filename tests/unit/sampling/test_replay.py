"""Unit tests of rppo_td/sampling/_replay.py: SequenceReplaySampler."""

from __future__ import annotations

import re
import signal

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rppo_td import SequenceReplaySampler

MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]]).bool()


def _buffer(sampler, mask=MASK):
    buffer = ReplayBuffer(storage=LazyTensorStorage(mask.shape[0]), sampler=sampler)
    uid = torch.arange(mask.shape[0]).unsqueeze(-1).expand(mask.shape)
    buffer.extend(TensorDict({"loss_mask": mask, "uid": uid}, batch_size=mask.shape))
    return buffer


def test_docstring_case():
    buffer = _buffer(SequenceReplaySampler(2, generator=torch.Generator()))
    assert sorted(int(buffer.sample(1)["loss_mask"].sum()) for _ in range(2)) == [4, 5]


def test_epochs_and_state_dict_round_trip(tmp_path):
    sampler = SequenceReplaySampler(2, generator=torch.Generator().manual_seed(0))
    buffer = _buffer(sampler)
    assert not sampler.ran_out
    first = buffer.sample(1)["uid"][:, 0].tolist()
    state = sampler.state_dict()
    sampler.dumps(tmp_path)
    second = buffer.sample(1)["uid"][:, 0].tolist()
    assert sampler.ran_out
    assert sorted(first + second) == [0, 1, 2, 3]
    # restoring the position replays the rest of the epoch
    sampler.load_state_dict(state)
    assert not sampler.ran_out
    assert buffer.sample(1)["uid"][:, 0].tolist() == second
    fresh = SequenceReplaySampler(2, generator=torch.Generator())
    fresh.loads(tmp_path)
    assert fresh.state_dict()["next"] == 1
    assert [g.tolist() for g in fresh.state_dict()["plan"]] == [g.tolist() for g in state["plan"]]
    # after an epoch ran out, the next sample starts a new one
    buffer.sample(1)
    assert not sampler.ran_out
    assert repr(sampler) == "SequenceReplaySampler(num_minibatches=2, balance='steps')"


def _order(buffer, n):
    return [buffer.sample(1)["uid"][:, 0].tolist() for _ in range(n)]


@pytest.mark.parametrize("how", ["state_dict", "dumps"])
def test_a_restored_sampler_draws_the_later_epochs_of_the_run_it_was_saved_from(tmp_path, how):
    # before: only the plan and position were saved, so every epoch after the current one
    # came from the new sampler's generator, not the saved one's
    def make():
        return SequenceReplaySampler(2, generator=torch.Generator().manual_seed(0))

    sampler = make()
    buffer = _buffer(sampler)
    _order(buffer, 3)  # one epoch and a half
    if how == "state_dict":
        state = buffer.state_dict()
    else:
        buffer.dumps(tmp_path)
    later = _order(buffer, 6)
    restored = _buffer(make())
    _order(restored, 5)  # another generator state and position, replaced below
    if how == "state_dict":
        restored.load_state_dict(state)
    else:
        restored.loads(tmp_path)
    assert _order(restored, 6) == later
    # a sampler without a generator of its own cannot take that state
    with pytest.raises(ValueError, match="has generator=None"):
        SequenceReplaySampler(2).load_state_dict(sampler.state_dict())


def test_balance_by_sequences():
    sampler = SequenceReplaySampler(4, generator=torch.Generator(), balance="sequences")
    buffer = _buffer(sampler)
    assert sorted(buffer.sample(1).batch_size[0] for _ in range(4)) == [1, 1, 1, 1]


def test_checks():
    with pytest.raises(ValueError, match="num_minibatches must be >= 1, got 0"):
        SequenceReplaySampler(0)
    with pytest.raises(ValueError, match="balance must be 'steps' or 'sequences', got 'x'"):
        SequenceReplaySampler(1, balance="x")
    with pytest.raises(
        ValueError,
        match=re.escape("num_minibatches must be in [1, 4] (the number of sequences), got 5"),
    ):
        _buffer(SequenceReplaySampler(5)).sample(1)
    buffer = ReplayBuffer(storage=LazyTensorStorage(3), sampler=SequenceReplaySampler(1))
    buffer.extend(TensorDict({"other": torch.zeros(3, 2)}, batch_size=[3, 2]))
    with pytest.raises(KeyError) as info:
        buffer.sample(1)
    assert "'loss_mask'" in info.value.args[0]
    buffer = ReplayBuffer(storage=LazyTensorStorage(3), sampler=SequenceReplaySampler(1))
    buffer.extend(TensorDict({"loss_mask": torch.ones(3, 2)}, batch_size=[3, 2]))
    with pytest.raises(
        ValueError,
        match=re.escape("'loss_mask' must be [N, Lp] bool in storage, got [3, 2] torch.float32"),
    ):
        buffer.sample(1)


def _padded(num_steps, length=4, pad_to=None):
    from rppo_td import EpisodeSplitter, SequenceChunker, SequencePadder
    from tests.unit._data import small_rollout

    rollout = small_rollout(2, num_steps)
    chunked = SequenceChunker(sequence_length=length)(EpisodeSplitter()(rollout))
    return SequencePadder(pad_to=pad_to)(chunked)


def _starts(minibatches):
    return sorted(
        (w, t)
        for mb in minibatches
        for w, t in zip(
            mb["worker_index"][:, 0].tolist(), mb["time_index"][:, 0].tolist(), strict=True
        )
    )


def test_several_for_loops_each_yield_one_epoch():
    # TorchRL's ReplayBuffer.__iter__ sets sampler.ran_out = False, then samples until True
    padded = _padded(9)
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(padded.batch_size[0]),
        sampler=SequenceReplaySampler(3, generator=torch.Generator().manual_seed(0)),
        batch_size=1,
    )
    buffer.extend(padded)
    expected = _starts([padded])
    orders = []
    for _ in range(3):
        epoch = [mb for mb in buffer]
        assert len(epoch) == 3
        assert buffer.sampler.ran_out
        assert _starts(epoch) == expected
        assert sum(int(mb["loss_mask"].sum()) for mb in epoch) == padded["loss_mask"].sum()
        orders.append([mb["worker_index"].tolist() + mb["time_index"].tolist() for mb in epoch])
    assert orders[0] != orders[1] or orders[1] != orders[2]  # each loop draws a new epoch


def test_one_buffer_emptied_and_refilled_with_pad_to():
    # the rollouts' own Lp differ (4, 1, 3); pad_to=L keeps the storage's shape fixed
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(32),
        sampler=SequenceReplaySampler(2, generator=torch.Generator().manual_seed(0)),
        batch_size=1,
    )
    for num_steps, own_length in ((9, 4), (1, 1), (3, 3)):
        assert _padded(num_steps).batch_size[1] == own_length
        padded = _padded(num_steps, pad_to=4)
        buffer.empty()
        buffer.extend(padded)
        for _ in range(2):
            epoch = list(buffer)
            assert len(epoch) == 2
            assert all(mb.batch_size[1] == 4 for mb in epoch)
            assert _starts(epoch) == _starts([padded])


def test_refill_with_another_lp_without_pad_to_is_refused_by_the_storage():
    # documented: LazyTensorStorage fixes [Lp] at the first extend, and raises before the
    # sampler runs; SequencePadder(pad_to=L) is the fix
    buffer = ReplayBuffer(storage=LazyTensorStorage(32), sampler=SequenceReplaySampler(2))
    buffer.extend(_padded(9))
    buffer.empty()
    with pytest.raises(RuntimeError, match="batch size"):
        buffer.extend(_padded(3))


@pytest.mark.parametrize("prefetch", [1, 2, 4])
def test_prefetch_never_serves_a_sequence_twice_in_an_epoch(prefetch):
    # TorchRL queues sample() calls ahead on threads while the sampler says batches remain:
    # without a count of the epoch's groups left, the queued calls drew the next epoch's
    # groups into this one (about one epoch in three served every sequence twice)
    count = 12
    mask = torch.ones(count, 4, dtype=torch.bool)
    for trial in range(10):
        buffer = ReplayBuffer(
            storage=LazyTensorStorage(count),
            sampler=SequenceReplaySampler(3, generator=torch.Generator().manual_seed(trial)),
            batch_size=1,
            prefetch=prefetch,
        )
        uid = torch.arange(count).unsqueeze(-1).expand(mask.shape)
        buffer.extend(TensorDict({"loss_mask": mask, "uid": uid}, batch_size=mask.shape))
        for _ in range(3):
            epoch = [mb["uid"][:, 0].tolist() for mb in buffer]
            assert len(epoch) == 3
            assert sorted(uid for group in epoch for uid in group) == list(range(count))


def test_storages_the_sampler_cannot_read_are_refused_by_name():
    from torchrl.data import ListStorage

    padded = TensorDict({"loss_mask": MASK}, batch_size=MASK.shape)
    listed = ReplayBuffer(storage=ListStorage(4), sampler=SequenceReplaySampler(2))
    listed.extend(padded)
    with pytest.raises(TypeError, match="ListStorage returned list"):
        listed.sample(1)
    two_dim = ReplayBuffer(storage=LazyTensorStorage(12, ndim=2), sampler=SequenceReplaySampler(2))
    two_dim.extend(padded)
    with pytest.raises(ValueError, match=r"1-dim storage .* LazyTensorStorage with ndim=2"):
        two_dim.sample(1)


def test_a_lazy_stack_storage_of_one_length_serves_and_of_two_is_refused_by_name():
    from torchrl.data.replay_buffers import LazyStackStorage

    def padded(count, length):
        mask = torch.ones(count, length, dtype=torch.bool)
        return TensorDict({"loss_mask": mask, "x": torch.randn(count, length)}, [count, length])

    buffer = ReplayBuffer(
        storage=LazyStackStorage(8),
        batch_size=1,
        sampler=SequenceReplaySampler(2, generator=torch.Generator().manual_seed(0)),
    )
    buffer.extend(padded(3, 4))
    assert sum(mb.batch_size[0] for mb in buffer) == 3
    buffer.extend(padded(3, 6))  # another rollout's Lp: tensordict's keyless stack error
    with pytest.raises(ValueError, match=r"'loss_mask' of shapes \[\(4,\), \(6,\)\].*pad_to"):
        buffer.sample()


def test_a_loaded_plan_is_copied_and_checked_against_the_storage():
    sampler = SequenceReplaySampler(2, generator=torch.Generator().manual_seed(0))
    buffer = _buffer(sampler)
    buffer.sample(1)
    state = sampler.state_dict()
    second = state["plan"][1].tolist()
    sampler.load_state_dict(state)
    state["plan"][1].fill_(99)  # the caller's tensor, changed after loading
    assert buffer.sample(1)["uid"][:, 0].tolist() == second
    # a plan for a larger storage: refused by name, not a raw IndexError from the storage
    small = _buffer(SequenceReplaySampler(1), mask=MASK[:2])
    small.sampler.load_state_dict({"plan": [torch.tensor([0, 3])], "next": 0})
    with pytest.raises(ValueError, match="reads stored sequence 3, but the storage holds 2"):
        small.sample(1)
    # the sampler pickles with its buffer (its lock is made anew)
    import pickle

    copy = pickle.loads(pickle.dumps(sampler))
    assert [g.tolist() for g in copy.state_dict()["plan"]] == [
        g.tolist() for g in sampler.state_dict()["plan"]
    ]


def test_a_write_to_the_buffer_starts_a_new_epoch():
    # a loop left early, then new sequences extended without empty(): the next loop finished
    # the old plan, over the new data, and never served two of the sequences
    mask = torch.ones(6, 2, dtype=torch.bool)
    sampler = SequenceReplaySampler(3, generator=torch.Generator().manual_seed(0))
    buffer = ReplayBuffer(storage=LazyTensorStorage(6), sampler=sampler, batch_size=1)
    uid = torch.arange(6).unsqueeze(-1).expand(6, 2)
    buffer.extend(TensorDict({"loss_mask": mask, "uid": uid}, batch_size=[6, 2]))
    for _ in buffer:
        break
    # without a write, the next loop serves the rest of that epoch (documented)
    rest = [mb["uid"][:, 0].tolist() for mb in buffer]
    assert len(rest) == 2
    for _ in buffer:
        break
    buffer.extend(TensorDict({"loss_mask": mask, "uid": uid + 100}, batch_size=[6, 2]))
    served = sorted(i for mb in buffer for i in mb["uid"][:, 0].tolist())
    assert served == [100, 101, 102, 103, 104, 105]
    # the hook of add() too (the buffer calls it after writing one element)
    for _ in buffer:
        break
    sampler.add(0)
    assert len([i for mb in buffer for i in mb["uid"][:, 0].tolist()]) == 6
    # a new epoch on request, without a write
    for _ in buffer:
        break
    sampler.ran_out = False
    assert len([i for mb in buffer for i in mb["uid"][:, 0].tolist()]) == 6


def test_an_epoch_is_planned_from_the_stored_loss_mask_alone():
    # the plan read every stored sequence's every leaf (storage.get of the whole buffer) to
    # read loss_mask: half of an image epoch's time. Now only the minibatches are read, and
    # the plans are the same as from the whole sequences
    from torchrl.data import LazyMemmapStorage

    lengths = torch.randint(1, 6, (12, 1), generator=torch.Generator().manual_seed(1))
    mask = torch.arange(5) < lengths
    data = TensorDict(
        {"loss_mask": mask, "uid": torch.arange(12).unsqueeze(-1).expand(12, 5)},
        batch_size=[12, 5],
    )
    orders = []
    # LazyMemmapStorage installs TorchRL's own SIGTERM/SIGINT handlers in the process
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        _plan_both(data, orders, LazyTensorStorage(16), LazyMemmapStorage(16))
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert orders[0] == orders[1]


def _plan_both(data, orders, *storages):
    for storage in storages:
        sampler = SequenceReplaySampler(3, generator=torch.Generator().manual_seed(0))
        buffer = ReplayBuffer(storage=storage, sampler=sampler)
        buffer.extend(data[:8])
        buffer.extend(data[8:])  # not full: only the first 12 of 16 rows are stored
        read = _count_reads(storage)
        order = [buffer.sample(1)["uid"][:, 0].tolist() for _ in range(3)]
        assert sorted(uid for group in order for uid in group) == list(range(12))
        orders.append(order)
        assert sum(read) == 12, read  # the three minibatches, nothing more


def _count_reads(storage) -> list[int]:
    """The number of sequences of each ``storage.get`` from now on."""
    read: list[int] = []
    get = storage.get

    def counted(index):
        read.append(torch.as_tensor(index).numel())
        return get(index)

    storage.get = counted
    return read
