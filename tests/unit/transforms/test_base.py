"""Unit tests of rppo_td/transforms/_base.py: batch transforms refuse to run inside an env."""

from __future__ import annotations

import pytest
from torchrl.envs import GymEnv, TransformedEnv

from rppo_td import EpisodeSplitter, SequencePadder
from tests.unit._data import small_rollout


def test_refuses_to_run_inside_an_env():
    env = TransformedEnv(GymEnv("CartPole-v1"), EpisodeSplitter())
    try:
        with pytest.raises(RuntimeError, match=r"EpisodeSplitter works on whole \[W, T\] rollouts"):
            env.reset()
    finally:
        env.close()


def test_inv_is_identity_unless_overridden():
    td = small_rollout()
    for transform in (EpisodeSplitter(), SequencePadder()):
        out = transform.inv(td)
        assert set(out.keys(True, True)) == set(td.keys(True, True))
        assert (out == td).all()


def test_keys_type_checked():
    with pytest.raises(TypeError, match="keys must be a RolloutKeys, got tuple"):
        EpisodeSplitter(keys=("next", "done"))
