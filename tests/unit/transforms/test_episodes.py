"""Unit tests of rppo_td/transforms/_episodes.py: EpisodeSplitter and SequenceChunker."""

from __future__ import annotations

import re

import pytest
import torch
from tensordict import TensorDict

from rppo_td import EpisodeSplitter, RolloutKeys, SequenceChunker
from tests.unit._data import small_rollout


def _done_rollout(rows):
    done = torch.tensor(rows, dtype=torch.bool).unsqueeze(-1)
    return TensorDict({"next": {"done": done}}, batch_size=done.shape[:2])


def test_splitter_golden():
    # worker 0 terminates at t=1 and is truncated at t=3: fragments [0, 1], [2, 3], [4]
    td = small_rollout()
    out = EpisodeSplitter()(td)
    assert out is td  # in place, by design
    assert td["episode_id"].tolist() == [[0, 0, 1, 1, 2], [3, 3, 3, 3, 3]]
    assert td["episode_id"].dtype == torch.int64


def test_splitter_reads_is_init():
    td = _done_rollout([[False, False, False, False]])
    td["is_init"] = torch.tensor([[True, False, True, False]]).unsqueeze(-1)
    assert EpisodeSplitter()(td)["episode_id"].tolist() == [[0, 0, 1, 1]]


def test_splitter_nested_keys():
    keys = RolloutKeys(
        done=("next", "agent", "done"), is_init=("agent", "is_init"), episode_id=("ids", "episode")
    )
    td = TensorDict(
        {
            "next": {"agent": {"done": torch.tensor([[[False], [True], [False]]])}},
            "agent": {"is_init": torch.zeros(1, 3, 1, dtype=torch.bool)},
        },
        batch_size=[1, 3],
    )
    assert EpisodeSplitter(keys=keys)(td)["ids", "episode"].tolist() == [[0, 0, 1]]


def test_chunker_golden():
    td = EpisodeSplitter()(small_rollout(num_steps=8))
    # worker 0: fragments [0, 1], [2, 3], [4..7]; worker 1: [0..7]
    out = SequenceChunker(sequence_length=3)(td)
    assert out is td
    assert td["sequence_id"].tolist() == [[0, 0, 1, 1, 2, 2, 2, 3], [4, 4, 4, 5, 5, 5, 6, 6]]
    assert td["sequence_offset"].tolist() == [[0, 1, 0, 1, 0, 1, 2, 0], [0, 1, 2, 0, 1, 2, 0, 1]]
    SequenceChunker(sequence_length=None)(td)
    assert td["sequence_id"].tolist() == [[0, 0, 1, 1, 2, 2, 2, 2], [3] * 8]


def test_chunker_reads_only_episode_id():
    # episode ids, however numbered, decide the cuts: only changes along time matter
    td = TensorDict({"episode_id": torch.tensor([[7, 7, 3, 3], [3, 3, 3, 9]])}, batch_size=[2, 4])
    SequenceChunker(sequence_length=None)(td)
    assert td["sequence_id"].tolist() == [[0, 0, 1, 1], [2, 2, 2, 3]]


@pytest.mark.parametrize("length", [0, -3, True, 2.5, "4"])
def test_chunker_rejects_bad_lengths(length):
    with pytest.raises(
        ValueError, match=re.escape(f"sequence_length must be an int >= 1 or None, got {length!r}")
    ):
        SequenceChunker(sequence_length=length)


@pytest.mark.parametrize(
    ("done", "message"),
    [
        (
            torch.zeros(2, 5, dtype=torch.bool),
            "('next', 'done') must have shape [2, 5, 1], got [2, 5]",
        ),
        (torch.zeros(2, 5, 1), "('next', 'done') must have dtype torch.bool, got torch.float32"),
        (
            torch.zeros(2, 5, 2, dtype=torch.bool),
            "('next', 'done') must have shape [2, 5, 1], got [2, 5, 2]",
        ),
    ],
)
def test_splitter_bad_done(done, message):
    td = small_rollout()
    del td["next", "done"]
    td["next"].set("done", done)
    with pytest.raises(ValueError, match=re.escape(message)):
        EpisodeSplitter()(td)


def test_splitter_bad_is_init_and_batch():
    td = small_rollout()
    td["is_init"] = td["is_init"].to(torch.uint8)
    with pytest.raises(
        ValueError, match=re.escape("'is_init' must have dtype torch.bool, got torch.uint8")
    ):
        EpisodeSplitter()(td)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "EpisodeSplitter expects a rollout with batch dims [W, T] (worker, time), "
            "got batch size [5]"
        ),
    ):
        EpisodeSplitter()(small_rollout()[0])


def test_splitter_missing_done():
    # without a done key, done is terminated | truncated, as in GAE
    expected = EpisodeSplitter()(small_rollout())["episode_id"]
    out = EpisodeSplitter()(small_rollout().exclude(("next", "done")))
    assert torch.equal(out["episode_id"], expected)
    with pytest.raises(KeyError) as info:
        EpisodeSplitter()(small_rollout().exclude(("next", "done"), ("next", "truncated")))
    assert info.value.args[0].startswith(
        "EpisodeSplitter needs ('next', 'done'), or ('next', 'terminated') and "
        "('next', 'truncated') to make it"
    )


def test_chunker_bad_episode_ids():
    with pytest.raises(KeyError) as info:
        SequenceChunker(sequence_length=2)(small_rollout())
    assert "'episode_id' is missing" in info.value.args[0]
    assert "Run EpisodeSplitter before SequenceChunker." in info.value.args[0]
    td = TensorDict({"episode_id": torch.zeros(2, 3, dtype=torch.int32)}, batch_size=[2, 3])
    with pytest.raises(
        ValueError, match=re.escape("'episode_id' must have dtype torch.int64, got torch.int32")
    ):
        SequenceChunker(sequence_length=2)(td)
    td = TensorDict({"episode_id": torch.zeros(2, 3, 1, dtype=torch.int64)}, batch_size=[2, 3])
    with pytest.raises(
        ValueError, match=re.escape("'episode_id' must have shape [2, 3], got [2, 3, 1]")
    ):
        SequenceChunker(sequence_length=2)(td)


def test_split_trajs_output_is_refused_by_the_key_alone():
    from rppo_td import GAE

    td = small_rollout()
    td["collector", "mask"] = torch.ones(td.batch_size, dtype=torch.bool)
    for transform in (EpisodeSplitter(), GAE(gamma=0.9, lmbda=0.9)):
        name = type(transform).__name__
        with pytest.raises(ValueError, match=rf"{name} got trajectories padded by TorchRL"):
            transform(td.clone())


def test_an_output_key_on_the_rollouts_own_data_is_refused():
    # RolloutKeys(episode_id="observation") overwrote the observations, silently
    from rppo_td import GAE

    td = small_rollout()
    td["observation"] = torch.randn(*td.batch_size, 3)
    observation = td["observation"].clone()
    keys = RolloutKeys(episode_id="observation")
    with pytest.raises(ValueError, match=r"EpisodeSplitter writes 'observation'.*overwritten"):
        EpisodeSplitter(keys=keys)(td)
    assert torch.equal(td["observation"], observation)
    split = EpisodeSplitter()(td)
    with pytest.raises(ValueError, match=r"SequenceChunker writes 'observation'"):
        SequenceChunker(sequence_length=2, keys=RolloutKeys(sequence_offset="observation"))(split)
    with pytest.raises(ValueError, match=r"GAE writes 'observation'"):
        GAE(gamma=0.9, lmbda=0.9, keys=RolloutKeys(value_target="observation"))(td)
    assert torch.equal(td["observation"], observation)
    # run again over its own outputs: replaced, as before
    again = SequenceChunker(sequence_length=2)(EpisodeSplitter()(split))
    assert torch.equal(again["episode_id"], split["episode_id"])
    GAE(gamma=0.9, lmbda=0.9)(GAE(gamma=0.9, lmbda=0.9)(td))


def _collected(workers=3, steps=12, seed=3):
    """A rollout as a collector writes it: an end at (w, t) is followed by a start at t + 1."""
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(workers, steps, 1, generator=g) < 0.25
    is_init = torch.zeros_like(done)
    is_init[:, 0] = True
    is_init[:, 1:] = done[:, :-1]
    return TensorDict(
        {
            "observation": torch.randn(workers, steps, 2, generator=g),
            "is_init": is_init,
            "state_value": torch.zeros(workers, steps, 1),
            "next": {
                "done": done,
                "terminated": done,
                "reward": torch.ones(workers, steps, 1),
                "state_value": torch.zeros(workers, steps, 1),
            },
        },
        [workers, steps],
    )


def test_a_transposed_rollout_is_refused_where_is_init_shows_it():
    """[T, W] given as [W, T] (torch.stack(steps) stacks on dim 0) was read across workers:
    GAE, the splitter and everything after them took it in silence."""
    from rppo_td import GAE

    rollout = _collected()
    assert rollout["next", "done"][:, :-1].any()
    flipped = rollout.transpose(0, 1).contiguous()
    message = r"batch size \[12, 3\] looks transposed: it must be \[W, T\]"
    with pytest.raises(ValueError, match=message):
        EpisodeSplitter()(flipped.clone())
    with pytest.raises(ValueError, match=message):
        GAE(gamma=0.9, lmbda=0.9)(flipped.clone())
    two = _collected(workers=2, seed=4).transpose(0, 1).contiguous()  # [12, 2]
    with pytest.raises(ValueError, match=r"batch size \[12, 2\] looks transposed"):
        EpisodeSplitter()(two)
    # the rollout itself, and one whose is_init marks only the first step (allowed), pass
    EpisodeSplitter()(rollout.clone())
    GAE(gamma=0.9, lmbda=0.9)(rollout.clone())
    partial = rollout.clone()
    partial["is_init"] = torch.zeros_like(partial["is_init"])
    partial["is_init"][:, 0] = True
    EpisodeSplitter()(partial)
    GAE(gamma=0.9, lmbda=0.9)(partial)
    # a small rollout marking some starts only, which reads as well down its rows (one end)
    done = torch.tensor([[1, 0], [1, 0]]).bool().unsqueeze(-1)
    small = TensorDict(
        {
            "is_init": torch.tensor([[1, 1], [1, 0]]).bool().unsqueeze(-1),
            "state_value": torch.zeros(2, 2, 1),
            "next": {
                "done": done,
                "terminated": done.clone(),
                "reward": torch.ones(2, 2, 1),
                "state_value": torch.zeros(2, 2, 1),
            },
        },
        [2, 2],
    )
    EpisodeSplitter()(small.clone())
    GAE(gamma=0.9, lmbda=0.9)(small.clone())
    # a meta rollout (shapes only) passes the splitter as before: no values to read
    shapes = rollout.select("is_init", ("next", "done")).to("meta")
    assert EpisodeSplitter()(shapes)["episode_id"].is_meta
