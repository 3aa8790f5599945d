"""GAEEstimator: against the loop oracle, inside and outside recurrent mode, LSTM and GRU."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.modules import set_recurrent_mode
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import ValueEstimatorBase

import rppo_td
from rppo_td import GAEEstimator, RecurrentPPOLoss
from tests.reference import reference_gae
from tests.unit.objectives._nets import make_agent, step_rollout

GAMMA, LMBDA = 0.9, 0.8


def _oracle(rollout, value, next_value):
    td = rollout.clone()
    td["state_value"] = value
    td["next", "state_value"] = next_value
    return reference_gae(td, GAMMA, LMBDA)


@pytest.mark.parametrize("recurrent", [False, True], ids=["sequential", "recurrent"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_recurrent_value_network_matches_the_loop_oracle(kind, recurrent):
    agent = make_agent(kind)
    rollout, value, next_value = step_rollout(agent, W=3, T=12)
    advantage, target = _oracle(rollout, value, next_value)
    before = rollout.clone()
    estimator = GAEEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=agent.critic)
    with set_recurrent_mode(recurrent):
        out = estimator(rollout)
    assert out is rollout
    torch.testing.assert_close(out["state_value"], value, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["next", "state_value"], next_value, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["advantage"].double(), advantage, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["value_target"].double(), target, atol=1e-5, rtol=1e-5)
    assert not out["advantage"].requires_grad
    # only the four keys are added: the network's by-products never reach the rollout
    added = {"advantage", "value_target", "state_value", ("next", "state_value")}
    assert set(out.keys(True, True)) == set(before.keys(True, True)) | added
    assert (out.exclude(*added) == before).all()


def test_the_next_sequence_restarts_after_a_reset_in_recurrent_mode():
    """Without splitting ``next`` at the root's ``is_init``, next values run across resets."""
    agent = make_agent("lstm")
    rollout, _, next_value = step_rollout(agent, W=3, T=12)
    with set_recurrent_mode(True), torch.no_grad():
        naive = agent.critic(rollout["next"].clone())["state_value"]
    assert (naive - next_value).abs().max() > 1e-3  # the bug this estimator avoids
    out = GAEEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=agent.critic)
    with set_recurrent_mode(True):
        torch.testing.assert_close(
            out(rollout)["next", "state_value"], next_value, atol=1e-5, rtol=1e-5
        )


def test_values_read_from_the_rollout_match_the_reference():
    W, T = 4, 9
    g = torch.Generator().manual_seed(3)
    terminated = torch.zeros(W, T, 1, dtype=torch.bool)
    truncated = torch.zeros(W, T, 1, dtype=torch.bool)
    terminated[0, 2] = True  # a terminated row
    truncated[1, 4] = True  # a truncated row
    terminated[2, 1] = truncated[2, 6] = True
    rollout = TensorDict(
        {
            "state_value": torch.randn(W, T, 1, generator=g),
            "next": {
                "reward": torch.randn(W, T, 1, generator=g),
                "state_value": torch.randn(W, T, 1, generator=g),
                "terminated": terminated,
                "truncated": truncated,
                "done": terminated | truncated,
            },
        },
        batch_size=[W, T],
    )
    advantage, target = reference_gae(rollout, GAMMA, LMBDA)
    out = GAEEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=None)(rollout.clone())
    torch.testing.assert_close(out["advantage"].double(), advantage, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["value_target"].double(), target, atol=1e-5, rtol=1e-5)
    # done may be missing: terminated | truncated
    without_done = GAEEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=None)(
        rollout.exclude(("next", "done"))
    )
    torch.testing.assert_close(without_done["advantage"], out["advantage"])
    # the same numbers as the GAE transform
    transform = rppo_td.GAE(gamma=GAMMA, lmbda=LMBDA)(rollout.clone())
    torch.testing.assert_close(transform["advantage"], out["advantage"])
    # TorchRL's hook for a value target: the same targets, the input left as it was
    estimator = GAEEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=None)
    before = rollout.clone()
    torch.testing.assert_close(estimator.value_estimate(rollout), out["value_target"])
    assert set(rollout.keys(True, True)) == set(before.keys(True, True))
    with pytest.raises(ValueError, match="takes no next_value"):
        estimator.value_estimate(rollout, next_value=rollout["next", "state_value"])
    # a done that is neither end, beside both flags, is refused as the transform refuses it
    # (it was read as a truncation)
    odd = rollout.clone()
    first = (~odd["next", "done"]).nonzero()[0].tolist()
    odd["next", "done"][tuple(first)] = True
    for gae in (estimator, rppo_td.GAE(gamma=GAMMA, lmbda=LMBDA)):
        with pytest.raises(ValueError, match=r"'done'\) is True where neither"):
            gae(odd.clone())


def test_gradient_free_and_time_dim():
    agent = make_agent("gru")
    rollout, value, next_value = step_rollout(agent, W=2, T=6)
    rollout["state_value"], rollout["next", "state_value"] = value, next_value
    expected = GAEEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=None)(rollout.clone())
    # time first: [T, W]
    transposed = rollout.clone().transpose(0, 1)
    out = GAEEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=None, time_dim=0)(transposed)
    torch.testing.assert_close(out["advantage"].transpose(0, 1), expected["advantage"])


def test_refusals():
    agent = make_agent("lstm")
    rollout, _, _ = step_rollout(agent, W=2, T=6)
    estimator = GAEEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=agent.critic)
    padded = rollout.clone()
    padded["loss_mask"] = torch.ones(2, 6, dtype=torch.bool)
    with pytest.raises(ValueError, match="loss_mask"):
        estimator(padded)
    with pytest.raises(KeyError, match="state_value"):
        GAEEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=None)(rollout.clone())
    with set_recurrent_mode(True), pytest.raises(ValueError, match="last batch dimension"):
        estimator(rollout.clone().transpose(0, 1), time_dim=0)
    with pytest.raises(ValueError, match="gamma"):
        GAEEstimator(gamma=1.5, lmbda=LMBDA, value_network=None)
    with pytest.raises(TypeError, match="value_network"):
        GAEEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=3)


def test_set_keys_renames_what_it_reads_and_writes():
    agent = make_agent("lstm")
    rollout, value, next_value = step_rollout(agent, W=2, T=6)
    advantage, _ = _oracle(rollout, value, next_value)
    rollout.rename_key_(("next", "reward"), ("next", "r"))
    estimator = GAEEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=agent.critic)
    estimator.set_keys(reward="r", advantage="adv")
    out = estimator(rollout)
    torch.testing.assert_close(out["adv"].double(), advantage, atol=1e-5, rtol=1e-5)
    assert "adv" in estimator.out_keys


def test_a_torchrl_value_estimator_of_any_loss():
    agent = make_agent("lstm")
    rollout, value, next_value = step_rollout(agent, W=3, T=12)
    advantage, _ = _oracle(rollout, value, next_value)
    assert issubclass(GAEEstimator, ValueEstimatorBase)
    # TorchRL's own loss, with the estimator class (TorchRL adds device=) ...
    torchrl_loss = ClipPPOLoss(agent.actor, agent.critic)
    torchrl_loss.make_value_estimator(
        GAEEstimator, gamma=GAMMA, lmbda=LMBDA, value_network=agent.critic
    )
    assert isinstance(torchrl_loss.value_estimator, GAEEstimator)
    with set_recurrent_mode(True):
        out = torchrl_loss.value_estimator(rollout.clone())
    torch.testing.assert_close(out["advantage"].double(), advantage, atol=1e-5, rtol=1e-5)
    # ... or an instance
    torchrl_loss.value_estimator = GAEEstimator(
        gamma=GAMMA, lmbda=LMBDA, value_network=agent.critic
    )
    out = torchrl_loss.value_estimator(rollout.clone())
    torch.testing.assert_close(out["advantage"].double(), advantage, atol=1e-5, rtol=1e-5)


def test_the_default_estimator_of_recurrent_ppo_loss():
    agent = make_agent("lstm")
    loss = RecurrentPPOLoss(agent.actor, agent.critic)
    assert isinstance(loss.value_estimator, GAEEstimator)
    assert (loss.value_estimator.gamma, loss.value_estimator.lmbda) == (0.99, 0.95)
    loss.make_value_estimator(gamma=GAMMA, lmbda=LMBDA)
    assert (loss.value_estimator.gamma, loss.value_estimator.lmbda) == (GAMMA, LMBDA)
    loss.set_keys(advantage="adv", loss_mask="mask")
    assert loss.value_estimator.tensor_keys.advantage == "adv"
    assert loss.value_estimator.tensor_keys.loss_mask == "mask"
    rollout, value, next_value = step_rollout(agent, W=3, T=12)
    advantage, _ = _oracle(rollout, value, next_value)
    out = loss.value_estimator(rollout)
    torch.testing.assert_close(out["adv"].double(), advantage, atol=1e-5, rtol=1e-5)


def test_a_plain_value_module():
    torch.manual_seed(0)
    critic = TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["state_value"])
    agent = make_agent("lstm")
    rollout, _, _ = step_rollout(agent, W=2, T=6)
    out = GAEEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=critic)(rollout.clone())
    with torch.no_grad():
        torch.testing.assert_close(out["state_value"], critic(rollout.clone())["state_value"])
        expected = critic(rollout["next"].clone())["state_value"]
    torch.testing.assert_close(out["next", "state_value"], expected)


def test_torchrl_gae_options_for_a_drop_in_replacement():
    """``average_gae`` gives TorchRL's numbers; ``skip_existing`` reads stored values."""
    from tensordict.nn import set_skip_existing
    from torchrl.objectives import ValueEstimators
    from torchrl.objectives.value import GAE as TorchRLGAE

    torch.manual_seed(0)
    critic = TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["state_value"])
    rollout, _, _ = step_rollout(make_agent("lstm"), W=3, T=7)
    rollout = rollout.exclude("state_value", ("next", "state_value"))
    theirs = TorchRLGAE(gamma=GAMMA, lmbda=LMBDA, value_network=critic, average_gae=True)
    expected = theirs(rollout.clone())
    ours = GAEEstimator(
        gamma=GAMMA, lmbda=LMBDA, value_network=critic, average_gae=True, vectorized=True
    )
    out = ours(rollout.clone())
    for key in ("advantage", "value_target"):
        torch.testing.assert_close(out[key], expected[key], atol=1e-5, rtol=1e-5)
    assert abs(out["advantage"].mean().item()) < 1e-6
    # one step: centred only (its deviation is undefined)
    assert (
        GAEEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=critic, average_gae=True)(
            rollout[:1, :1].clone()
        )["advantage"].item()
        == 0.0
    )
    # the options a TorchRL user passes through the loss
    loss = RecurrentPPOLoss(make_agent("lstm").actor, critic)
    loss.make_value_estimator(ValueEstimators.GAE, gamma=GAMMA, lmbda=LMBDA, average_gae=True)
    torch.testing.assert_close(loss.value_estimator(rollout.clone())["advantage"], out["advantage"])

    # skip_existing: stored values are read, each one on its own; a missing one is computed
    stored = rollout.clone()
    stored["state_value"] = torch.full((3, 7, 1), 5.0)
    skipping = GAEEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=critic, skip_existing=True)
    kept = skipping(stored.clone())
    assert (kept["state_value"] == 5.0).all()
    torch.testing.assert_close(kept["next", "state_value"], expected["next", "state_value"])
    recomputed = GAEEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=critic)(stored.clone())
    torch.testing.assert_close(recomputed["state_value"], expected["state_value"])
    with set_skip_existing(True):  # None follows tensordict's mode
        default = GAEEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=critic)(stored.clone())
    assert (default["state_value"] == 5.0).all()
    both = stored.clone()
    both["next", "state_value"] = torch.zeros(3, 7, 1)
    out = skipping(both)
    assert (out["state_value"] == 5.0).all() and (out["next", "state_value"] == 0).all()
    # the next values alone stored: read, the current ones computed (the same advantages as
    # with both given)
    only_next = rollout.clone()
    only_next["next", "state_value"] = torch.zeros(3, 7, 1)
    out = skipping(only_next)
    assert (out["next", "state_value"] == 0).all()
    torch.testing.assert_close(out["state_value"], expected["state_value"])
    given = only_next.clone()
    given["state_value"] = expected["state_value"]
    torch.testing.assert_close(out["advantage"], skipping(given)["advantage"])

    with pytest.raises(ValueError, match="differentiable=True"):
        GAEEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=critic, differentiable=True)
    with pytest.raises(TypeError, match="average_gae must be True or False, got 1"):
        GAEEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=critic, average_gae=1)
    with pytest.raises(TypeError, match="skip_existing must be True or False or None"):
        GAEEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=critic, skip_existing="yes")
