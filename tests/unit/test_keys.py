"""Unit tests of rppo_td/_keys.py."""

from __future__ import annotations

import dataclasses

import pytest

from rppo_td import RolloutKeys


def test_defaults_are_torchrl_names():
    keys = RolloutKeys()
    assert keys.state_value == "state_value"
    assert keys.next_state_value == ("next", "state_value")
    assert keys.reward == ("next", "reward")
    assert keys.terminated == ("next", "terminated")
    assert keys.truncated == ("next", "truncated")
    assert keys.done == ("next", "done")
    assert keys.is_init == "is_init"
    assert keys.index_keys() == ("loss_mask", "worker_index", "time_index", "rollout_steps")


def test_overrides_and_frozen():
    keys = RolloutKeys(reward=("next", "agents", "reward"), loss_mask=("meta", "mask"))
    assert keys.reward == ("next", "agents", "reward")
    assert keys.index_keys()[0] == ("meta", "mask")
    with pytest.raises(dataclasses.FrozenInstanceError):
        keys.reward = "reward"  # type: ignore[misc]
