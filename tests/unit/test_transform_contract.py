"""The contract every rppo_td transform keeps, run over all of them.

- nested keys work (``RolloutKeys`` overrides pointing into nested sub-tensordicts, and nested
  observation keys from the strategies);
- keys a transform does not own pass through untouched;
- the input is not mutated, except where documented: GAE, EpisodeSplitter and SequenceChunker
  add their keys in place (and touch nothing else); SequencePadder and DeviceMover never write;
- each works inside ``torchrl.envs.transforms.Compose`` and as a ``torchrl.data.ReplayBuffer``
  transform;
- ``in_keys`` and ``out_keys`` name what it reads and writes (``out_keys`` are exactly the keys
  it adds, and its ``in_keys`` alone suffice), and ``set_keys(...)`` renames keys after
  construction exactly as ``keys=RolloutKeys(...)`` does (DeviceMover, which has no named keys,
  refuses it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDictBase
from torchrl.data import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
from torchrl.envs.transforms import Compose, Transform

from rppo_td import (
    GAE,
    DeviceMover,
    EpisodeSplitter,
    RolloutKeys,
    SequenceChunker,
    SequencePadder,
    SequenceReplaySampler,
    SequenceSampler,
)
from rppo_td.testing.strategies import rollouts
from tests.unit._data import NESTED

DEFAULT = RolloutKeys()
FIELDS = [name for name in RolloutKeys.__dataclass_fields__]


def _stages(keys: RolloutKeys) -> list[Transform]:
    return [
        GAE(gamma=0.9, lmbda=0.8, keys=keys),
        EpisodeSplitter(keys=keys),
        SequenceChunker(sequence_length=3, keys=keys),
        SequencePadder(keys=keys),
    ]


@dataclass
class Case:
    """A transform, how to bring a raw rollout to its input, and what it is allowed to do."""

    name: str
    make: Callable[[RolloutKeys], Transform]
    prepare: int  # how many of the pipeline stages run before it
    owns: Callable[[RolloutKeys], list] = field(default=lambda keys: [])
    in_place: bool = False
    regroups: bool = False


CASES = [
    Case(
        "GAE",
        lambda k: GAE(gamma=0.9, lmbda=0.8, keys=k),
        0,
        lambda k: [k.advantage, k.value_target],
        in_place=True,
    ),
    Case(
        "EpisodeSplitter",
        lambda k: EpisodeSplitter(keys=k),
        1,
        lambda k: [k.episode_id],
        in_place=True,
    ),
    Case(
        "SequenceChunker",
        lambda k: SequenceChunker(sequence_length=3, keys=k),
        2,
        lambda k: [k.sequence_id, k.sequence_offset],
        in_place=True,
    ),
    Case(
        "SequencePadder",
        lambda k: SequencePadder(keys=k),
        3,
        lambda k: list(k.index_keys()),
        regroups=True,
    ),
    Case("DeviceMover", lambda k: DeviceMover("cpu"), 4),
    Case("DeviceMover(keys)", lambda k: DeviceMover("cpu", keys=[k.reward, "action"]), 4),
]
IDS = [case.name for case in CASES]


def _prepare(td: TensorDictBase, case: Case, keys: RolloutKeys) -> TensorDictBase:
    for stage in _stages(keys)[: min(case.prepare, 3)]:
        td = stage(td)
    return td


def _leaves(td: TensorDictBase) -> set:
    return set(td.keys(include_nested=True, leaves_only=True))


def _nest(td: TensorDictBase) -> TensorDictBase:
    """The same rollout with every RolloutKeys key moved to its NESTED place."""
    out = td.clone()
    for name in FIELDS:
        old, new = getattr(DEFAULT, name), getattr(NESTED, name)
        if out.get(old, None) is not None:
            out.rename_key_(old, new)
    return out


def _unnest(td: TensorDictBase) -> TensorDictBase:
    out = td.clone()
    for name in FIELDS:
        old, new = getattr(NESTED, name), getattr(DEFAULT, name)
        if out.get(old, None) is not None:
            out.rename_key_(old, new)
    for empty in ("agent", "ids", ("next", "agent")):
        value = out.get(empty, None)
        if value is not None and not _leaves(value):
            del out[empty]
    return out


def _assert_equal(actual: TensorDictBase, expected: TensorDictBase) -> None:
    assert actual.batch_size == expected.batch_size
    assert _leaves(actual) == _leaves(expected)
    for key in _leaves(expected):
        assert actual.get(key).dtype == expected.get(key).dtype, key
        assert torch.equal(actual.get(key), expected.get(key)), key


@pytest.mark.parametrize("case", CASES, ids=IDS)
@given(td=rollouts())
def test_other_keys_pass_through_and_input_not_mutated(case, td):
    td = _prepare(td, case, DEFAULT)
    before = td.clone()
    tensors = {key: td.get(key) for key in _leaves(td)}
    out = case.make(DEFAULT)(td)
    owned = set(case.owns(DEFAULT))
    if case.in_place:
        # documented: the transform adds its keys to the input, and nothing else changes
        assert out is td
        assert _leaves(td) == _leaves(before) | owned
    else:
        assert out is not td
        _assert_equal(td, before)
        for key, tensor in tensors.items():
            assert td.get(key) is tensor, key
    if case.regroups:
        # SequencePadder regroups every key; none is lost or altered: inv gives them back
        assert _leaves(out) == _leaves(before) | owned
        _assert_equal(SequencePadder().inv(out), before)
    else:
        assert _leaves(out) == _leaves(before) | owned
        for key in _leaves(before):
            assert torch.equal(out.get(key), before.get(key)), key


@pytest.mark.parametrize("case", CASES, ids=IDS)
@given(td=rollouts(with_is_init=st.just(True)))
def test_nested_key_overrides(case, td):
    plain = _prepare(td.clone(), case, DEFAULT)
    nested = _prepare(_nest(td), case, NESTED)
    expected = case.make(DEFAULT)(plain)
    actual = case.make(NESTED)(nested)
    for name in FIELDS:
        if name in {
            "advantage",
            "value_target",
            "episode_id",
            "sequence_id",
            "sequence_offset",
            "loss_mask",
            "worker_index",
            "time_index",
            "rollout_steps",
        }:
            continue
        # none of the default places is read or written
        assert actual.get(getattr(DEFAULT, name), None) is None or getattr(
            DEFAULT, name
        ) == getattr(NESTED, name)
    _assert_equal(_unnest(actual), expected)


@given(td=rollouts(with_is_init=st.just(True)))
def test_samplers_with_nested_keys(td):
    chunked = _prepare(_nest(td), CASES[3], NESTED)
    padded = SequencePadder(keys=NESTED)(chunked)
    num_sequences = padded.batch_size[0]
    count = min(2, num_sequences)
    for source in (padded, chunked):
        sampler = SequenceSampler(count, generator=torch.Generator().manual_seed(0), keys=NESTED)
        minibatches = list(sampler(source))
        assert sum(int(mb["ids", "mask"].sum()) for mb in minibatches) == td.numel()
    replay = SequenceReplaySampler(count, generator=torch.Generator(), keys=NESTED)
    buffer = ReplayBuffer(storage=LazyTensorStorage(num_sequences), sampler=replay)
    buffer.extend(padded)
    assert sum(int(buffer.sample(1)["ids", "mask"].sum()) for _ in range(count)) == td.numel()


@given(td=rollouts())
def test_inside_compose(td):
    manual = td.clone()
    for stage in [*_stages(DEFAULT), DeviceMover("cpu")]:
        manual = stage(manual)
    composed = Compose(*_stages(DEFAULT), DeviceMover("cpu"))
    padded = composed(td.clone())
    _assert_equal(padded, manual)
    # Compose.inv runs SequencePadder.inv (the others' inv is the identity): back to [W, T]
    back = composed.inv(padded)
    assert back.batch_size == td.batch_size
    for key in _leaves(td):
        assert torch.equal(back.get(key), td.get(key)), key


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_as_replay_buffer_transform(case):
    # store [W, T] rollouts (one row per worker), sample rows, transform on the way out
    td = _prepare(_rollout_with_uid(), case, DEFAULT)
    num_workers = td.batch_size[0]
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(num_workers, ndim=1),
        sampler=SamplerWithoutReplacement(),
        transform=case.make(DEFAULT),
        batch_size=num_workers,
    )
    buffer.extend(td)
    out, info = buffer.sample(return_info=True)
    expected = case.make(DEFAULT)(td[info["index"]].clone())
    _assert_equal(out, expected)


def _rollout_with_uid():
    from tests.unit._data import small_rollout

    td = small_rollout(num_workers=3, num_steps=7)
    td["uid"] = torch.arange(3).view(3, 1).expand(3, 7).clone()
    return td


def test_full_pipeline_as_replay_buffer_transform():
    td = _rollout_with_uid()
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(3, ndim=1),
        sampler=SamplerWithoutReplacement(),
        transform=Compose(*_stages(DEFAULT)),
        batch_size=3,
    )
    # extend runs the inverse transforms: SequencePadder.inv lets the rollout through as is
    buffer.extend(td)
    _assert_equal(buffer.storage[:], td)
    for _ in range(2):  # two epochs of the without-replacement sampler
        padded = buffer.sample()
        assert padded.batch_dims == 2
        assert padded.batch_size[1] == 3  # Lp = min(L = 3, longest fragment)
        assert int(padded["loss_mask"].sum()) == td.numel()
        # every stored step comes back once; rows are in the sampled order
        back = SequencePadder().inv(padded)
        order = back["uid"][:, 0].argsort()
        expected = Compose(*_stages(DEFAULT)[:1])(td.clone())
        for key in _leaves(expected):
            assert torch.equal(back.get(key)[order], expected.get(key)), key


# --- in_keys / out_keys and set_keys ------------------------------------------------------
# What each transform reads (optional keys included) and writes, as RolloutKeys fields.
READS = {
    # is_init too: a start it marks without a done before it cuts GAE there
    "GAE": [
        "reward",
        "state_value",
        "next_state_value",
        "terminated",
        "done",
        "truncated",
        "is_init",
    ],
    "EpisodeSplitter": ["done", "is_init", "terminated", "truncated"],
    "SequenceChunker": ["episode_id"],
    "SequencePadder": ["sequence_id", "sequence_offset"],
}
WRITES = {
    "GAE": ["advantage", "value_target"],
    "EpisodeSplitter": ["episode_id"],
    "SequenceChunker": ["sequence_id", "sequence_offset"],
    "SequencePadder": ["loss_mask", "worker_index", "time_index", "rollout_steps"],
}
NAMED = [case for case in CASES if case.name in READS]


def _expected_keys(case: Case, keys: RolloutKeys) -> tuple[list, list]:
    if case.name == "DeviceMover":
        return [], []
    if case.name == "DeviceMover(keys)":
        return [keys.reward, "action"], [keys.reward, "action"]
    return (
        [getattr(keys, name) for name in READS[case.name]],
        [getattr(keys, name) for name in WRITES[case.name]],
    )


@pytest.mark.parametrize("keys", [DEFAULT, NESTED], ids=["default", "nested"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_in_keys_and_out_keys(case, keys):
    transform = case.make(keys)
    expected_in, expected_out = _expected_keys(case, keys)
    assert transform.in_keys == expected_in
    assert transform.out_keys == expected_out
    # repr shows them (TorchRL's default printed keys=[])
    assert f"in_keys={expected_in}" in repr(transform)
    assert f"out_keys={expected_out}" in repr(transform)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@given(td=rollouts())
def test_out_keys_are_what_is_written_and_in_keys_suffice(case, td):
    td = _prepare(td, case, DEFAULT)
    transform = case.make(DEFAULT)
    out = transform(td.clone())
    if case.name.startswith("DeviceMover"):
        return  # writes nothing new; moving keys is checked in test_device.py
    # out_keys: exactly the keys the transform adds
    assert _leaves(out) - _leaves(td) == set(transform.out_keys)
    # in_keys: the transform needs nothing else (the optional ones only where present)
    present = [key for key in transform.in_keys if td.get(key, None) is not None]
    alone = transform(td.select(*present))
    for key in transform.out_keys:
        assert torch.equal(alone.get(key), out.get(key)), key


@pytest.mark.parametrize("case", NAMED, ids=[case.name for case in NAMED])
@given(td=rollouts(with_is_init=st.just(True)))
def test_set_keys_equals_constructor_keys(case, td):
    nested = _prepare(_nest(td), case, NESTED)
    overrides = {name: getattr(NESTED, name) for name in FIELDS}
    renamed = case.make(DEFAULT)
    assert renamed.set_keys(**overrides) is renamed
    built = case.make(NESTED)
    assert renamed.keys == NESTED
    assert renamed.in_keys == built.in_keys and renamed.out_keys == built.out_keys
    _assert_equal(renamed(nested.clone()), built(nested.clone()))


@pytest.mark.parametrize("case", NAMED, ids=[case.name for case in NAMED])
def test_set_keys_one_key(case):
    transform = case.make(DEFAULT)
    name = WRITES[case.name][0]
    transform.set_keys(**{name: ("renamed", name)})
    assert transform.out_keys[0] == ("renamed", name)
    assert getattr(transform.keys, name) == ("renamed", name)
    # the other fields keep their defaults
    assert all(
        getattr(transform.keys, other) == getattr(DEFAULT, other)
        for other in FIELDS
        if other != name
    )
    td = _prepare(_rollout_with_uid(), case, DEFAULT)
    out = transform(td)
    assert out.get(("renamed", name), None) is not None
    if name != "loss_mask":  # the padder's input never holds a loss_mask
        assert out.get(getattr(DEFAULT, name), None) is None


@pytest.mark.parametrize("case", NAMED, ids=[case.name for case in NAMED])
def test_set_keys_refusals_leave_the_transform_unchanged(case):
    transform = case.make(DEFAULT)
    before = (transform.keys, list(transform.in_keys), list(transform.out_keys))
    with pytest.raises(ValueError, match=r"unknown key name\(s\) \['rewards'\]"):
        transform.set_keys(rewards=("next", "r"))
    # writing advantage over state_value would destroy it: RolloutKeys refuses the clash
    with pytest.raises(ValueError, match="are the same key"):
        transform.set_keys(advantage="state_value")
    with pytest.raises(TypeError, match="must be a str or a non-empty tuple"):
        transform.set_keys(reward=())
    assert (transform.keys, transform.in_keys, transform.out_keys) == before


def test_device_mover_set_keys_is_refused():
    mover = DeviceMover("cpu", keys=["action"])
    assert mover.set_keys() is mover
    with pytest.raises(ValueError, match=r"DeviceMover has no named keys: it moves \['action'\]"):
        mover.set_keys(reward="r")


def test_gae_with_a_value_network_lists_what_the_network_reads_and_the_values_it_writes():
    # it read observation and ("next", "observation") and wrote both values unlisted: a
    # rollout.select(*gae.in_keys) then lost the network's inputs
    from tensordict.nn import TensorDictModule

    from rppo_td import GAE

    critic = TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["state_value"])
    gae = GAE(gamma=0.9, lmbda=0.9, value_network=critic)
    assert gae.in_keys[-2:] == ["observation", ("next", "observation")]
    assert gae.out_keys == ["advantage", "value_target", "state_value", ("next", "state_value")]
    renamed = gae.set_keys(state_value="v", next_state_value=("next", "v"))
    assert renamed.out_keys == ["advantage", "value_target", "v", ("next", "v")]
