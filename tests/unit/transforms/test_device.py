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
