"""Unit tests of rppo_td/transforms/_base.py: batch transforms refuse to run inside an env."""

from __future__ import annotations

import pytest
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.envs import Compose, GymEnv, TransformedEnv
from torchrl.envs.utils import check_env_specs

from rppo_td import (
    GAE,
    DeviceMover,
    EpisodeSplitter,
    EpisodicNoveltyBonus,
    SequenceChunker,
    SequencePadder,
)
from tests.unit._data import small_rollout

REFUSAL = r"works on whole \[W, T\] rollouts"


def test_refuses_to_run_inside_an_env():
    env = TransformedEnv(GymEnv("CartPole-v1"), EpisodeSplitter())
    try:
        with pytest.raises(RuntimeError, match=r"EpisodeSplitter works on whole \[W, T\] rollouts"):
            env.reset()
    finally:
        env.close()


@pytest.mark.parametrize(
    "transform", [GAE(gamma=0.9, lmbda=0.9), SequencePadder()], ids=lambda t: type(t).__name__
)
def test_an_env_asking_for_specs_gets_the_refusal(transform):
    # before: TorchRL's "The key 'advantage' is unaccounted for by the transform" KeyError,
    # from the specs a collector or check_env_specs reads before any step
    env = TransformedEnv(GymEnv("CartPole-v1"), transform)
    try:
        for read in (lambda: env.observation_spec, lambda: env.action_spec):
            with pytest.raises(RuntimeError, match=REFUSAL):
                read()
        with pytest.raises(RuntimeError, match=REFUSAL):
            check_env_specs(env)
    finally:
        env.close()


def test_an_inverted_buffer_transform_is_told_to_run_on_sample():
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.append_transform(Compose(EpisodeSplitter()), invert=True)
    with pytest.raises(RuntimeError, match=r"runs on sample\(\) \(append_transform without invert"):
        rb.extend(small_rollout())


@pytest.mark.parametrize("lock", ["lock_", "share_memory_"])
def test_a_locked_rollout_is_refused_by_name_before_any_work(lock):
    # before: tensordict's "Cannot modify locked TensorDict", naming no transform or key
    td = small_rollout()
    with_ids = SequenceChunker(sequence_length=2)(EpisodeSplitter()(td.clone()))
    cases = [
        (GAE(gamma=0.9, lmbda=0.9), td, "advantage"),
        (EpisodeSplitter(), td, "episode_id"),
        (SequenceChunker(sequence_length=2), with_ids.exclude("sequence_id"), "sequence_id"),
        (EpisodicNoveltyBonus(0.1), td, "novel"),
    ]
    for transform, rollout, key in cases:
        locked = getattr(rollout.clone(), lock)()
        with pytest.raises(RuntimeError, match=rf"{type(transform).__name__} writes .*{key}"):
            transform(locked)
        # the way out the message gives: an unlocked shallow copy, sharing the data
        shallow = locked.clone(recurse=False)
        out = transform(shallow)
        assert set(transform.out_keys) <= set(out.keys(True, True))
    padded = SequencePadder()(with_ids.clone().lock_())  # reads only: a locked input is fine
    assert padded["loss_mask"].any()


def test_assigned_keys_other_than_its_own_are_refused():
    # before: accepted and ignored; the transform went on writing 'advantage'
    gae = GAE(gamma=0.9, lmbda=0.9)
    with pytest.raises(ValueError, match=r"GAE.out_keys lists the keys it writes.*set_keys"):
        gae.out_keys = ["adv", "vt"]
    with pytest.raises(ValueError, match=r"EpisodeSplitter.in_keys lists the keys it reads"):
        EpisodeSplitter().in_keys = ["done"]
    with pytest.raises(ValueError, match=r"DeviceMover\(device, keys=\[...\]\)"):
        DeviceMover("cpu", keys=["a"]).out_keys = ["b"]
    assert gae.out_keys == ["advantage", "value_target"]
    gae.out_keys = ["advantage", "value_target"]  # the same keys: nothing to refuse
    gae.set_keys(advantage="adv")
    out = gae(small_rollout())
    assert gae.out_keys == ["adv", "value_target"] and "adv" in out


def test_inv_is_identity_unless_overridden():
    td = small_rollout()
    for transform in (EpisodeSplitter(), SequencePadder()):
        out = transform.inv(td)
        assert set(out.keys(True, True)) == set(td.keys(True, True))
        assert (out == td).all()


def test_keys_type_checked():
    with pytest.raises(TypeError, match="keys must be a RolloutKeys, got tuple"):
        EpisodeSplitter(keys=("next", "done"))


def test_a_tensorclass_without_the_output_fields_is_refused_by_name():
    """tensordict's own AttributeError ("Cannot set the attribute 'advantage'") named no
    transform; a tensorclass that declares the fields takes them."""
    import torch
    from tensordict import TensorDict, tensorclass

    @tensorclass
    class Bare:
        state_value: torch.Tensor
        next: TensorDict

    @tensorclass
    class Declared:
        state_value: torch.Tensor
        next: TensorDict
        advantage: torch.Tensor | None = None
        value_target: torch.Tensor | None = None

    done = torch.zeros(2, 5, 1, dtype=torch.bool)
    step = TensorDict(
        {"reward": torch.ones(2, 5, 1), "state_value": torch.zeros(2, 5, 1), "done": done},
        [2, 5],
    )
    step["terminated"] = done
    gae = GAE(gamma=0.9, lmbda=0.9)
    with pytest.raises(ValueError, match=r"GAE writes \['advantage', 'value_target'\] .* Bare"):
        gae(Bare(state_value=torch.zeros(2, 5, 1), next=step.clone(), batch_size=[2, 5]))
    with pytest.raises(ValueError, match=r"EpisodeSplitter writes \['episode_id'\]"):
        EpisodeSplitter()(Bare(state_value=torch.zeros(2, 5, 1), next=step, batch_size=[2, 5]))
    out = gae(Declared(state_value=torch.zeros(2, 5, 1), next=step.clone(), batch_size=[2, 5]))
    assert out.advantage.shape == (2, 5, 1)
