"""A TorchRL Collector's rollout into RecurrentPPOLoss, which computes its advantages itself.

``Collector`` over ``SerialEnv`` of CartPole with ``InitTracker`` and a ``StepCounter`` time
limit (so rollouts hold terminations and truncations), an ``LSTMModule`` shared by the actor
and the critic, and its primer -> ``loss.value_estimator`` (rppo_td's ``GAEEstimator``) on the
``[W, T]`` rollout -> EpisodeSplitter -> SequenceChunker -> SequencePadder -> SequenceSampler
-> ``RecurrentPPOLoss`` in recurrent mode -> backward and an optimiser step.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from torchrl.envs import SerialEnv
from torchrl.envs.transforms import Compose
from torchrl.modules import LSTMModule, set_recurrent_mode
from torchrl.record.loggers import CSVLogger

import rppo_td
from rppo_td import GAEEstimator, RecurrentPPOLoss
from tests.integration._cartpole import actor_critic, collect_once, time_limited_cartpole

W, T, MAX_STEPS, L, HIDDEN = 2, 48, 20, 8, 16
KEEP = (
    "observation",
    "action",
    "action_log_prob",
    "is_init",
    "recurrent_state_h",
    "recurrent_state_c",
    ("next", "observation"),
    ("next", "is_init"),
    ("next", "recurrent_state_h"),
    ("next", "recurrent_state_c"),
    ("next", "reward"),
    ("next", "terminated"),
    ("next", "truncated"),
    ("next", "done"),
)


@pytest.fixture(scope="module")
def collected():
    torch.manual_seed(0)
    lstm = LSTMModule(input_size=4, hidden_size=HIDDEN, in_key="observation", out_key="embed")
    actor, critic = actor_critic(lstm, HIDDEN)
    env = SerialEnv(W, functools.partial(time_limited_cartpole, MAX_STEPS))
    env = env.append_transform(lstm.make_tensordict_primer())
    env.set_seed(0)
    rollout = collect_once(env, actor, W * T).select(*KEEP)
    assert rollout.batch_size == (W, T)
    assert bool(rollout["next", "truncated"].any()) and bool(rollout["next", "terminated"].any())
    return actor, critic, rollout


def test_the_estimator_agrees_inside_and_outside_recurrent_mode(collected):
    actor, critic, rollout = collected
    loss = RecurrentPPOLoss(actor, critic)
    loss.make_value_estimator(gamma=0.99, lmbda=0.95)
    assert isinstance(loss.value_estimator, GAEEstimator)
    outside = loss.value_estimator(rollout.clone())
    with set_recurrent_mode(True):
        inside = loss.value_estimator(rollout.clone())
    # the GAE transform outside recurrent mode: every step from its stored state
    transform = rppo_td.GAE(gamma=0.99, lmbda=0.95, value_network=critic)(rollout.clone())
    for out in (outside, inside):
        torch.testing.assert_close(out["advantage"], transform["advantage"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(
            out["value_target"], transform["value_target"], atol=1e-5, rtol=1e-5
        )


def test_pipeline_into_the_loss_with_its_own_advantages(collected, tmp_path):
    actor, critic, rollout = collected
    actor, critic = copy.deepcopy((actor, critic))  # trained below; the LSTM stays shared
    loss = RecurrentPPOLoss(actor, critic, normalize_advantage=True, clip_value=True)
    loss.make_value_estimator(gamma=0.99, lmbda=0.95)
    optimizer = torch.optim.Adam(loss.parameters(), lr=1e-3)
    logger = CSVLogger("ppo", log_dir=str(tmp_path))

    rollout = loss.value_estimator(rollout.clone())  # on the whole [W, T] rollout
    pipeline = Compose(
        rppo_td.EpisodeSplitter(),
        rppo_td.SequenceChunker(sequence_length=L),
        rppo_td.SequencePadder(),
    )
    padded = pipeline(rollout)
    assert padded.batch_size[1] == L and bool((~padded["loss_mask"]).any())
    sampler = rppo_td.SequenceSampler(3, generator=torch.Generator().manual_seed(0))
    first = True
    for step, minibatch in enumerate(sampler(padded)):
        out = loss(minibatch)
        assert all(value.shape == () for value in out.values())
        if first:  # the policy that collected the data: no change yet
            assert out["clip_fraction"] == 0
            assert out["kl_approx"].abs() < 1e-5
            torch.testing.assert_close(out["ESS"], torch.tensor(1.0))
            first = False
        total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
        optimizer.zero_grad()
        total.backward()
        grads = [p.grad for p in loss.parameters() if p.grad is not None]
        assert grads and all(bool(torch.isfinite(g).all()) for g in grads)
        optimizer.step()
        for key, value in out.items():
            logger.log_scalar(key, value.detach(), step=step)
    assert {p.stem for p in (tmp_path / "ppo" / "scalars").glob("*.csv")} == set(out.keys())


def test_the_loss_on_the_whole_rollout_computes_advantages(collected):
    actor, critic, rollout = collected
    loss = RecurrentPPOLoss(actor, critic)
    loss.make_value_estimator(gamma=0.99, lmbda=0.95)
    assert rollout.get("advantage", None) is None
    out = loss(rollout)  # [W, T]: no loss_mask, every step real; the LSTM splits at is_init
    assert rollout.get("advantage", None) is None  # the input is not modified
    assert out["kl_approx"].abs() < 1e-5 and out["clip_fraction"] == 0
    (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
    lstm = critic[0]
    assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in lstm.parameters())


def test_missing_or_mistyped_recurrent_inputs_are_refused_by_name(collected):
    """What TorchRL's LSTMModule would fail on with its own or oneDNN's words (a None state,
    an unsupported dtype) is refused naming the key, the network and the module."""
    actor, critic, rollout = collected
    loss = RecurrentPPOLoss(actor, critic)
    rollout = loss.value_estimator(rollout.clone())
    padded = rppo_td.SequencePadder()(
        rppo_td.SequenceChunker(sequence_length=L)(rppo_td.EpisodeSplitter()(rollout))
    )
    loss(padded)  # the whole set passes
    for key, words in (
        ("recurrent_state_h", r"actor's LSTMModule reads 'recurrent_state_h' \(its recurrent"),
        ("is_init", r"actor's LSTMModule reads 'is_init' \(its is_init"),
    ):
        with pytest.raises(KeyError, match=words):
            loss(padded.exclude(key))
    bad = padded.clone().set("recurrent_state_c", padded["recurrent_state_c"].double())
    with pytest.raises(ValueError, match=r"'recurrent_state_c' is torch.float64, but the actor's"):
        loss(bad)
    # the check reads the weights the loss runs with: a deep copy of the loss cast with
    # .double() holds float64 parameters apart from its modules' own float32 tensors (the
    # check said "float32 weights" of float64 data, then let float32 data fail inside torch)
    doubled = copy.deepcopy(loss).double()
    data = padded.apply(lambda x: x.double() if x.is_floating_point() else x)
    assert doubled(data)["loss_objective"].dtype == torch.float64
    with pytest.raises(
        ValueError, match=r"is torch.float32, but the actor's LSTMModule has torch.float64"
    ):
        doubled(padded)
