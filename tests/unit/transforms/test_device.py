"""Unit tests of rppo_td/transforms/_device.py: DeviceMover."""

from __future__ import annotations

import pytest
import torch

from rppo_td import DeviceMover
from tests.unit._data import small_rollout


def test_moves_everything_on_cpu():
    td = small_rollout()
    out = DeviceMover("cpu")(td)
    assert out.device == torch.device("cpu")
    assert (out == td).all()
    assert td.device is None  # the input keeps its (absent) device


def test_keys_subset_leaves_others_untouched():
    td = small_rollout()
    before = td.clone()
    mover = DeviceMover(torch.device("cpu"), keys=["observation", ("next", "reward")])
    out = mover(td)
    assert out is not td
    assert out.device is None
    for key in td.keys(True, True):
        # other keys are the very same tensors; moved keys already on the target are too
        assert out.get(key) is td.get(key), key
    assert (td == before).all()


def test_missing_key_is_named():
    with pytest.raises(KeyError) as info:
        DeviceMover("cpu", keys=[("next", "nothing")])(small_rollout())
    assert info.value.args[0].startswith("key ('next', 'nothing') is missing")


@pytest.mark.gpu
def test_cuda_pinned_non_blocking():
    td = small_rollout()
    out = DeviceMover("cuda")(td)
    assert out.device.type == "cuda"
    torch.cuda.synchronize()
    assert (out.cpu() == td).all()
    part = DeviceMover("cuda", keys=["observation"])(td)
    assert part["observation"].device.type == "cuda"
    assert part["action"].device.type == "cpu"
    torch.cuda.synchronize()
    assert torch.equal(part["observation"].cpu(), td["observation"])
    # and back to the CPU
    back = DeviceMover("cpu")(out)
    assert back.device == torch.device("cpu") and (back == td).all()


@pytest.mark.parametrize("keys", [None, ["observation"]])
@pytest.mark.parametrize("device", [None, "cpu"])
def test_padded_sequences_stay_lazy_where_nothing_moves(keys, device):
    # the README's padder -> DeviceMover -> sampler: a move to the device the leaves are on
    # gathers nothing, so the epoch still costs one gather of the rollout
    from rppo_td import EpisodeSplitter, SequenceChunker, SequencePadder
    from rppo_td._lazy import Pending, raw_leaves

    rollout = small_rollout(num_workers=3, num_steps=9)
    if device is not None:
        rollout = rollout.to(device)
    chunked = SequenceChunker(sequence_length=4)(EpisodeSplitter()(rollout))
    padded = SequencePadder()(chunked)
    expected = SequencePadder()(chunked).clone()  # gathered now
    out = DeviceMover("cpu", keys=keys)(padded)
    pending = [key for key, value in raw_leaves(out) if type(value) is Pending]
    moved = {"observation"} if keys else set()
    assert len(pending) == len(list(raw_leaves(padded))) - 4 - len(moved)  # the ids are not
    assert out.device == (torch.device("cpu") if keys is None else padded.device)
    assert (out == expected).all() and out.batch_size == expected.batch_size


@pytest.mark.parametrize("device", ["mps", "xpu"])
def test_a_device_this_machine_lacks_is_refused_when_built(device):
    # only CUDA was checked: an MPS mover built fine and failed at its first call
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, NotImplementedError):
        pass
    else:
        pytest.skip(f"this machine has {device}")
    with pytest.raises(ValueError, match=f"device '{device}' is not available: "):
        DeviceMover(device)


def test_nested_keys_are_moved_and_others_left():
    # every other test moves to the CPU, where the data is: a mover skipping nested keys passed
    out = DeviceMover("meta", keys=["observation", ("next", "reward")])(small_rollout())
    assert out["observation"].device.type == out["next", "reward"].device.type == "meta"
    assert out["action"].device.type == "cpu"
