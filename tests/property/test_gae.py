"""GAE properties: the reference loop, truncation vs termination, episodes, special lambdas."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rppo_td import GAE, EpisodeSplitter, SequenceChunker, SequencePadder, functional
from rppo_td.testing.reference import (
    reference_fragments,
    reference_gae,
    reference_monte_carlo_returns,
    reference_segment_sum,
)
from rppo_td.testing.strategies import discounts, rollouts, sequence_lengths

ATOL = 1e-5


# every property on the torch path, then on numba's kernels at every size
pytestmark = pytest.mark.usefixtures("both_kernel_paths")


def _gae(td, gamma, lmbda):
    out = GAE(gamma=gamma, lmbda=lmbda)(td.clone())
    return out["advantage"], out["value_target"]


def _close(actual, expected, atol=ATOL):
    torch.testing.assert_close(actual.to(torch.float64), expected, atol=atol, rtol=1e-5)


@given(td=rollouts(with_done=st.booleans(), allow_both=True), gamma=discounts(), lmbda=discounts())
def test_gae_matches_reference(td, gamma, lmbda):
    advantage, target = _gae(td, gamma, lmbda)
    expected_advantage, expected_target = reference_gae(td, gamma, lmbda)
    assert advantage.shape == target.shape == (*td.batch_size, 1)
    assert advantage.dtype == target.dtype == td["state_value"].dtype
    _close(advantage, expected_advantage)
    _close(target, expected_target)


@given(
    td=rollouts(extra_starts=True, with_done=st.booleans()), gamma=discounts(), lmbda=discounts()
)
def test_gae_cuts_where_is_init_alone_starts_an_episode(td, gamma, lmbda):
    # is_init True without a done before it (a reset the rollout did not flag): the sum is cut
    # there and bootstraps, as the reference does (one hand-written unit test alone caught
    # a GAE that ignored these cuts: mutation probe)
    advantage, target = _gae(td, gamma, lmbda)
    expected_advantage, expected_target = reference_gae(td, gamma, lmbda)
    _close(advantage, expected_advantage)
    _close(target, expected_target)


@given(td=rollouts(num_steps=st.integers(1, 40), end_rate=20), gamma=discounts(), lmbda=discounts())
def test_gae_matches_reference_on_long_episodes(td, gamma, lmbda):
    advantage, _ = _gae(td, gamma, lmbda)
    _close(advantage, reference_gae(td, gamma, lmbda)[0], atol=1e-4)


@given(td=rollouts(), gamma=discounts(), lmbda=discounts(), data=st.data())
def test_bootstraps_on_truncation_not_termination(td, gamma, lmbda, data):
    terminated = td["next", "terminated"]
    truncated = td["next", "truncated"]
    shift = data.draw(st.floats(1.0, 10.0), label="next value shift")
    advantage, _ = _gae(td, gamma, lmbda)

    # moving V(o_{t+1}) where the episode terminated changes nothing
    moved = td.clone()
    moved["next", "state_value"] = torch.where(
        terminated, td["next", "state_value"] + shift, td["next", "state_value"]
    )
    torch.testing.assert_close(_gae(moved, gamma, lmbda)[0], advantage)

    # at a done step the advantage is the one-step TD error, bootstrapped iff truncated
    delta = (
        td["next", "reward"]
        - td["state_value"]
        + gamma * torch.where(terminated, 0.0, td["next", "state_value"])
    )
    done = terminated | truncated
    torch.testing.assert_close(advantage[done], delta[done], atol=ATOL, rtol=1e-5)

    # moving V(o_{t+1}) at a truncated step moves that step's advantage by gamma * shift
    moved = td.clone()
    moved["next", "state_value"] = torch.where(
        truncated, td["next", "state_value"] + shift, td["next", "state_value"]
    )
    moved_advantage = _gae(moved, gamma, lmbda)[0]
    torch.testing.assert_close(
        moved_advantage[truncated], advantage[truncated] + gamma * shift, atol=1e-4, rtol=1e-5
    )


@given(td=rollouts(), gamma=discounts(), lmbda=discounts())
def test_gae_over_episodes_is_concatenation_of_per_episode_gae(td, gamma, lmbda):
    advantage, _ = _gae(td, gamma, lmbda)
    fields = [
        ("next", "reward"),
        "state_value",
        ("next", "state_value"),
        ("next", "terminated"),
        ("next", "done"),
    ]
    for fragment in reference_fragments(td):
        w = fragment[0][0]
        times = torch.tensor([t for _, t in fragment])
        # the fragment alone, as a one-worker rollout [1, len, 1]
        args = [td.get(key)[w, times].unsqueeze(0) for key in fields]
        alone, _ = functional.generalized_advantage_estimate(*args, gamma=gamma, lmbda=lmbda)
        torch.testing.assert_close(advantage[w, times], alone[0], atol=ATOL, rtol=1e-5)


def _consistent_values(td):
    """Sets ``("next", "state_value")[t] = state_value[t + 1]`` wherever step t is not done."""
    out = td.clone()
    next_value = out["next", "state_value"].clone()
    not_done = ~out["next", "done"][:, :-1]
    next_value[:, :-1] = torch.where(not_done, out["state_value"][:, 1:], next_value[:, :-1])
    out["next", "state_value"] = next_value
    return out


@given(td=rollouts(), gamma=discounts())
def test_lambda_one_gives_monte_carlo_returns_minus_values(td, gamma):
    td = _consistent_values(td)
    advantage, target = _gae(td, gamma, 1.0)
    returns = reference_monte_carlo_returns(td, gamma)
    _close(target, returns, atol=1e-4)
    _close(advantage, returns - td["state_value"].double(), atol=1e-4)


@given(td=rollouts(), gamma=discounts())
def test_lambda_zero_gives_the_td_error(td, gamma):
    advantage, target = _gae(td, gamma, 0.0)
    bootstrap = torch.where(td["next", "terminated"], 0.0, td["next", "state_value"])
    delta = td["next", "reward"] + gamma * bootstrap - td["state_value"]
    torch.testing.assert_close(advantage, delta)
    torch.testing.assert_close(target, td["next", "reward"] + gamma * bootstrap)


@given(td=rollouts(), gamma=discounts(), lmbda=discounts(), data=st.data())
def test_gae_unchanged_by_chunking(td, gamma, lmbda, data):
    first = data.draw(sequence_lengths(), label="L1")
    second = data.draw(sequence_lengths(), label="L2")
    before = GAE(gamma=gamma, lmbda=lmbda)(td.clone())
    results = []
    for length in (first, second):
        chunked = SequenceChunker(sequence_length=length)(EpisodeSplitter()(before.clone()))
        # GAE after chunking (sequence ids present) gives the same advantages
        again = GAE(gamma=gamma, lmbda=lmbda)(chunked.clone())
        assert torch.equal(again["advantage"], before["advantage"])
        back = SequencePadder().inv(SequencePadder()(chunked))
        results.append(back["advantage"])
    assert torch.equal(results[0], before["advantage"])
    assert torch.equal(results[1], before["advantage"])


@given(td=rollouts(recurrent=st.none()), gamma=discounts(), lmbda=discounts())
def test_gae_float64_and_time_dim(td, gamma, lmbda):
    fields = [
        td["next", "reward"].double(),
        td["state_value"].double(),
        td["next", "state_value"].double(),
        td["next", "terminated"],
        td["next", "done"],
    ]
    advantage, _ = functional.generalized_advantage_estimate(*fields, gamma=gamma, lmbda=lmbda)
    assert advantage.dtype == torch.float64
    expected, _ = reference_gae(
        td.apply(lambda x: x.double() if x.is_floating_point() else x), gamma, lmbda
    )
    torch.testing.assert_close(advantage, expected, atol=1e-10, rtol=1e-10)
    # the same sums with time first: [T, W, 1], time_dim=0
    transposed = [x.transpose(0, 1) for x in fields]
    advantage_t, _ = functional.generalized_advantage_estimate(
        *transposed, gamma=gamma, lmbda=lmbda, time_dim=0
    )
    torch.testing.assert_close(advantage_t.transpose(0, 1), advantage, atol=1e-10, rtol=1e-10)


@given(data=st.data())
def test_discounted_segment_sum_matches_loop(data):
    # long rows with small decays chain several float64-range blocks
    decay = data.draw(
        st.one_of(st.sampled_from([0.0, 1e-3, 0.01, 0.1, 1.0]), st.floats(0.0, 1.0)),
        label="decay",
    )
    steps = data.draw(st.integers(1, 400), label="T")
    cut_rate = data.draw(st.sampled_from([0.0, 0.05, 0.5]), label="cut rate")
    seed = data.draw(st.integers(0, 2**31), label="seed")
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(steps, generator=generator, dtype=torch.float64)
    carry_on = torch.rand(steps, generator=generator) >= cut_rate
    y = functional.discounted_segment_sum(x.view(1, steps, 1), carry_on.view(1, steps, 1), decay)
    expected = reference_segment_sum(x.tolist(), carry_on.tolist(), decay)
    torch.testing.assert_close(
        y.view(steps), torch.tensor(expected, dtype=torch.float64), atol=1e-9, rtol=1e-9
    )


# each example sums 2**16+ elements (about 0.1 s), checked against the loop on a few rows
@given(data=st.data())
def test_discounted_segment_sum_matches_loop_on_large_inputs(data):
    # 2**16 elements or more: the size from which a faster blocked path may be taken
    steps = data.draw(st.integers(32, 300), label="T")
    rows = -(-(1 << 16) // steps) + data.draw(st.integers(0, 3), label="extra rows")
    decay = data.draw(
        st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(0.0, 1.0)), label="decay"
    )
    cut_rate = data.draw(st.sampled_from([0.0, 0.02, 0.3]), label="cut rate")
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31), label="seed"))
    x = torch.randn(rows, steps, 1, generator=generator, dtype=torch.float64)
    carry_on = torch.rand(rows, steps, 1, generator=generator) >= cut_rate
    y = functional.discounted_segment_sum(x, carry_on, decay)
    # the loop over a few rows, chosen by the generator, keeps the oracle affordable
    for row in [*torch.randint(0, rows, (4,), generator=generator).tolist(), rows - 1]:
        expected = reference_segment_sum(x[row, :, 0].tolist(), carry_on[row, :, 0].tolist(), decay)
        torch.testing.assert_close(
            y[row, :, 0], torch.tensor(expected, dtype=torch.float64), atol=1e-9, rtol=1e-9
        )
    # and float32 inputs give float32 results of the same sums
    y32 = functional.discounted_segment_sum(x.float(), carry_on, decay)
    assert y32.dtype == torch.float32
    torch.testing.assert_close(y32, y.float(), atol=1e-4, rtol=1e-4)


@given(
    td=rollouts(),
    flag=st.sampled_from(["terminated", "truncated", "done"]),
    gamma=discounts(),
    data=st.data(),
)
def test_flags_that_disagree_with_done_are_refused(td, flag, gamma, data):
    # wherever a flag is set without done (or done without a flag), GAE would sum across an
    # episode end or cut one it does not bootstrap; GAE and EpisodeSplitter both refuse
    num_workers, num_steps = td.batch_size
    w = data.draw(st.integers(0, num_workers - 1), label="w")
    t = data.draw(st.integers(0, num_steps - 1), label="t")
    if flag == "done":
        td["next", "terminated"][w, t] = False
        td["next", "truncated"][w, t] = False
        td["next", "done"][w, t] = True
    else:
        other = "truncated" if flag == "terminated" else "terminated"
        td["next", flag][w, t] = True
        td["next", other][w, t] = False
        td["next", "done"][w, t] = False
    for stage in (GAE(gamma=gamma, lmbda=0.9), EpisodeSplitter()):
        with pytest.raises(ValueError) as info:
            stage(td.clone())
        assert f"('next', {flag!r}) is True where" in info.value.args[0]
    if flag == "terminated":
        with pytest.raises(ValueError, match="'terminated' is True where 'done' is False"):
            functional.generalized_advantage_estimate(
                td["next", "reward"],
                td["state_value"],
                td["next", "state_value"],
                td["next", "terminated"],
                td["next", "done"],
                gamma=gamma,
                lmbda=0.9,
            )


@given(td=rollouts(), gamma=discounts(), lmbda=discounts())
def test_targets_never_carry_gradients(td, gamma, lmbda):
    expected, _ = _gae(td, gamma, lmbda)
    for key in ("state_value", ("next", "state_value"), ("next", "reward")):
        td.set(key, td.get(key).clone().requires_grad_())
    out = GAE(gamma=gamma, lmbda=lmbda)(td)
    assert not out["advantage"].requires_grad and not out["value_target"].requires_grad
    torch.testing.assert_close(out["advantage"], expected)


@given(td=rollouts(), gamma=discounts(), lmbda=discounts(), data=st.data())
def test_empty_slices_give_empty_advantages(td, gamma, lmbda, data):
    cut = data.draw(st.sampled_from(["workers", "steps"]), label="cut")
    empty = td[:0] if cut == "workers" else td[:, :0]
    out = SequenceChunker(sequence_length=2)(
        EpisodeSplitter()(GAE(gamma=gamma, lmbda=lmbda)(empty))
    )
    assert out["advantage"].shape == (*empty.batch_size, 1)
    assert out["sequence_id"].shape == empty.batch_size


def test_the_references_on_an_empty_rollout():
    # reference_gae raised a size mismatch for W = 0 (the fast path gives [0, T, 1]), and
    # reference_pad "max() arg is an empty sequence"
    from tensordict import TensorDict

    from rppo_td.testing.reference import reference_pad

    z, b = torch.zeros(0, 3, 1), torch.zeros(0, 3, 1, dtype=torch.bool)
    flags = {"terminated": b, "truncated": b, "done": b}
    td = TensorDict(
        {"state_value": z, "next": {"reward": z, "state_value": z, **flags}}, batch_size=[0, 3]
    )
    advantage, target = reference_gae(td, 0.9, 0.9)
    assert advantage.shape == target.shape == (0, 3, 1)
    with pytest.raises(ValueError, match=r"empty rollout \(batch size \[0, 3\]\)"):
        reference_pad(td, 2)
