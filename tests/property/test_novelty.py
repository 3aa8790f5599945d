"""EpisodicNoveltyBonus and functional.episodic_novelty against the per-worker set reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDict
from torchrl.envs.transforms import Compose

from rppo_td import (
    GAE,
    EpisodeSplitter,
    EpisodicNoveltyBonus,
    RolloutKeys,
    SequenceChunker,
    SequencePadder,
    functional,
)
from rppo_td.testing.reference import reference_episodic_novelty
from rppo_td.testing.strategies import episode_ends
from tests.unit._data import NESTED

_DTYPES = [torch.int64, torch.uint8, torch.float32, torch.bool]


@st.composite
def rollout_streams(draw: st.DrawFn):
    """Consecutive ``[W, T]`` rollouts of the same workers, with few distinct observations.

    Each rollout's first observation is the previous one's last next observation where the
    episode goes on, as a collector writes them. Some carry ``is_init``; some use two
    observation keys, one nested.
    """
    workers = draw(st.integers(1, 4), label="W")
    steps = draw(st.integers(1, 6), label="T")
    count = draw(st.integers(1, 4), label="rollouts")
    dtype = draw(st.sampled_from(_DTYPES), label="dtype")
    # 12 int64s: 12 words, wide enough for the hashed numbering of rows
    width = draw(st.sampled_from([2, 12]), label="width of the first key")
    two_keys = draw(st.booleans(), label="two observation keys")
    with_is_init = draw(st.booleans(), label="is_init")
    use_flags = draw(st.booleans(), label="terminated/truncated without done")
    values = 2 if dtype == torch.bool else draw(st.integers(1, 4), label="distinct values")
    seed = draw(st.integers(0, 2**31 - 1), label="seed")
    gen = torch.Generator().manual_seed(seed)

    def observations(shape):
        x = torch.randint(0, values, shape, generator=gen)
        return x.bool() if dtype == torch.bool else x.to(dtype)

    rollouts = []
    last = {"a": observations((workers, width)), "b": observations((workers, 1))}
    for _ in range(count):
        terminated, truncated = draw(episode_ends(workers, steps, end_rate=3), label="ends")
        done = (terminated | truncated).squeeze(-1)
        nxt = {
            "a": observations((workers, steps, width)),
            "b": observations((workers, steps, 1)),
        }
        obs = {}
        for name, size in (("a", width), ("b", 1)):
            # a reset after done: a fresh first observation; else the previous next one
            previous = torch.cat([last[name].unsqueeze(1), nxt[name][:, :-1]], 1)
            reset = observations((workers, steps, size))
            after_done = torch.cat([torch.zeros(workers, 1, dtype=torch.bool), done[:, :-1]], 1)
            obs[name] = torch.where(after_done.unsqueeze(-1), reset, previous)
            last[name] = nxt[name][:, -1]
        td = TensorDict(
            {
                "observation": obs["a"],
                "next": {"observation": nxt["a"], "reward": torch.zeros(workers, steps, 1)},
            },
            batch_size=[workers, steps],
        )
        if two_keys:
            td.set(("pixels", "cell"), obs["b"])
            td.set(("next", "pixels", "cell"), nxt["b"])
        if use_flags:
            td.set(("next", "terminated"), terminated)
            td.set(("next", "truncated"), truncated)
        else:
            td.set(("next", "done"), terminated | truncated)
        if with_is_init:
            flags = torch.rand(workers, steps, 1, generator=gen) < 0.15
            td.set("is_init", flags)
        rollouts.append(td)
    keys = ("observation", ("pixels", "cell")) if two_keys else ("observation",)
    return rollouts, keys


@given(stream=rollout_streams(), coef=st.sampled_from([0.0, 0.25, 1.0]))
def test_bonus_matches_reference(stream, coef):
    rollouts, keys = stream
    bonus = EpisodicNoveltyBonus(coef, observation_keys=keys)
    expected = reference_episodic_novelty(rollouts, keys)
    for td, novel in zip(rollouts, expected, strict=True):
        reward = td.get(("next", "reward")).clone()
        out = bonus(td.clone())
        flags = out.get(("next", "novel"))
        assert flags.dtype == torch.bool and flags.shape == (*td.batch_size, 1)
        assert flags.squeeze(-1).tolist() == novel
        torch.testing.assert_close(
            out.get(("next", "reward")), reward + coef * flags.float(), rtol=0, atol=0
        )


@given(stream=rollout_streams(), cut=st.integers(0, 3))
def test_state_dict_resumes_exactly(stream, cut):
    # a checkpoint after `cut` rollouts, loaded into a fresh transform, gives the same flags
    rollouts, keys = stream
    cut = min(cut, len(rollouts))
    first = EpisodicNoveltyBonus(0.5, observation_keys=keys)
    for td in rollouts[:cut]:
        first(td.clone())
    state = first.state_dict()
    resumed = EpisodicNoveltyBonus(0.5, observation_keys=keys)
    resumed.load_state_dict(state)
    for td in rollouts[cut:]:
        a = first(td.clone()).get(("next", "novel"))
        b = resumed(td.clone()).get(("next", "novel"))
        assert torch.equal(a, b)


@given(stream=rollout_streams())
def test_reset_starts_every_episode_fresh(stream):
    rollouts, keys = stream
    bonus = EpisodicNoveltyBonus(0.1, observation_keys=keys)
    for td in rollouts[:-1]:
        bonus(td.clone())
    bonus.reset()
    got = bonus(rollouts[-1].clone()).get(("next", "novel")).squeeze(-1).tolist()
    assert got == reference_episodic_novelty(rollouts[-1:], keys)[0]


def test_functional_carry_and_words():
    obs = torch.tensor([[[0], [1], [0]]])
    nxt = torch.tensor([[[1], [0], [2]]])
    start = torch.tensor([[True, False, False]])
    novel, carry = functional.episodic_novelty(obs, nxt, start)
    assert novel.tolist() == [[True, False, True]]
    # the next rollout continues the episode: 0, 1 and 2 are known, 3 is new
    novel, carry = functional.episodic_novelty(
        torch.tensor([[[2], [2]]]),
        torch.tensor([[[1], [3]]]),
        torch.tensor([[False, False]]),
        carry,
    )
    assert novel.tolist() == [[False, True]]
    assert sorted(carry.rows.squeeze(1).tolist()) == [0, 1, 2, 3]
    # a plain (rows, worker) pair is a carry too (it raised AttributeError: no 'rows')
    again, _ = functional.episodic_novelty(
        torch.tensor([[[2], [2]]]),
        torch.tensor([[[1], [4]]]),
        torch.tensor([[False, False]]),
        (carry.rows, carry.worker),
    )
    assert again.tolist() == [[False, True]]
    with pytest.raises(TypeError, match="carry must be a NoveltyCarry"):
        functional.episodic_novelty(obs, nxt, start, [carry.rows])
    # a new episode at column 0 ignores the carry
    novel, _ = functional.episodic_novelty(
        torch.tensor([[[5]]]), torch.tensor([[[1]]]), torch.tensor([[True]]), carry
    )
    assert novel.tolist() == [[True]]
    # floats compare by their bits
    words = functional.observation_words(torch.tensor([[[0.0], [-0.0]]]))
    assert not torch.equal(words[0, 0], words[0, 1])
    assert functional.observation_words(torch.zeros(2, 3, 0)).shape == (2, 3, 1)


def test_empty_rollouts():
    novel, carry = functional.episodic_novelty(
        torch.zeros(2, 0, 1, dtype=torch.int64),
        torch.zeros(2, 0, 1, dtype=torch.int64),
        torch.zeros(2, 0, dtype=torch.bool),
    )
    assert novel.shape == (2, 0) and carry.rows.shape == (0, 1)
    # the words of an empty rollout (reshape(-1) could not infer the feature size)
    assert functional.observation_words(torch.randn(0, 4, 3)).shape == (0, 4, 2)
    assert functional.observation_words(torch.randn(3, 0, 3)).shape == (3, 0, 2)
    # before: "self.stride(-1) must be 1 to view Long as Byte" for an empty strided view
    strided = torch.zeros(3, 4, 4, dtype=torch.int64)[..., ::2]
    assert functional.observation_words(strided[:, :0]).shape == (3, 0, 2)
    assert functional.observation_words(strided).shape == (3, 4, 2)
    for workers, steps in ((0, 4), (3, 0)):
        out = EpisodicNoveltyBonus(0.1)(_rollout(workers, steps))
        assert out["next", "reward"].shape == (workers, steps, 1)


def test_episodic_novelty_names_the_argument_of_the_wrong_shape():
    # before: a start of the wrong shape was blamed on observation, [W, T] read from start
    words = torch.zeros(1, 2, 1, dtype=torch.int64)
    wrong_start = r"start must have shape \[W, T\] = \[1, 2\].*got \[1, 1\]"
    with pytest.raises(ValueError, match=wrong_start):
        functional.episodic_novelty(words, words, torch.ones(1, 1, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"next_observation must have observation's shape"):
        functional.episodic_novelty(words, words[:, :1], torch.ones(1, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"observation must have shape \[W, T, D\]"):
        functional.episodic_novelty(words[0], words, torch.ones(1, 2, dtype=torch.bool))


def test_observation_words_refuse_batch_dims_outside_the_tensor():
    # batch_dims=3 on [2, 3] acted as 2, and -1 was read as a slice
    with pytest.raises(ValueError, match=r"batch_dims must be in \[1, observation.ndim = 2\]"):
        functional.observation_words(torch.zeros(2, 3), batch_dims=3)
    with pytest.raises(ValueError, match="got -1"):
        functional.observation_words(torch.zeros(2, 3, 4), batch_dims=-1)
    assert functional.observation_words(torch.zeros(2, 3), batch_dims=2).shape == (2, 3, 1)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_observation_words_of_a_view_at_an_unaligned_offset(dtype):
    # a view into a larger buffer (a memmap's header): int64 words need aligned bytes
    buffer = torch.arange(2 * 3 * 8 + 1).to(dtype)
    view = buffer[1:].view(2, 3, 8)
    words = functional.observation_words(view)
    assert torch.equal(words, functional.observation_words(view.clone()))
    td = _rollout(steps=3)
    td["observation"] = view
    td["next", "observation"] = view.roll(1, dims=1)
    aligned = td.clone()  # fresh storage for every leaf
    assert aligned["observation"].storage_offset() == 0
    # two bonuses: each carries its episodes' observations to the next call
    ours = EpisodicNoveltyBonus(1.0)(td)["next", "reward"]
    assert torch.equal(ours, EpisodicNoveltyBonus(1.0)(aligned)["next", "reward"])
    assert ours.sum() > 0


def _rollout(workers=2, steps=3, reward_dtype=torch.float32):
    return TensorDict(
        {
            "observation": torch.zeros(workers, steps, 2, dtype=torch.int64),
            "next": {
                "observation": torch.ones(workers, steps, 2, dtype=torch.int64),
                "reward": torch.zeros(workers, steps, 1, dtype=reward_dtype),
                "done": torch.zeros(workers, steps, 1, dtype=torch.bool),
            },
        },
        batch_size=[workers, steps],
    )


def test_observations_of_another_size_in_the_same_words_are_refused():
    # before: carried rows compare as 8-byte words, so a float32 [1] observation carried into
    # a rollout of float32 [2] ones (or float64 [1]) was accepted, and [1.0, 0.0] matched the
    # zero-padded carried [1.0]: a step never seen was not novel
    def rollout(obs, next_obs):
        return TensorDict(
            {
                "observation": obs,
                "next": {
                    "observation": next_obs,
                    "reward": torch.zeros(1, 1, 1),
                    "done": torch.zeros(1, 1, 1, dtype=torch.bool),
                },
            },
            batch_size=[1, 1],
        )

    first = rollout(torch.tensor([[[0.0]]]), torch.tensor([[[1.0]]]))
    for later in (
        rollout(torch.tensor([[[2.0, 2.0]]]), torch.tensor([[[1.0, 0.0]]])),
        rollout(torch.tensor([[[2.0]]], dtype=torch.float64), torch.ones(1, 1, 1).double()),
    ):
        bonus = EpisodicNoveltyBonus(0.1)
        bonus(first.clone())
        with pytest.raises(ValueError, match=r"torch.float32 \[1\] \(8 bytes\), but got"):
            bonus(later.clone())
        restored = EpisodicNoveltyBonus(0.1)
        restored.load_state_dict(bonus.state_dict())  # the carry's description goes with it
        with pytest.raises(ValueError, match="call reset"):
            restored(later.clone())
        bonus.reset()
        assert bool(bonus(later.clone())["next", "novel"].all())


def test_refusals_name_the_key_or_setting():
    bonus = EpisodicNoveltyBonus(0.1)
    td = bonus(_rollout())
    with pytest.raises(ValueError, match=r"holds \('next', 'novel'\) already"):
        bonus(td)
    with pytest.raises(ValueError, match="carries the open episodes of 2 workers"):
        bonus(_rollout(workers=3))
    bonus.reset()
    bonus(_rollout(workers=3))  # after reset() another W is fine
    with pytest.raises(ValueError, match="reward"):
        EpisodicNoveltyBonus(0.1)(_rollout(reward_dtype=torch.int64))
    for coef in (-1.0, float("nan"), float("inf"), True, "0.1"):
        with pytest.raises(ValueError, match="coef"):
            EpisodicNoveltyBonus(coef)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="coef"):
        bonus.coef = -0.5
    with pytest.raises(TypeError, match="observation_keys"):
        EpisodicNoveltyBonus(0.1, observation_keys="observation")
    with pytest.raises(KeyError, match="pixels"):
        EpisodicNoveltyBonus(0.1, observation_keys=["pixels"])(_rollout())
    with pytest.raises(ValueError, match="observation_keys must name"):
        EpisodicNoveltyBonus(0.1, observation_keys=[])
    # before: refused at the call as "its bonus was added already", or a read key replaced
    with pytest.raises(ValueError, match=r"novel_key=\('next', 'done'\) is a key it reads"):
        EpisodicNoveltyBonus(0.1, novel_key=("next", "done"))
    # a key field moved onto novel_key (refused at the next call before) or onto an
    # observation key (the observation was read as is_init, silently): refused by set_keys,
    # the keys left as they were
    bonus = EpisodicNoveltyBonus(0.1, novel_key="flags")
    with pytest.raises(ValueError, match="novel_key='flags' is a key it reads"):
        bonus.set_keys(done="flags")
    with pytest.raises(ValueError, match="is_init='observation' is one of the observation keys"):
        bonus.set_keys(is_init="observation")
    assert bonus.keys == EpisodicNoveltyBonus(0.1, novel_key="flags").keys


def test_observations_must_be_comparable_leaves():
    td = _rollout()
    td.set(("next", "observation"), td.get(("next", "observation")).int())
    with pytest.raises(ValueError, match="same shape and dtype"):
        EpisodicNoveltyBonus(0.1)(td)
    td = _rollout()
    td.set(("group", "x"), torch.zeros(2, 3, 1))
    td.set(("next", "group", "x"), torch.zeros(2, 3, 1))
    with pytest.raises(ValueError, match="must hold a tensor"):
        EpisodicNoveltyBonus(0.1, observation_keys=["group"])(td)
    out = EpisodicNoveltyBonus(0.1, observation_keys=[("group", "x")])(td)
    assert not out.get(("next", "novel")).any()  # zeros after zeros: nothing new


@given(stream=rollout_streams())
def test_nested_key_overrides_and_set_keys(stream):
    rollouts, keys = stream
    nested = NESTED
    plain = EpisodicNoveltyBonus(0.5, observation_keys=keys)
    moved = EpisodicNoveltyBonus(0.5, observation_keys=keys, keys=nested)
    renamed = EpisodicNoveltyBonus(0.5, observation_keys=keys).set_keys(
        reward=nested.reward, done=nested.done, is_init=nested.is_init
    )
    renamed.set_keys(terminated=nested.terminated, truncated=nested.truncated)
    assert renamed.in_keys == moved.in_keys and renamed.out_keys == moved.out_keys
    assert moved.out_keys == [nested.reward, ("next", "novel")]
    for td in rollouts:
        other = td.clone()
        for name in ("reward", "done", "terminated", "truncated", "is_init"):
            old, new = getattr(RolloutKeys(), name), getattr(nested, name)
            if other.get(old, None) is not None:
                other.rename_key_(old, new)
        expected = plain(td.clone())
        for transform in (moved, renamed):
            out = transform(other.clone())
            assert torch.equal(out.get(nested.reward), expected.get(("next", "reward")))
            assert torch.equal(out.get(("next", "novel")), expected.get(("next", "novel")))


def test_first_in_a_torchrl_compose():
    td = _rollout(workers=2, steps=4)
    td.set("state_value", torch.zeros(2, 4, 1))
    td.set(("next", "state_value"), torch.zeros(2, 4, 1))
    td.set(("next", "terminated"), torch.zeros(2, 4, 1, dtype=torch.bool))
    stages = [GAE(gamma=1.0, lmbda=1.0), EpisodeSplitter(), SequenceChunker(sequence_length=2)]
    padded = Compose(EpisodicNoveltyBonus(0.25), *stages, SequencePadder())(td.clone())
    # the first step reaches observation 1 (new), the later ones 1 again: one bonus a row, at
    # its first step, where GAE (gamma 1, values 0) reads it
    assert padded["next", "novel"].sum() == 2
    first = (padded["time_index"] == 0) & padded["loss_mask"]
    assert torch.equal(padded["advantage"].squeeze(-1)[first], torch.full((2,), 0.25))
    assert padded["advantage"].sum() == 0.5


def test_hash_collisions_fall_back_to_exact_numbering(monkeypatch):
    import rppo_td.functional._novelty as novelty

    gen = torch.Generator().manual_seed(1)
    obs = torch.randint(0, 2, (3, 6, 16), generator=gen)  # 16 words: hashed
    nxt = torch.randint(0, 2, (3, 6, 16), generator=gen)
    nxt[:, 3] = nxt[:, 1]  # some rows repeat
    start = torch.rand(3, 6, generator=gen) < 0.3
    start[:, 0] = True
    expected, _ = novelty.episodic_novelty(obs, nxt, start)
    # every row hashes to the same value: the check finds unequal rows and numbers exactly
    monkeypatch.setattr(novelty, "_multipliers", lambda words, device: torch.zeros(words).long())
    got, _ = novelty.episodic_novelty(obs, nxt, start)
    assert torch.equal(got, expected)
    for w in range(3):  # and both are the loop's
        seen: set = set()
        for t in range(6):
            if start[w, t]:
                seen = {tuple(obs[w, t].tolist())}
            row = tuple(nxt[w, t].tolist())
            assert bool(got[w, t]) == (row not in seen)
            seen.add(row)


def test_an_empty_rollout_keeps_the_carry():
    # a [W, 0] rollout returned an empty carry: the next rollout paid again for what its
    # episode had already seen
    from rppo_td import functional

    _, carry = functional.episodic_novelty(
        torch.tensor([[[0]]]), torch.tensor([[[1]]]), torch.tensor([[True]])
    )
    empty = torch.zeros(1, 0, 1, dtype=torch.int64)
    _, kept = functional.episodic_novelty(empty, empty, torch.zeros(1, 0, dtype=torch.bool), carry)
    assert sorted(kept.rows.squeeze(1).tolist()) == [0, 1] and kept.worker.tolist() == [0, 0]
    novel, _ = functional.episodic_novelty(
        torch.tensor([[[1]]]), torch.tensor([[[0]]]), torch.tensor([[False]]), kept
    )
    assert novel.tolist() == [[False]]
