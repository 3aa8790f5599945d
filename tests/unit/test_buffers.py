"""OutputPool and the reuse of output memory by SequencePadder and SequenceSampler.

The property: reusing memory is invisible. Whatever a caller keeps (outputs, views of
them, tensors autograd saved) is never overwritten, and every output equals the one
computed without any pool.
"""

from __future__ import annotations

import gc
import struct
import sys
import threading
import warnings
from unittest import mock

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rppo_td import EpisodeSplitter, SequenceChunker, SequencePadder, SequenceSampler
from rppo_td._buffers import OutputPool
from rppo_td.testing.strategies import rollouts


def test_memory_comes_back_once_the_output_is_gone():
    pool, like = OutputPool(), torch.zeros(1)
    a = pool.empty("x", (2048, 1024), like)
    b = pool.empty("x", (2048, 1024), like)
    assert a.data_ptr() != b.data_ptr()  # a is alive
    ptr = a.data_ptr()
    del a
    assert pool.empty("x", (2048, 1024), like).data_ptr() == ptr
    view = b[1:]  # a view keeps b's memory in use
    del b
    c = pool.empty("x", (2048, 1024), like)
    assert c.data_ptr() != view.data_ptr() - view.stride(0) * view.element_size()


def test_memory_sent_to_another_process_is_never_reused():
    pool, like = OutputPool(), torch.zeros(1)
    a = pool.empty("x", (2048, 1024), like)
    # torch.multiprocessing moves a sent tensor's storage to shared memory; the sender then
    # drops it, but the receiving process may still read it
    sent = a.share_memory_().data_ptr()
    del a
    for _ in range(3):
        assert pool.empty("x", (2048, 1024), like).data_ptr() != sent


def test_memory_saved_for_backward_is_not_reused_until_the_backward():
    pool, like = OutputPool(), torch.zeros(1)
    kept = []
    for _ in range(3):  # both slots saved by graphs: the third output gets new memory
        a = pool.empty("x", (3, 2**21), like).fill_(2.0)
        weight = torch.ones(3, 2**21, requires_grad=True)
        loss = (weight * a).sum()
        kept.append((loss, weight, a.data_ptr()))
        del a
    assert len({ptr for *_, ptr in kept}) == 3
    for loss, weight, _ in kept:
        loss.backward()
        assert torch.equal(weight.grad, torch.full((3, 2**21), 2.0))  # nothing was overwritten


def test_larger_requests_replace_a_free_buffer_and_other_dtypes_are_apart():
    pool = OutputPool()
    small = pool.empty("x", (2**21,), torch.zeros(1))
    del small
    big = pool.empty("x", (2**22,), torch.zeros(1))
    assert big.shape == (2**22,)
    ints = pool.empty("x", (2**22,), torch.zeros(1, dtype=torch.int64))
    assert ints.dtype == torch.int64 and ints.data_ptr() != big.data_ptr()


def test_small_outputs_are_not_pooled():
    pool = OutputPool()
    pool.empty("x", (16,), torch.zeros(1))
    assert pool._buffers == {}


def test_a_copied_owner_starts_with_an_empty_pool():
    import copy

    padder = SequencePadder()
    td = SequenceChunker(sequence_length=4)(EpisodeSplitter()(_rollout(0)))
    padder(td)
    assert copy.deepcopy(padder)._pool._buffers == {}


def test_a_copied_or_unpickled_pool_hands_out_buffers():
    # a copy (a padder deep-copied, or pickled to another process) had no lock: its first
    # pooled output raised AttributeError
    import copy
    import pickle

    pool, like = OutputPool(), torch.zeros(1)
    pool.empty("x", (2048, 1024), like)
    for other in (copy.deepcopy(pool), pickle.loads(pickle.dumps(pool))):
        a = other.empty("x", (2048, 1024), like)
        b = other.empty("x", (2048, 1024), like)
        assert a.shape == (2048, 1024) and a.data_ptr() != b.data_ptr()
        assert len(other._buffers[("x", torch.float32)]) == 2


def _rollout(seed):
    torch.manual_seed(seed)
    done = torch.rand(3, 20, 1) < 0.2
    from tensordict import TensorDict

    return TensorDict(
        {
            "observation": torch.randn(3, 20, 5),
            "big": torch.randn(3, 20, 4096),
            "next": {"done": done, "reward": torch.randn(3, 20, 1)},
        },
        batch_size=[3, 20],
    )


@given(rollout=rollouts(), seed=st.integers(0, 2**16), keep=st.sampled_from([0, 1, 2]))
@settings(max_examples=30, deadline=None)
def test_kept_outputs_are_never_overwritten_and_every_output_is_exact(rollout, seed, keep):
    """Three updates through one padder and one sampler, keeping some outputs alive.

    ``keep``: 0 keeps nothing, 1 the padded output of each update, 2 every minibatch too.
    Everything kept still equals a fresh computation at the end, and each output equals
    the one of a pool-free path (``td[index]``) at the time it is made.
    """
    # each update ends with a collection, so that what it dropped is freed; frozen, the
    # session's older objects are not scanned again (a full collection costs ~0.3 s)
    gc.freeze()
    try:
        with mock.patch("rppo_td._buffers.MIN_BYTES", 0):  # pool every leaf, however small
            _three_updates(rollout, seed, keep)
    finally:
        gc.unfreeze()


def _three_updates(rollout, seed, keep):
    td = SequenceChunker(sequence_length=3)(EpisodeSplitter()(rollout))
    padder = SequencePadder()
    sampler = SequenceSampler(1, generator=torch.Generator().manual_seed(seed))
    lazy = SequenceSampler(1, generator=torch.Generator().manual_seed(seed))
    reference_sampler = SequenceSampler(1, generator=torch.Generator().manual_seed(seed))
    # one minibatch per epoch, so reuse overwrites nothing within an epoch; across epochs
    # its buffer is pooled
    reused = SequenceSampler(
        1, generator=torch.Generator().manual_seed(seed), reuse_memory=True, gather_epoch=False
    )
    kept, expected = [], []
    for update in range(3):
        x = td.apply(lambda v, u=update: v + u if v.is_floating_point() else v)
        padded = padder(x)
        fresh = SequencePadder()(x)
        assert (padded == fresh).all()
        if keep >= 1:
            kept.append(padded)
            expected.append(fresh.clone())
        groups = list(reference_sampler._groups(fresh.get("loss_mask").sum(-1), fresh))
        for index, mb, from_rollout, from_reused in zip(
            groups, sampler(padded), lazy(x), reused(x), strict=True
        ):
            reference = fresh[index]
            assert (mb == reference).all()
            assert (from_rollout == reference).all()
            assert (from_reused == reference).all()
            if keep == 2:
                kept += [mb, from_rollout, from_reused]
                expected += [reference.clone(), reference.clone(), reference.clone()]
        del padded, fresh
        gc.collect()
    for got, want in zip(kept, expected, strict=True):
        assert (got == want).all()


def test_large_leaves_that_require_grad_keep_their_gradients():
    """Padder and samplers on a rollout whose large leaves require grad.

    Each real step's gradient arrives once and padding passes none back (the zero fill is
    recorded by autograd), through the padder, the lazy sampler and the padded sampler.
    """
    from tensordict import TensorDict

    torch.manual_seed(0)
    w, t, width = 2, 1100, 1024  # 8.6 MiB padded: large enough to be pooled if allowed
    weight = torch.randn(w, t, width, requires_grad=True)
    rollout = TensorDict(
        {"obs": weight * 1.0, "next": {"done": torch.rand(w, t, 1) < 0.05}}, batch_size=[w, t]
    )
    td = SequenceChunker(sequence_length=8)(EpisodeSplitter()(rollout))
    scale = 1.0 + torch.arange(width)
    for make in (
        lambda: [SequencePadder()(td)],
        lambda: list(SequenceSampler(2)(td)),
        lambda: list(SequenceSampler(2)(SequencePadder()(td))),
    ):
        weight.grad = None
        sum((o["obs"] * scale).sum() for o in make()).backward(retain_graph=True)
        assert torch.equal(weight.grad, scale.expand(w, t, width))


def test_inference_mode_and_normal_calls_mix():
    """Calls inside and outside ``torch.inference_mode`` in any order give exact outputs."""
    from tensordict import TensorDict

    torch.manual_seed(0)
    rollout = TensorDict(
        {"obs": torch.randn(2, 1100, 1024), "next": {"done": torch.rand(2, 1100, 1) < 0.05}},
        batch_size=[2, 1100],
    )
    td = SequenceChunker(sequence_length=8)(EpisodeSplitter()(rollout))
    padder, sampler = SequencePadder(), SequenceSampler(2)
    expected = SequencePadder()(td)["obs"].clone()
    for inference in (True, False, True, False):
        with torch.inference_mode(inference):
            out = padder(td)
            assert torch.equal(out["obs"], expected)
            assert sum(mb["loss_mask"].sum() for mb in sampler(td)) == 2200
        del out


def test_memory_whose_storage_object_is_held_is_not_reused():
    # torch hands the probe the storage object a caller holds, which added no use of its
    # own: the caller's use was subtracted and the memory written under it
    pool = OutputPool()
    like = torch.zeros(1)
    for hold in (torch.Tensor.untyped_storage, torch.Tensor.storage):
        out = pool.empty("x", (2048, 1024), like).fill_(1.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
            kept = hold(out)
        ptr = out.data_ptr()
        del out
        again = pool.empty("x", (2048, 1024), like)
        assert again.data_ptr() != ptr
        again.fill_(2.0)
        raw = kept.untyped() if hold is torch.Tensor.storage else kept
        assert struct.unpack("f", bytes(raw[i] for i in range(4))) == (1.0,)
        del kept, raw, again


def test_two_threads_never_get_one_buffer():
    pool = OutputPool()
    like = torch.zeros(1)
    pool.empty("x", (2048, 1024), like)  # the slots exist, both free
    pool.empty("x", (2048, 1024), like)

    def take(barrier: threading.Barrier, got: list[torch.Tensor]) -> None:
        barrier.wait()
        got.append(pool.empty("x", (2048, 1024), like))

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch often: the race shows in 1 of ~10 trials
    try:
        for _ in range(300):
            barrier = threading.Barrier(2)
            got: list[torch.Tensor] = []
            threads = [threading.Thread(target=take, args=(barrier, got)) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert got[0].data_ptr() != got[1].data_ptr()
    finally:
        sys.setswitchinterval(switch)
