"""Properties of episode splitting, chunking and padding (DESIGN.md's layout invariants)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torchrl.data import LazyTensorStorage, ReplayBuffer

from rppo_td import EpisodeSplitter, SequenceChunker, SequencePadder, functional
from rppo_td.testing.reference import (
    reference_chunk_ids,
    reference_episode_ids,
    reference_fragments,
    reference_pad,
    reference_sequences,
    reference_unpad,
)
from rppo_td.testing.strategies import (
    recurrent_specs,
    rollouts,
    sequence_lengths,
    step_masks,
)

# every property on the torch path, then on numba's kernels at every size
pytestmark = pytest.mark.usefixtures("both_kernel_paths")


def _chunk(td, sequence_length):
    return SequenceChunker(sequence_length=sequence_length)(EpisodeSplitter()(td.clone()))


def _real_steps(padded):
    """``[(sequence, position, worker, time)]`` for every real step of a padded tensordict."""
    mask = padded["loss_mask"].tolist()
    worker = padded["worker_index"].tolist()
    time = padded["time_index"].tolist()
    return [
        (n, i, worker[n][i], time[n][i])
        for n in range(len(mask))
        for i in range(len(mask[n]))
        if mask[n][i]
    ]


def _without_rollout_steps(padded, rollout):
    """``padded`` less ``rollout_steps`` (the reference does not write it), checked first:
    ``W * T`` of ``rollout`` on every real step, 0 on padding."""
    num_workers, num_steps = rollout.batch_size
    expected = padded["loss_mask"].long() * (num_workers * num_steps)
    assert torch.equal(padded["rollout_steps"], expected)
    return padded.exclude("rollout_steps")


def _assert_tds_equal(actual, expected):
    assert actual.batch_size == expected.batch_size
    actual_keys = set(actual.keys(include_nested=True, leaves_only=True))
    assert actual_keys == set(expected.keys(include_nested=True, leaves_only=True))
    for key in actual_keys:
        a, e = actual.get(key), expected.get(key)
        assert a.dtype == e.dtype, key
        assert torch.equal(a, e), key


@given(td=rollouts(allow_both=True, with_done=st.booleans()), sequence_length=sequence_lengths())
def test_padder_matches_reference(td, sequence_length):
    chunked = _chunk(td, sequence_length)
    assert torch.equal(chunked["episode_id"], reference_episode_ids(td))
    sequence_id, offset = reference_chunk_ids(td, sequence_length)
    assert torch.equal(chunked["sequence_id"], sequence_id)
    assert torch.equal(chunked["sequence_offset"], offset)
    padded = _without_rollout_steps(SequencePadder()(chunked), td)
    _assert_tds_equal(padded, reference_pad(chunked, sequence_length))


@given(td=rollouts(extra_starts=True), sequence_length=sequence_lengths())
def test_is_init_starts_a_fragment(td, sequence_length):
    # is_init True without a done step before it (a reset the rollout did not flag as done)
    chunked = _chunk(td, sequence_length)
    assert torch.equal(chunked["episode_id"], reference_episode_ids(td))
    padded = SequencePadder()(chunked)
    _assert_tds_equal(_without_rollout_steps(padded, td), reference_pad(chunked, sequence_length))
    starts = padded["is_init"][padded["loss_mask"]].squeeze(-1)
    # every step flagged is_init sits at position 0 of its sequence
    positions = padded["loss_mask"].nonzero()[:, 1]
    assert bool((positions[starts] == 0).all())


@given(td=rollouts(), sequence_length=sequence_lengths())
def test_round_trip_is_exact(td, sequence_length):
    chunked = _chunk(td, sequence_length)
    padded = SequencePadder()(chunked)
    _assert_tds_equal(SequencePadder().inv(padded), chunked)
    # and the inverse agrees with the naive unpadding
    _assert_tds_equal(reference_unpad(padded), chunked)


@given(td=rollouts(), sequence_length=sequence_lengths())
def test_every_real_step_once_in_time_order(td, sequence_length):
    padded = SequencePadder()(_chunk(td, sequence_length))
    steps = _real_steps(padded)
    num_workers, num_steps = td.batch_size
    places = sorted((w, t) for _, _, w, t in steps)
    assert places == [(w, t) for w in range(num_workers) for t in range(num_steps)]
    by_place = {(n, i): (w, t) for n, i, w, t in steps}
    for (n, i), (w, t) in by_place.items():
        if i > 0:
            # the previous position is the previous step of the same worker
            assert by_place[(n, i - 1)] == (w, t - 1)


@given(td=rollouts(), sequence_length=sequence_lengths())
def test_no_sequence_crosses_an_episode_end(td, sequence_length):
    padded = SequencePadder()(_chunk(td, sequence_length))
    done = (td["next", "done"]).squeeze(-1)
    mask = padded["loss_mask"]
    episode = padded["episode_id"]
    for n in range(mask.shape[0]):
        real = int(mask[n].sum())
        assert bool((episode[n, :real] == episode[n, 0]).all())
        # only the last real step of a sequence may be done
        w, t = padded["worker_index"][n, :real], padded["time_index"][n, :real]
        assert not bool(done[w[:-1], t[:-1]].any())


@given(td=rollouts(), sequence_length=sequence_lengths())
def test_sequence_sizes(td, sequence_length):
    padded = SequencePadder()(_chunk(td, sequence_length))
    longest_fragment = max(len(f) for f in reference_fragments(td))
    expected = (
        longest_fragment if sequence_length is None else min(sequence_length, longest_fragment)
    )
    assert padded.batch_size[1] == expected
    lengths = padded["loss_mask"].sum(-1)
    assert int(lengths.min()) >= 1
    assert int(lengths.max()) <= (sequence_length or longest_fragment)
    assert padded.batch_size[0] == len(reference_sequences(td, sequence_length))


@given(td=rollouts(), sequence_length=sequence_lengths())
def test_padding_is_zero_and_mask_is_a_true_prefix(td, sequence_length):
    padded = SequencePadder()(_chunk(td, sequence_length))
    mask = padded["loss_mask"]
    assert mask.dtype == torch.bool
    lengths = mask.sum(-1, keepdim=True)
    assert torch.equal(mask, torch.arange(mask.shape[1]) < lengths)
    for key, value in padded.items(include_nested=True, leaves_only=True):
        assert not bool(value[~mask].any()), key


@given(td=rollouts(recurrent=recurrent_specs(allow_none=False)), sequence_length=sequence_lengths())
def test_start_state_is_the_stored_state(td, sequence_length):
    padded = SequencePadder()(_chunk(td, sequence_length))
    for n, sequence in enumerate(reference_sequences(td, sequence_length)):
        w, t = sequence[0]
        assert torch.equal(padded["recurrent_state_h"][n, 0], td["recurrent_state_h"][w, t])
        if "recurrent_state_c" in td:
            assert torch.equal(padded["recurrent_state_c"][n, 0], td["recurrent_state_c"][w, t])


@given(data=st.data())
def test_chunk_episodes_matches_reference(data):
    num_workers = data.draw(st.integers(1, 5), label="W")
    num_steps = data.draw(st.integers(1, 20), label="T")
    start = data.draw(step_masks(num_workers, num_steps), label="start")
    sequence_length = data.draw(sequence_lengths(), label="L")
    sequence_id, offset = functional.chunk_episodes(start, sequence_length)
    expected_id, expected_offset = [], []
    number = -1
    for w in range(num_workers):
        position = 0
        for t in range(num_steps):
            position = 0 if start[w, t] else position + 1
            in_sequence = position if sequence_length is None else position % sequence_length
            if in_sequence == 0:
                number += 1
            expected_id.append(number)
            expected_offset.append(in_sequence)
    assert sequence_id.flatten().tolist() == expected_id
    assert offset.flatten().tolist() == expected_offset


@given(data=st.data())
def test_functional_pad_unpad_round_trip(data):
    num_workers = data.draw(st.integers(1, 5), label="W")
    num_steps = data.draw(st.integers(1, 20), label="T")
    start = data.draw(step_masks(num_workers, num_steps), label="start")
    sequence_length = data.draw(sequence_lengths(), label="L")
    feature = tuple(data.draw(st.lists(st.integers(1, 3), max_size=2), label="feature"))
    x = torch.randn(num_workers, num_steps, *feature)
    sequence_id, offset = functional.chunk_episodes(start, sequence_length)
    flat_index, mask = functional.sequence_layout(sequence_id, offset)
    padded = functional.pad_sequences(x, flat_index, functional.padding_positions(mask))
    real = mask.flatten().nonzero().squeeze(1)
    back = functional.unpad_sequences(
        padded, flat_index.flatten()[real], real, num_workers * num_steps
    )
    assert torch.equal(back.view_as(x), x)


@given(td=rollouts(), sequence_length=sequence_lengths())
def test_whole_fragments_when_length_is_none_or_large(td, sequence_length):
    # L at least the longest fragment (or None) leaves every fragment whole: one sequence each
    fragments = reference_fragments(td)
    longest = max(len(f) for f in fragments)
    length = None if sequence_length is None else longest + sequence_length - 1
    padded = SequencePadder()(_chunk(td, length))
    assert padded.batch_size == torch.Size([len(fragments), longest])
    assert padded["loss_mask"].sum(-1).tolist() == [len(f) for f in fragments]


@given(td=rollouts(), sequence_length=sequence_lengths(), data=st.data())
def test_padding_reordered_rows_of_a_chunked_rollout(td, sequence_length, data):
    # rows sampled after chunking (as a ReplayBuffer storing chunked rollouts does) pad like
    # the same rows chunked afresh, only the stored id numbers differ
    order = data.draw(st.permutations(range(td.batch_size[0])), label="row order")
    rows = torch.tensor(order)
    chunked_then_sampled = SequencePadder()(_chunk(td, sequence_length)[rows])
    sampled_then_chunked = SequencePadder()(_chunk(td[rows], sequence_length))
    ids = {"episode_id", "sequence_id"}
    assert chunked_then_sampled.batch_size == sampled_then_chunked.batch_size
    for key in sampled_then_chunked.keys(include_nested=True, leaves_only=True):
        if key in ids:
            continue
        assert torch.equal(chunked_then_sampled[key], sampled_then_chunked[key]), key


@given(
    td=rollouts(num_workers=st.integers(2, 4)), sequence_length=sequence_lengths(), data=st.data()
)
def test_inv_refuses_a_strict_subset_of_the_sequences(td, sequence_length, data):
    # e.g. all sequences but the last worker's: a smaller valid rectangle that inv used to
    # return as a [W - 1, T] rollout; or any minibatch. The rest, in any order, round-trips.
    padded = SequencePadder()(_chunk(td, sequence_length))
    num_sequences = padded.batch_size[0]
    order = data.draw(st.permutations(range(num_sequences)), label="order")
    keep = data.draw(st.integers(1, num_sequences - 1), label="kept")
    subset = padded[torch.tensor(order[:keep])]
    with pytest.raises(ValueError, match="needs all the sequences of one rollout"):
        SequencePadder().inv(subset)
    last_worker = padded["worker_index"][:, 0] == td.batch_size[0] - 1
    with pytest.raises(ValueError, match="needs all the sequences of one rollout"):
        SequencePadder().inv(padded[~last_worker])
    back = SequencePadder().inv(padded[torch.tensor(order)])
    _assert_tds_equal(back, _chunk(td, sequence_length))


@given(td=rollouts(), sequence_length=sequence_lengths())
def test_inv_after_cat_and_replay_buffer_storage(td, sequence_length):
    chunked = _chunk(td, sequence_length)
    padded = SequencePadder()(chunked)
    half = padded.batch_size[0] // 2
    _assert_tds_equal(SequencePadder().inv(torch.cat([padded[half:], padded[:half]])), chunked)
    buffer = ReplayBuffer(storage=LazyTensorStorage(padded.batch_size[0]))
    buffer.extend(padded)
    _assert_tds_equal(SequencePadder().inv(buffer.storage[:]), chunked)
    # sequences of two rollouts of different sizes
    other = SequencePadder()(_chunk(td[:, :1], sequence_length))
    if other.batch_size[1] == padded.batch_size[1] and td.numel() > other.numel():
        with pytest.raises(ValueError, match="rollouts of different sizes"):
            SequencePadder().inv(torch.cat([padded, other]))


@given(td=rollouts(), sequence_length=sequence_lengths(), extra=st.integers(0, 3))
def test_pad_to_is_the_padding_widened_and_inv_is_exact(td, sequence_length, extra):
    chunked = _chunk(td, sequence_length)
    plain = SequencePadder()(chunked)
    pad_to = plain.batch_size[1] + extra
    fixed = SequencePadder(pad_to=pad_to)(chunked)
    assert fixed.batch_size == (plain.batch_size[0], pad_to)
    # the first Lp columns are the unfixed padding; the rest is padding: zero, mask False
    _assert_tds_equal(fixed[:, : plain.batch_size[1]], plain)
    for key in fixed.keys(include_nested=True, leaves_only=True):
        assert not fixed.get(key)[:, plain.batch_size[1] :].any(), key
    _assert_tds_equal(SequencePadder().inv(fixed), chunked)
    expected = reference_pad(chunked, sequence_length, pad_to=pad_to)
    _assert_tds_equal(_without_rollout_steps(fixed, td), expected)
    if plain.batch_size[1] > 1:
        with pytest.raises(ValueError, match=f"pad_to={plain.batch_size[1] - 1}, but the longest"):
            SequencePadder(pad_to=plain.batch_size[1] - 1)(chunked)


@given(rollouts(), sequence_lengths(), st.data())
def test_hand_built_layout_checked(td, sequence_length, data):
    """A layout rebuilt by hand from ``from_rollout``'s tensors is accepted; one position moved
    to another value (off the padding rules, the consecutive steps, or onto a step another
    sequence holds) is refused with a ``ValueError`` naming ``SequenceLayout``."""
    from rppo_td import RolloutKeys, SequenceLayout

    layout = SequenceLayout.from_rollout(_chunk(td, sequence_length), RolloutKeys(), "test")
    fields = (layout.flat_index, layout.loss_mask, layout.time_steps, layout.num_workers)
    rebuilt = SequenceLayout(*fields)
    assert torch.equal(rebuilt.flat_index, layout.flat_index)
    steps = layout.time_steps * layout.num_workers
    n, lp = layout.flat_index.shape
    row = data.draw(st.integers(0, n - 1), label="row")
    col = data.draw(st.integers(0, lp - 1), label="col")
    flat = layout.flat_index.clone()
    mask = layout.loss_mask.clone()
    if data.draw(st.booleans(), label="flip mask"):
        mask[row, col] = ~mask[row, col]
    else:
        old = int(flat[row, col])
        flat[row, col] = data.draw(
            st.integers(-2, steps + 2).filter(lambda v: v != old), label="flat value"
        )
    with pytest.raises(ValueError, match="SequenceLayout"):
        SequenceLayout(flat, mask, layout.time_steps, layout.num_workers)
