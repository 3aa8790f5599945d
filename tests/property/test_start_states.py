"""Properties of SequenceStartStates: refreshed states, zero states and burn-in.

Each property is checked against a loop reference that steps the network's own ``policy`` /
``value`` one step at a time, worker by worker and sequence by sequence.
"""

from __future__ import annotations

import re

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rppo_td import EpisodeSplitter, SequenceChunker, SequencePadder, SequenceStartStates
from rppo_td.functional import burn_in_lengths, burn_in_window, episode_first_steps
from rppo_td.modules import RecurrentActor, RecurrentActorCritic, RecurrentCritic, RecurrentPolicy
from rppo_td.sampling import SequenceSampler
from rppo_td.testing.strategies import episode_ends
from rppo_td.transforms._start_states import scan_step_by_step

OBS = gym.spaces.Box(-1.0, 1.0, (2,))
ACT = gym.spaces.Discrete(2)


@st.composite
def cases(draw):
    """``(net, rollout, sequence_length, burn_in)``: a chunked ``[W, T]`` rollout with states."""
    workers = draw(st.integers(1, 4), label="W")
    steps = draw(st.integers(1, 12), label="T")
    recurrence = draw(st.sampled_from(["lstm", "gru"]), label="recurrence")
    layers = draw(st.integers(1, 2), label="layers")
    shared = draw(st.booleans(), label="shared critic")
    seed = draw(st.integers(0, 2**16), label="seed")
    torch.manual_seed(seed)
    net = RecurrentActorCritic(
        OBS, ACT, recurrence=recurrence, hidden_size=3, num_layers=layers, shared_critic=shared
    )
    terminated, truncated = draw(episode_ends(workers, steps, 3), label="ends")
    done = terminated | truncated
    is_init = torch.zeros_like(done)
    is_init[:, 1:] = done[:, :-1]
    first = draw(st.lists(st.booleans(), min_size=workers, max_size=workers), label="init[:, 0]")
    is_init[:, 0, 0] = torch.tensor(first)
    if not draw(st.booleans(), label="is_init marks every episode start"):
        # a collector that misses resets: the episode ids (from done) still start episodes
        is_init[:, 1:] = False
    td = TensorDict(
        {
            "observation": torch.randn(workers, steps, 2),
            "is_init": is_init,
            "next": {"done": done, "terminated": terminated, "truncated": truncated},
        },
        batch_size=[workers, steps],
    )
    for key in net.state_keys:
        # stored states: stale (random), zero at episode starts as a collector stores them
        value = torch.randn(workers, steps, *net.state_shape)
        td.set(key, torch.where(is_init.unsqueeze(-1), 0.0, value))
    length = draw(st.integers(1, 6), label="L")
    burn_in = draw(st.integers(0, 5), label="K")
    td = SequenceChunker(sequence_length=length)(EpisodeSplitter()(td))
    return net, td, length, burn_in


def _step(net, obs, state, critic):
    """One step of one network from ``state`` (a tuple of ``[1, layers, H]``)."""
    obs_td = TensorDict({"observation": obs.view(1, 1, 2)}, batch_size=[1, 1])
    if critic:
        _, final = net.value(obs_td, state)
    else:
        _, final = net.policy(obs_td, state)
    return final


def _groups(net):
    groups = [(net.actor_state_keys, False)]
    if not net.shared_critic:
        groups.append((net.critic_state_keys, True))
    return groups


def episode_starts(td):
    """``[W, T]`` bool: ``is_init``, or the episode id changing from the step before."""
    starts = td["is_init"][..., 0].clone()
    starts[:, 1:] |= td["episode_id"][:, 1:] != td["episode_id"][:, :-1]
    return starts


def reference_refreshed(net, td):
    """Per key, ``[W, T, layers, H]``: each row stepped from its first stored state."""
    workers, steps = td.batch_size
    starts = episode_starts(td)
    out = {key: torch.zeros(workers, steps, *net.state_shape) for key in net.state_keys}
    with torch.no_grad():
        for keys, critic in _groups(net):
            for w in range(workers):
                state = tuple(td[key][w, 0].unsqueeze(0) for key in keys)
                for t in range(steps):
                    if starts[w, t]:
                        state = tuple(torch.zeros_like(s) for s in state)
                    for key, s in zip(keys, state, strict=True):
                        out[key][w, t] = s[0]
                    state = _step(net, td["observation"][w, t], state, critic)
    return out


def reference_start(net, td, base, w, t0, burn_in):
    """The state a sequence starting at ``(w, t0)`` starts from after burn-in."""
    episode = td["episode_id"][w]
    first = t0
    while first > 0 and episode[first - 1] == episode[t0]:
        first -= 1
    begin = max(first, t0 - burn_in)
    out = {}
    with torch.no_grad():
        for keys, critic in _groups(net):
            state = tuple(base[key][w, begin].unsqueeze(0) for key in keys)
            for t in range(begin, t0):
                state = _step(net, td["observation"][w, t], state, critic)
            out.update({key: s[0] for key, s in zip(keys, state, strict=True)})
    return out


def _modules(net):
    return [RecurrentActor(net), RecurrentCritic(net)]


@settings(max_examples=40, deadline=None)
@given(cases())
def test_refreshed_states_equal_a_step_by_step_rerun(case):
    net, td, _, _ = case
    expected = reference_refreshed(net, td)
    out = SequenceStartStates(_modules(net), start_state="refreshed")(td)
    # padded sequences: rppo_td's modules refresh them in rounds (final_states), any other
    # module step by step (the generic path); both at each sequence's position 0
    sequences = SequencePadder()(td)
    first = (sequences["worker_index"][:, 0], sequences["time_index"][:, 0])
    by_rounds = SequenceStartStates(_modules(net), start_state="refreshed")
    assert by_rounds._by_sequences
    generic = SequenceStartStates(_modules(net), start_state="refreshed")
    generic._by_sequences = False
    for padded in (by_rounds(sequences), generic(sequences)):
        for key in net.state_keys:
            torch.testing.assert_close(
                padded[key][:, 0], expected[key][first], atol=1e-5, rtol=1e-5
            )
            assert torch.equal(padded[key][:, 1:], sequences[key][:, 1:])
            assert not padded[key].requires_grad
    for key in net.state_keys:
        torch.testing.assert_close(out[key], expected[key], atol=1e-5, rtol=1e-5)
        assert not out[key].requires_grad


@settings(max_examples=40, deadline=None)
@given(cases(), st.sampled_from(["stored", "refreshed", "zero"]))
def test_start_states_after_burn_in_match_the_reference(case, start_state):
    net, td, _, burn_in = case
    if start_state == "refreshed":
        base = reference_refreshed(net, td)
    elif start_state == "zero":
        base = {key: torch.zeros_like(td[key]) for key in net.state_keys}
    else:  # stored: zero wherever an episode starts
        zero = episode_starts(td)[..., None, None]
        base = {key: torch.where(zero, 0.0, td[key]) for key in net.state_keys}
    transform = SequenceStartStates(_modules(net), start_state=start_state, burn_in=burn_in)
    padded = SequencePadder()(td)
    out = transform(padded)
    for n in range(padded.batch_size[0]):
        w, t0 = int(padded["worker_index"][n, 0]), int(padded["time_index"][n, 0])
        expected = reference_start(net, td, base, w, t0, burn_in)
        for key in net.state_keys:
            torch.testing.assert_close(out[key][n, 0], expected[key], atol=1e-5, rtol=1e-5)
            assert torch.equal(out[key][n, 1:], padded[key][n, 1:])  # later: the stored
    # nothing else changes, and the input is left as it was
    for key in padded.keys(True, True):
        if key not in net.state_keys:
            assert torch.equal(out[key], padded[key])
    assert torch.equal(padded.get(net.state_keys[0]), SequencePadder()(td).get(net.state_keys[0]))


@settings(max_examples=30, deadline=None)
@given(cases())
def test_burn_in_stays_in_the_episode(case):
    _, td, _, burn_in = case
    first = episode_first_steps(td["episode_id"])
    starts = (td["sequence_offset"] == 0).nonzero()
    w, t0 = starts[:, 0], starts[:, 1]
    lengths = burn_in_lengths(t0, first[w, t0], burn_in)
    columns, active = burn_in_window(t0, lengths, burn_in)
    assert bool((lengths <= burn_in).all()) and bool((lengths >= 0).all())
    for i in range(len(w)):
        burned = columns[i][active[i]].tolist()
        assert burned == list(range(int(t0[i]) - int(lengths[i]), int(t0[i])))
        # inside the sequence's episode, and as long as the episode and K allow
        assert all(td["episode_id"][w[i], t] == td["episode_id"][w[i], t0[i]] for t in burned)
        before = int(t0[i]) - len(burned) - 1
        earlier_in_episode = (
            before >= 0 and td["episode_id"][w[i], before] == td["episode_id"][w[i], t0[i]]
        )
        assert len(burned) == burn_in or not earlier_in_episode


@settings(max_examples=25, deadline=None)
@given(cases(), st.sampled_from(["stored", "refreshed", "zero"]), st.integers(1, 3))
def test_each_real_step_in_one_loss_position_per_epoch(case, start_state, minibatches):
    net, td, _, burn_in = case
    padded = SequencePadder()(td)
    if minibatches > padded.batch_size[0]:
        minibatches = padded.batch_size[0]
    transform = SequenceStartStates(_modules(net), start_state=start_state, burn_in=burn_in)
    sampler = SequenceSampler(minibatches, generator=torch.Generator().manual_seed(0))
    for _ in range(2):  # two epochs, each from the freshly set states
        seen = []
        for batch in sampler(transform(padded)):
            mask = batch["loss_mask"]
            seen += list(
                zip(
                    batch["worker_index"][mask].tolist(),
                    batch["time_index"][mask].tolist(),
                    strict=True,
                )
            )
        workers, steps = td.batch_size
        assert sorted(seen) == [(w, t) for w in range(workers) for t in range(steps)]


@settings(max_examples=25, deadline=None)
@given(cases())
def test_fast_path_equals_step_mode_modules(case):
    net, td, _, _ = case
    workers, steps = td.batch_size
    start = {key: td[key][:, 0] for key in net.state_keys}
    active = torch.rand(workers, steps) < 0.7
    for module in (RecurrentActor(net), RecurrentCritic(net), RecurrentPolicy(net)):
        own = {key: start[key] for key in module.state_keys}
        fast, fast_final = module.scan_states(td, own, active)
        slow, slow_final = scan_step_by_step(module, td, own, active)
        for key in module.state_keys:
            torch.testing.assert_close(fast[key], slow[key], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(fast_final[key], slow_final[key], atol=1e-5, rtol=1e-5)


def _torchrl_lstm_rollout(steps, done_at, layers=1, dropout=0.0, stored=torch.zeros):
    """A TorchRL ``LSTMModule`` (2 inputs, hidden 3) with a head, and a ``[2, steps]`` rollout
    for it: ``(lstm, module, rollout)``; ``done_at`` lists ``(worker, time)`` dones."""
    from tensordict.nn import TensorDictModule, TensorDictSequential
    from torchrl.modules import LSTMModule

    torch.manual_seed(0)
    lstm = LSTMModule(
        input_size=2,
        hidden_size=3,
        num_layers=layers,
        dropout=dropout,
        in_key="observation",
        out_key="features",
    )
    head = TensorDictModule(torch.nn.Linear(3, 1), ["features"], ["v"])
    workers = 2
    done = torch.zeros(workers, steps, 1, dtype=torch.bool)
    for w, t in done_at:
        done[w, t] = True
    is_init = torch.zeros_like(done)
    is_init[:, 1:] = done[:, :-1]
    is_init[:, 0] = True
    td = TensorDict(
        {
            "observation": torch.randn(workers, steps, 2),
            "is_init": is_init,
            "recurrent_state_h": stored(workers, steps, layers, 3),
            "recurrent_state_c": stored(workers, steps, layers, 3),
            "next": {"done": done},
        },
        batch_size=[workers, steps],
    )
    return lstm, TensorDictSequential(lstm, head), td


def test_torchrl_lstm_module_takes_the_step_mode_path():
    lstm, module, td = _torchrl_lstm_rollout(7, [(0, 3)])
    workers, steps = td.batch_size
    is_init = td["is_init"]
    td = SequenceChunker(sequence_length=2)(EpisodeSplitter()(td))
    out = SequenceStartStates(module, start_state="refreshed")(td)
    # the reference: the LSTM over each row, restarting at the episode start
    with torch.no_grad():
        for w in range(workers):
            h = torch.zeros(1, 1, 3)
            c = torch.zeros(1, 1, 3)
            for t in range(steps):
                if is_init[w, t, 0]:
                    h, c = torch.zeros_like(h), torch.zeros_like(c)
                torch.testing.assert_close(out["recurrent_state_h"][w, t], h[:, 0])
                torch.testing.assert_close(out["recurrent_state_c"][w, t], c[:, 0])
                _, (h, c) = lstm.lstm(td["observation"][w, t].view(1, 1, 2), (h, c))


def test_refusals_name_the_setting():
    net = RecurrentActorCritic(OBS, ACT, hidden_size=3)
    with pytest.raises(ValueError, match="start_state must be one of"):
        SequenceStartStates(RecurrentActor(net), start_state="fresh")
    with pytest.raises(ValueError, match="burn_in must be an int >= 0, got -1"):
        SequenceStartStates(RecurrentActor(net), burn_in=-1)
    for plain in (torch.nn.LSTM(2, 3), [torch.nn.LSTM(2, 3)]):  # a bare torch module
        with pytest.raises(TypeError, match=r"modules must be TensorDict modules .* got LSTM"):
            SequenceStartStates(plain)
    for whole in ({"actor": RecurrentActor(net)}, "actor"):  # not iterated: named as given
        with pytest.raises(TypeError, match=f"got {type(whole).__name__}$"):
            SequenceStartStates(whole)
    memoryless = RecurrentActorCritic(OBS, ACT, hidden_size=3, recurrence="none")
    with pytest.raises(ValueError, match="has no recurrent state"):
        SequenceStartStates(RecurrentActor(memoryless))
    td = TensorDict(
        {
            "observation": torch.randn(2, 4, 2),
            "is_init": torch.zeros(2, 4, 1, dtype=torch.bool),
            "recurrent_state_h": torch.zeros(2, 4, 1, 3),
            "recurrent_state_c": torch.zeros(2, 4, 1, 3),
            "next": {"done": torch.zeros(2, 4, 1, dtype=torch.bool)},
        },
        batch_size=[2, 4],
    )
    with pytest.raises(KeyError, match="sequence_offset"):
        SequenceStartStates(RecurrentActor(net), start_state="zero")(td)
    chunked = SequenceChunker(sequence_length=2)(EpisodeSplitter()(td))
    padded = SequencePadder()(chunked)
    with pytest.raises(ValueError, match="these hold 4 of the 8 real steps of their rollout"):
        SequenceStartStates(RecurrentActor(net))(padded[:2])
    with pytest.raises(KeyError, match=r"burn_in=2 reads 'episode_id'.*EpisodeSplitter writes"):
        SequenceStartStates(RecurrentActor(net), start_state="stored", burn_in=2)(
            padded.exclude("episode_id")
        )


@pytest.mark.parametrize(("start_state", "burn_in"), [("refreshed", 0), ("stored", 3)])
def test_dropout_is_off_while_states_are_computed(start_state, burn_in):
    # a module in training mode (as during an update) with dropout drew random numbers: each
    # call gave other start states
    _, module, td = _torchrl_lstm_rollout(9, [], layers=2, dropout=0.5, stored=torch.randn)
    module.train()
    td = SequencePadder()(SequenceChunker(sequence_length=3)(EpisodeSplitter()(td)))
    transform = SequenceStartStates(module, start_state=start_state, burn_in=burn_in)
    first, second = transform(td), transform(td)
    module.eval()
    expected = transform(td)
    module.train()
    for key in ("recurrent_state_h", "recurrent_state_c"):
        torch.testing.assert_close(first[key], second[key], rtol=0, atol=0)
        torch.testing.assert_close(first[key], expected[key], rtol=0, atol=0)
    assert all(part.training for part in module.modules())  # the mode is restored


@pytest.mark.parametrize("start_state", ["stored", "refreshed", "zero"])
@pytest.mark.parametrize(
    "missing", ["observation", "recurrent_state_c", "critic_recurrent_state_h"]
)
@pytest.mark.parametrize("padded", [False, True])
def test_a_missing_input_is_a_value_error_naming_it(start_state, missing, padded):
    # the modules' observation was a KeyError from inside the module, naming nothing of ours
    net = RecurrentActorCritic(OBS, ACT, hidden_size=3, shared_critic=False)
    td = _small_rollout(net)
    if padded:
        td = SequencePadder()(td)
    transform = SequenceStartStates(_modules(net), start_state=start_state)
    with pytest.raises(ValueError, match=rf"key '{missing}' is missing.*SequenceStartStates reads"):
        transform(td.exclude(missing))
    with pytest.raises(KeyError):  # a KeyError too, for code that catches lookups
        transform(td.exclude(missing))


@pytest.mark.parametrize("start_state", ["stored", "refreshed"])
def test_padded_sequences_without_their_mask_are_refused_not_read_as_a_rollout(start_state):
    # each padded row was taken for a worker's row: stale or wrong start states, silently
    net = RecurrentActorCritic(OBS, ACT, hidden_size=3, shared_critic=False)
    padded = SequencePadder()(_small_rollout(net))
    transform = SequenceStartStates(_modules(net), start_state=start_state, burn_in=2)
    for td in (padded.exclude("loss_mask"), padded.rename_key_("loss_mask", "mask")):
        with pytest.raises(KeyError, match=r"holds padded sequences .* but no 'loss_mask'"):
            transform(td)
    transform.set_keys(loss_mask="mask")
    assert (transform(padded)["recurrent_state_h"] == transform(padded)["recurrent_state_h"]).all()


def test_a_module_converted_after_the_transform_was_built_is_followed():
    # its float32 dtype was kept from construction: float64 states were refused
    from tensordict import TensorDict
    from torchrl.modules import LSTMModule

    lstm = LSTMModule(input_size=2, hidden_size=3, in_key="observation", out_key="embed")
    transform = SequenceStartStates(lstm, start_state="refreshed")
    lstm.double()
    shape = (2, 5, 1, 3)
    rollout = TensorDict(
        {
            "observation": torch.randn(2, 5, 2, dtype=torch.float64),
            "is_init": torch.zeros(2, 5, 1, dtype=torch.bool),
            "recurrent_state_h": torch.zeros(shape, dtype=torch.float64),
            "recurrent_state_c": torch.zeros(shape, dtype=torch.float64),
        },
        [2, 5],
    )
    assert transform(rollout)["recurrent_state_h"].dtype == torch.float64
    with pytest.raises(ValueError, match=r"must be a torch\.float64 state"):
        transform(rollout.apply(lambda x: x.float() if x.is_floating_point() else x))


def test_in_and_out_keys_list_what_is_read_and_written():
    net = RecurrentActorCritic(OBS, ACT, hidden_size=3, shared_critic=False)
    transform = SequenceStartStates(_modules(net), start_state="refreshed")
    states = list(net.state_keys)
    assert transform.out_keys == states
    assert {"observation", "is_init", *states} <= set(transform.in_keys)
    # optional reads too: rollout_steps refuses a subset of the padded sequences
    assert {"episode_id", "rollout_steps", "loss_mask"} <= set(transform.in_keys)
    transform.set_keys(is_init="first")
    assert transform.out_keys == states
    assert {"observation", "first", *states} <= set(transform.in_keys)


def test_the_default_is_the_stored_state_as_in_the_trainer():
    # burn_in alone burns in from the stored states (with "refreshed" it would be skipped)
    net = RecurrentActorCritic(OBS, ACT, hidden_size=3)
    td = _small_rollout(net, workers=3, steps=9)
    default = SequenceStartStates(_modules(net), burn_in=np.int64(2))  # a numpy integer too
    assert (default.start_state, default.burn_in) == ("stored", 2)
    stored = SequenceStartStates(_modules(net), start_state="stored", burn_in=2)
    out, expected = default(td), stored(td)
    for key in net.state_keys:
        torch.testing.assert_close(out[key], expected[key], rtol=0, atol=0)
    assert not torch.equal(out["recurrent_state_h"], td["recurrent_state_h"])  # burnt in
    kept = SequenceStartStates(_modules(net))(td)  # no burn-in: the stored states as they are
    for key in net.state_keys:
        assert torch.equal(kept[key], td[key])


def _small_rollout(net, workers=2, steps=5):
    td = TensorDict(
        {
            "observation": torch.randn(workers, steps, 2),
            "is_init": torch.zeros(workers, steps, 1, dtype=torch.bool),
            "next": {"done": torch.zeros(workers, steps, 1, dtype=torch.bool)},
        },
        batch_size=[workers, steps],
    )
    for key in net.state_keys:
        td.set(key, torch.randn(workers, steps, *net.state_shape))
    return SequenceChunker(sequence_length=2)(EpisodeSplitter()(td))


@pytest.mark.parametrize(
    ("start_state", "burn_in"), [("refreshed", 0), ("stored", 2), ("zero", 0), ("refreshed", 1)]
)
@pytest.mark.parametrize("padded", [False, True])
def test_states_written_never_require_grad(start_state, burn_in, padded):
    # stored states that require grad (a user's own tensors): padded input once kept their
    # autograd history in the written copy, where [W, T] input did not
    net = RecurrentActorCritic(OBS, ACT, hidden_size=3)
    td = _small_rollout(net)
    for key in net.state_keys:
        td.set(key, td.get(key).requires_grad_(True))
    if padded:
        td = SequencePadder()(td)
    out = SequenceStartStates(_modules(net), start_state=start_state, burn_in=burn_in)(td)
    for key in net.state_keys:
        assert not out.get(key).requires_grad, key


@pytest.mark.parametrize("start_state", ["stored", "refreshed", "zero"])
def test_a_mask_with_a_hole_is_refused(start_state):
    # the refresh runs each row over its first mask.sum(1) positions: a False inside a row
    # would have run a padding step in place of a real one, silently
    net = RecurrentActorCritic(OBS, ACT, hidden_size=3)
    padded = SequencePadder(pad_to=3)(_small_rollout(net, steps=4))
    mask = padded["loss_mask"].clone()
    assert mask[0].tolist() == [True, True, False]
    mask[0] = torch.tensor([True, False, True])
    with pytest.raises(ValueError, match="'loss_mask' to be a True prefix in every row"):
        SequenceStartStates(_modules(net), start_state=start_state)(padded.set("loss_mask", mask))


def test_numpy_burn_in_is_an_int_everywhere():
    net = RecurrentActorCritic(OBS, ACT, hidden_size=3)
    SequenceStartStates(RecurrentActor(net), burn_in=np.int64(2))
    start, first = torch.tensor([0, 4, 9]), torch.tensor([0, 2, 0])
    assert burn_in_lengths(start, first, np.int64(4)).tolist() == [0, 2, 4]
    columns, active = burn_in_window(torch.tensor([1, 5]), torch.tensor([1, 3]), np.int32(3))
    assert columns.shape == active.shape == (2, 3)
    with pytest.raises(ValueError, match="burn_in must be an int >= 0, got True"):
        burn_in_lengths(start, first, True)


@pytest.mark.parametrize(
    ("start_state", "burn_in"), [("refreshed", 0), ("stored", 2), ("zero", 0), ("zero", 1)]
)
def test_malformed_states_are_refused_by_name(start_state, burn_in):
    net = RecurrentActorCritic(OBS, ACT, hidden_size=3)
    td = _small_rollout(net)
    transform = SequenceStartStates(_modules(net), start_state=start_state, burn_in=burn_in)
    bad = {
        "hidden size 2": torch.zeros(2, 5, 1, 2),
        "no layers dimension": torch.zeros(2, 5, 3),
        "float64": torch.zeros(2, 5, 1, 3, dtype=torch.float64),
        "int64": torch.zeros(2, 5, 1, 3, dtype=torch.int64),
    }
    for value in bad.values():
        wrong = td.clone()
        wrong.set("recurrent_state_h", value)
        # the expected dtype and shape, then the actual ones
        message = re.escape(
            "'recurrent_state_h' must be a torch.float32 state of shape [2, 5, 1, 3], got "
            f"{value.dtype} {list(value.shape)}"
        )
        with pytest.raises(ValueError, match=message):
            transform(wrong)
        # padded, in the shapes the user passed ([N, Lp, ...]), not an unpadded view's
        padded = SequencePadder()(wrong)
        n, length = padded.batch_size
        message = re.escape(
            f"'recurrent_state_h' must be a torch.float32 state of shape [{n}, {length}, 1, 3], "
            f"got {value.dtype} {[n, length, *value.shape[2:]]}"
        )
        with pytest.raises(ValueError, match=message):
            transform(padded)
    padded = SequencePadder()(td)
    padded.set("episode_id", padded["episode_id"].unsqueeze(-1))
    n, length = padded.batch_size
    with pytest.raises(ValueError, match=rf"'episode_id' must have shape \[{n}, {length}\], got"):
        transform(padded)
    if start_state != "refreshed":  # the [W, T] path reads the chunker's offsets
        wrong = td.clone()
        wrong.set("sequence_offset", wrong["sequence_offset"].float())
        with pytest.raises(ValueError, match=r"'sequence_offset' must have dtype torch\.int64"):
            transform(wrong)


@pytest.mark.parametrize(("start_state", "burn_in"), [("refreshed", 0), ("stored", 2), ("zero", 0)])
@pytest.mark.parametrize("shape", [(2, 5), (2, 5, 2), (2, 5, 1, 1)])
def test_is_init_of_another_shape_is_refused_by_name(start_state, burn_in, shape):
    # [W, T] and [W, T, 1, 1] were reshaped into [W, T, 1] and used; [W, T, 2] on padded
    # sequences with "refreshed" failed in a reshape that named nothing
    net = RecurrentActorCritic(OBS, ACT, hidden_size=3)
    wrong = _small_rollout(net)
    wrong.set("is_init", torch.zeros(shape, dtype=torch.bool))
    transform = SequenceStartStates(_modules(net), start_state=start_state, burn_in=burn_in)
    with pytest.raises(ValueError, match=r"'is_init' must have shape \[2, 5, 1\], got"):
        transform(wrong)
    padded = SequencePadder()(wrong)
    n, length = padded.batch_size
    with pytest.raises(ValueError, match=rf"'is_init' must have shape \[{n}, {length}, 1\], got"):
        transform(padded)


def test_a_burn_in_longer_than_the_rollout_is_the_rollout():
    # the window is as wide as the longest burn-in the rollout allows (T - 1), not K
    net = RecurrentActorCritic(OBS, ACT, hidden_size=3)
    padded = SequencePadder()(_small_rollout(net))
    whole = SequenceStartStates(_modules(net), start_state="stored", burn_in=4)(padded)
    huge = SequenceStartStates(_modules(net), start_state="stored", burn_in=10**9)(padded)
    for key in net.state_keys:
        assert torch.equal(whole[key], huge[key])


def _two_cores():
    """One TensorDictSequential of an LSTM (1 x 4) feeding a 2-layer GRU (2 x 6), and a
    chunked ``[2, 8]`` rollout for it with random stored states."""
    from tensordict.nn import TensorDictSequential
    from torchrl.modules import GRUModule, LSTMModule

    torch.manual_seed(0)
    lstm = LSTMModule(
        input_size=3,
        hidden_size=4,
        in_keys=["observation", "h", "c"],
        out_keys=["f", ("next", "h"), ("next", "c")],
    )
    gru = GRUModule(
        input_size=4, hidden_size=6, num_layers=2, in_keys=["f", "g"], out_keys=["y", ("next", "g")]
    )
    done = torch.zeros(2, 8, 1, dtype=torch.bool)
    done[0, 4] = True
    is_init = torch.zeros_like(done)
    is_init[:, 0] = True
    is_init[0, 5] = True
    td = TensorDict(
        {
            "observation": torch.randn(2, 8, 3),
            "is_init": is_init,
            "h": torch.randn(2, 8, 1, 4),
            "c": torch.randn(2, 8, 1, 4),
            "g": torch.randn(2, 8, 2, 6),
            "next": {"done": done},
        },
        [2, 8],
    )
    chunked = SequenceChunker(sequence_length=3)(EpisodeSplitter()(td))
    return lstm, gru, TensorDictSequential(lstm, gru), chunked


@pytest.mark.parametrize(("start_state", "burn_in"), [("refreshed", 0), ("stored", 2), ("zero", 1)])
def test_one_module_of_two_cores_checks_each_state_against_its_own_core(start_state, burn_in):
    """Each state key takes the shape of the core that reads and writes it: the GRU's
    [2, 6] state in a module whose first core is a [1, 4] LSTM was refused as [1, 4]."""
    lstm, gru, both, chunked = _two_cores()
    padded = SequencePadder()(chunked)
    out = SequenceStartStates(both, start_state=start_state, burn_in=burn_in)(padded)
    # the reference: the two cores run one after the other on each worker's steps
    with torch.no_grad():
        for row in range(padded.batch_size[0]):
            w, t0 = int(padded["worker_index"][row, 0]), int(padded["time_index"][row, 0])
            first = t0
            while burn_in and first > 0 and not chunked["is_init"][w, first, 0]:
                if t0 - first == burn_in:
                    break
                first -= 1
            if start_state == "refreshed":
                first = 0
            states = {k: chunked[k][w, first].unsqueeze(1).clone() for k in ("h", "c", "g")}
            if start_state == "zero" or chunked["is_init"][w, first, 0]:
                states = {k: torch.zeros_like(v) for k, v in states.items()}
            for t in range(first, t0):
                if chunked["is_init"][w, t, 0]:
                    states = {k: torch.zeros_like(v) for k, v in states.items()}
                x = chunked["observation"][w, t].view(1, 1, 3)
                f, (states["h"], states["c"]) = lstm.lstm(x, (states["h"], states["c"]))
                _, states["g"] = gru.gru(f, states["g"])
            if chunked["is_init"][w, t0, 0]:
                states = {k: torch.zeros_like(v) for k, v in states.items()}
            for key, value in states.items():
                torch.testing.assert_close(out[key][row, 0], value[:, 0], rtol=1e-5, atol=1e-6)
    bad = padded.clone()
    bad["g"] = torch.zeros(*bad.batch_size, 1, 6)
    with pytest.raises(ValueError, match=re.escape("'g' must be a torch.float32 state of shape")):
        SequenceStartStates(both, start_state=start_state, burn_in=burn_in)(bad)


@pytest.mark.parametrize(("start_state", "burn_in"), [("refreshed", 0), ("stored", 2), ("zero", 1)])
def test_an_empty_rollout_gives_an_empty_output(start_state, burn_in):
    """W = 0 or T = 0 on the [W, T] path: no state to compute (refreshed raised torch's
    shape and index errors)."""
    _, _, both, chunked = _two_cores()
    for part in (chunked[:0], chunked[:, :0]):
        out = SequenceStartStates(both, start_state=start_state, burn_in=burn_in)(part)
        assert out.batch_size == part.batch_size
        assert out["g"].shape == (*part.batch_size, 2, 6)


def test_a_module_failing_on_its_inputs_is_named_with_their_shapes():
    _, _, both, chunked = _two_cores()
    chunked["observation"] = torch.randn(2, 8, 5)  # the LSTM takes 3 features
    with pytest.raises(
        ValueError, match=r"TensorDictSequential failed on its inputs 'observation' \[2, 8, 5\]"
    ):
        SequenceStartStates(both, start_state="refreshed")(chunked)


def test_out_of_memory_in_a_module_is_raised_as_it_came():
    """Not the inputs' fault: code that catches torch.OutOfMemoryError to retry smaller
    still can (it is a RuntimeError, which is otherwise named with the inputs)."""
    from tensordict.nn import TensorDictModule

    class Boom(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(3, 4)

        def forward(self, x, h):
            raise torch.OutOfMemoryError("simulated")

    _, _, _, chunked = _two_cores()
    chunked["hb"] = torch.zeros(2, 8, 1, 4)
    module = TensorDictModule(Boom(), ["observation", "hb"], ["y", ("next", "hb")])
    with pytest.raises(torch.OutOfMemoryError, match="simulated"):
        SequenceStartStates(module, start_state="refreshed")(chunked)
