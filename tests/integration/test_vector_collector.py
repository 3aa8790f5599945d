"""The trainer's own collector: TorchRL's collector interface, rollouts built on the device."""

from __future__ import annotations

import pytest
import torch
from torchrl.collectors import BaseCollector

from rppo_td.envs import CARTPOLE_NOVEL_ID, make_vector_env
from rppo_td.modules import RecurrentActorCritic, RecurrentCritic, RecurrentPolicy
from rppo_td.train._setup import env_spaces
from rppo_td.train._vector_collector import VectorCollector
from rppo_td.transforms import GAE

W, T = 3, 40


def _collector(device: str = "cpu", **net_kwargs) -> tuple[VectorCollector, RecurrentActorCritic]:
    torch.manual_seed(0)
    net = RecurrentActorCritic(*env_spaces(CARTPOLE_NOVEL_ID), hidden_size=8, **net_kwargs)
    net = net.to(device)
    env = make_vector_env(CARTPOLE_NOVEL_ID, W)
    policy = RecurrentPolicy(net)
    return (
        VectorCollector(
            env, policy, leaves=net.leaves, frames_per_batch=W * T, seed=0, device=device
        ),
        net,
    )


def test_iterates_as_a_torchrl_collector():
    collector, net = _collector()
    assert isinstance(collector, BaseCollector)
    collector.total_frames = 2 * W * T
    assert len(collector) == 2
    batches = list(collector)
    assert [tuple(b.batch_size) for b in batches] == [(W, T), (W, T)]
    td = batches[1]
    for key in net.state_keys:
        assert td[key].shape == td["next", key].shape == (W, T, 1, 8)
        # the state entering a step is the state after the previous one, zero at a reset
        following = td["next", key][:, :-1]
        starts = td["is_init"][:, 1:].view(W, T - 1, 1, 1)
        torch.testing.assert_close(td[key][:, 1:], torch.where(starts, 0.0, following))
    assert td["next", "done"].any(), "no episode ended"
    collector.shutdown()


def test_frames_per_batch_must_fill_every_env():
    net = RecurrentActorCritic(*env_spaces(CARTPOLE_NOVEL_ID), hidden_size=8)
    with pytest.raises(ValueError, match="multiple of the 3 envs"):
        VectorCollector(
            make_vector_env(CARTPOLE_NOVEL_ID, W),
            RecurrentPolicy(net),
            leaves=net.leaves,
            frames_per_batch=W * T + 1,
            seed=0,
        )


@pytest.mark.gpu
def test_rollouts_are_built_on_the_device():
    collector, net = _collector("cuda")
    td = collector.rollout()
    for key in ("observation", "action", "state_value", "is_init", *net.state_keys):
        assert td[key].device.type == "cuda", key
    assert td["next", "reward"].device.type == "cuda"
    out = GAE(gamma=0.99, lmbda=0.95, value_network=RecurrentCritic(net))(td)
    assert out["advantage"].device.type == "cuda"


def test_a_resumed_collector_stops_at_its_total_frames():
    # the frames counted were not restored: a resumed collector ran its whole budget again
    first, _ = _collector()
    first.total_frames = 3 * W * T
    next(iter(first))
    state = first.state_dict()
    first.shutdown()
    second, _ = _collector()
    second.total_frames = 3 * W * T
    second.load_state_dict(state)
    assert len(list(second)) == 2
    second.shutdown()
