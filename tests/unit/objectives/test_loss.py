"""RecurrentPPOLoss against a hand-computed masked reference, with garbage in the padding."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tensordict import TensorDict
from torchrl.modules import set_recurrent_mode
from torchrl.objectives import ClipPPOLoss
from torchrl.record.loggers import CSVLogger

import rppo_td
from rppo_td import RecurrentPPOLoss
from tests.unit.objectives._nets import ACTIONS, make_agent, step_rollout

CLIP, ENTROPY, CRITIC, CLIP_VALUE = 0.2, 0.01, 0.5, 0.3
KEYS = ("loss_objective", "loss_critic", "loss_entropy", "clip_fraction", "kl_approx", "kl_k3")
KEYS += ("entropy", "ESS", "explained_variance", "max_ratio", "mean_ratio")


def _padded(agent, seed=1):
    """``[N, Lp]`` sequences of a stepped rollout (3 workers, L = 4), clean zero padding."""
    rollout, value, _ = step_rollout(agent, W=3, T=12, seed=seed)
    g = torch.Generator().manual_seed(seed + 10)
    rollout["advantage"] = torch.randn(3, 12, 1, generator=g)
    rollout["value_target"] = torch.randn(3, 12, 1, generator=g)
    rollout["state_value"] = value + 0.5 * torch.randn(3, 12, 1, generator=g)
    rollout["action_log_prob"] = torch.zeros(3, 12)
    rollout = rollout.exclude("next")
    rollout["next", "done"] = step_rollout(agent, W=3, T=12, seed=seed)[0]["next", "done"]
    rollout = rppo_td.SequenceChunker(sequence_length=4)(rppo_td.EpisodeSplitter()(rollout))
    padded = rppo_td.SequencePadder()(rollout).exclude("next")
    return padded.exclude("episode_id", "sequence_id", "sequence_offset")


def _reference(agent, batch, *, normalize=False, clip_value=False):
    """Every output from the real steps only: each sequence run from its state at position 0."""
    mask = batch["loss_mask"]
    states = [batch[k][:, 0] for k in agent.state_keys]
    out, _ = agent.run(batch["observation"], states)
    logits = agent.policy_head(out)[mask]
    value = agent.value_head(out)[mask]
    dist = torch.distributions.Categorical(logits=logits)
    log_prob = dist.log_prob(batch["action"][mask])
    old_log_prob = batch["action_log_prob"][mask]
    advantage = batch["advantage"][mask]
    if normalize:
        advantage = (advantage - advantage.mean()) / (advantage.std(correction=0) + 1e-8)
    ratio = (log_prob - old_log_prob).exp().unsqueeze(-1)
    clipped = ratio.clamp(1 - CLIP, 1 + CLIP)
    target = batch["value_target"][mask]
    critic = (value - target).square()
    result = {}
    if clip_value:
        old = batch["state_value"][mask]
        value_clipped = old + (value - old).clamp(-CLIP_VALUE, CLIP_VALUE)
        critic = torch.maximum(critic, (value_clipped - target).square())
        result["value_clip_fraction"] = ((value - old).abs() > CLIP_VALUE).float().mean()
    entropy = dist.entropy()
    result.update(
        loss_objective=-torch.minimum(ratio * advantage, clipped * advantage).mean(),
        loss_critic=CRITIC * critic.mean(),
        loss_entropy=-ENTROPY * entropy.mean(),
        clip_fraction=((ratio < 1 - CLIP) | (ratio > 1 + CLIP)).float().mean(),
        kl_approx=(old_log_prob - log_prob).mean(),
        kl_k3=((ratio - 1) - ratio.log()).mean(),
        entropy=entropy.mean(),
        ESS=ratio.sum().square() / ratio.square().sum() / ratio.numel(),
        explained_variance=1 - (target - value).var(correction=0) / target.var(correction=0),
        max_ratio=ratio.max(),
        mean_ratio=ratio.mean(),
    )
    return result, log_prob


def _garbage(batch, seed=5):
    """Large random values (NaN-free) in every padded position of every key."""
    g = torch.Generator().manual_seed(seed)
    pad = ~batch["loss_mask"]
    dirty = batch.clone()
    for key in ("observation", "advantage", "value_target", "state_value", "action_log_prob"):
        x = dirty[key]
        x[pad] = 1e3 * torch.randn(x[pad].shape, generator=g)
    for key in ("recurrent_state_h", "recurrent_state_c", "recurrent_state"):
        if dirty.get(key, None) is not None:
            x = dirty[key]
            x[pad] = 1e2 * torch.randn(x[pad].shape, generator=g)
    # actions outside the space: a log_prob of them fails (or is NaN) where not replaced
    dirty["action"][pad] = torch.randint(ACTIONS, 100, dirty["action"][pad].shape, generator=g)
    dirty["is_init"][pad] = torch.rand(dirty["is_init"][pad].shape, generator=g) < 0.5
    return dirty


def _feed_forward(actions):
    """A linear Categorical actor over ``actions`` and a linear critic, both on a 3-feature
    ``observation``: no recurrent core."""
    from tensordict.nn import TensorDictModule
    from torchrl.modules import ProbabilisticActor

    actor = ProbabilisticActor(
        TensorDictModule(torch.nn.Linear(3, actions), ["observation"], ["logits"]),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,
    )
    critic = TensorDictModule(torch.nn.Linear(3, 1), ["observation"], ["state_value"])
    return actor, critic


def _loss(agent, **kwargs):
    return RecurrentPPOLoss(
        agent.actor,
        agent.critic,
        clip_epsilon=CLIP,
        entropy_coeff=ENTROPY,
        critic_coeff=CRITIC,
        loss_critic_type="l2",
        **kwargs,
    )


@pytest.mark.parametrize("normalize", [False, True], ids=["raw", "normalized"])
@pytest.mark.parametrize("clip_value", [False, True], ids=["no-clip-value", "clip-value"])
@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_terms_and_diagnostics_match_the_masked_reference(kind, normalize, clip_value):
    agent = make_agent(kind)
    batch = _padded(agent)
    assert (~batch["loss_mask"]).any()
    with torch.no_grad():
        _, log_prob = _reference(agent, batch)
    # behaviour log-probs near the current ones: some ratios are clipped, none are 1
    mask = batch["loss_mask"]
    g = torch.Generator().manual_seed(2)
    batch["action_log_prob"][mask] = log_prob + 0.3 * torch.randn(log_prob.shape, generator=g)
    dirty = _garbage(batch)
    loss = _loss(
        agent, normalize_advantage=normalize, clip_value=CLIP_VALUE if clip_value else None
    )
    expected, _ = _reference(agent, batch, normalize=normalize, clip_value=clip_value)
    out = loss(dirty)
    keys = KEYS + (("value_clip_fraction",) if clip_value else ())
    assert set(out.keys()) == set(keys)
    for key in keys:
        assert out[key].shape == (), key
        torch.testing.assert_close(out[key], expected[key].detach(), atol=1e-5, rtol=1e-5, msg=key)
    assert 0 < out["clip_fraction"] < 1
    if clip_value:
        assert 0 < out["value_clip_fraction"] < 1

    # the same gradients as the reference's (padding never reaches them)
    parameters = [
        *agent.core.parameters(),
        *agent.policy_head.parameters(),
        *agent.value_head.parameters(),
    ]
    total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
    grads = torch.autograd.grad(total, parameters)
    total_ref = expected["loss_objective"] + expected["loss_critic"] + expected["loss_entropy"]
    grads_ref = torch.autograd.grad(total_ref, parameters)
    for grad, grad_ref in zip(grads, grads_ref, strict=True):
        assert torch.isfinite(grad).all()
        torch.testing.assert_close(grad, grad_ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_diagnostics_at_unchanged_weights(kind):
    agent = make_agent(kind)
    batch = _padded(agent)
    mask = batch["loss_mask"]
    with torch.no_grad():
        _, log_prob = _reference(agent, batch)
    batch["action_log_prob"][mask] = log_prob
    out = _loss(agent)(_garbage(batch))
    assert out["clip_fraction"] == 0
    for key in ("ESS", "max_ratio", "mean_ratio"):
        torch.testing.assert_close(out[key], torch.tensor(1.0), msg=key)
    assert out["kl_approx"].abs() < 1e-6

    # TorchRL's ClipPPOLoss on the same batch (clean zero padding): masked loss terms, but
    # diagnostics over the padding too
    torchrl = ClipPPOLoss(agent.actor, agent.critic, clip_epsilon=CLIP, loss_critic_type="l2")
    torchrl.loss_mask_key = "loss_mask"
    with set_recurrent_mode(True):
        theirs = torchrl(batch)
    padding = (~mask).float().mean()
    torch.testing.assert_close(theirs["clip_fraction"], padding)
    assert theirs["kl_approx"] > 0.1 * padding  # -log pi(a) on every padded step, not 0
    assert theirs["ESS"].shape != () and theirs["explained_variance"].shape != ()


def test_garbage_changes_nothing():
    agent = make_agent("lstm")
    batch = _padded(agent)
    loss = _loss(agent, normalize_advantage=True, clip_value=CLIP_VALUE)
    clean, dirty = loss(batch), loss(_garbage(batch))
    for key, value in clean.items():
        torch.testing.assert_close(value, dirty[key], msg=key)


@pytest.mark.parametrize("garbage", [1e20, float("nan")])
def test_garbage_in_padded_box_actions_leaves_the_gradients(garbage):
    import gymnasium as gym

    from rppo_td.modules import RecurrentActor, RecurrentActorCritic, RecurrentCritic

    torch.manual_seed(0)
    net = RecurrentActorCritic(
        gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (2,)), hidden_size=4
    )
    mask = torch.tensor([[True, True, False], [True, False, False]])
    batch = TensorDict(
        {
            "observation": torch.randn(2, 3, 3),
            "is_init": torch.zeros(2, 3, 1, dtype=torch.bool),
            "action": torch.randn(2, 3, 2),
            "action_log_prob": torch.full((2, 3), -1.0),
            "advantage": torch.randn(2, 3, 1),
            "value_target": torch.randn(2, 3, 1),
            "loss_mask": mask,
            **{key: torch.zeros(2, 3, 1, 4) for key in net.state_keys},
        },
        [2, 3],
    )
    dirty = batch.clone()
    dirty["action"][~mask] = garbage
    loss = RecurrentPPOLoss(RecurrentActor(net), RecurrentCritic(net))
    grads = []
    for td in (batch, dirty):
        net.zero_grad(set_to_none=True)
        out = loss(td)
        (out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]).backward()
        grads.append({name: p.grad for name, p in net.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, msg=name)


def test_input_is_not_modified_and_outputs_log_as_scalars(tmp_path):
    agent = make_agent("lstm")
    batch = _padded(agent)
    before = batch.clone()
    out = _loss(agent, clip_value=True)(batch)
    assert set(batch.keys(True, True)) == set(before.keys(True, True))
    assert (batch == before).all()
    logger = CSVLogger("run", log_dir=str(tmp_path))
    for key, value in out.items():
        assert value.ndim == 0, key
        logger.log_scalar(key, value.detach(), step=0)
    written = {p.stem for p in (tmp_path / "run" / "scalars").glob("*.csv")}
    assert written == set(out.keys())


def test_without_a_mask_every_step_is_real():
    agent = make_agent("lstm")
    batch = _padded(agent)
    full = batch[batch["loss_mask"].all(-1)]  # the sequences with no padding
    assert full.batch_size[0] > 0
    loss = _loss(agent)
    with_mask, without = loss(full), loss(full.exclude("loss_mask"))
    for key, value in with_mask.items():
        torch.testing.assert_close(value, without[key], msg=key)


def test_the_mask_key_is_one_setting():
    agent = make_agent("lstm")
    batch = _padded(agent)
    expected = _loss(agent)(_garbage(batch))
    renamed = _garbage(batch).rename_key_("loss_mask", ("masks", "real"))
    by_keyword = _loss(agent, loss_mask_key=("masks", "real"))
    by_set_keys = _loss(agent)
    by_set_keys.set_keys(loss_mask=("masks", "real"))
    by_attribute = _loss(agent)
    by_attribute.loss_mask_key = ("masks", "real")  # TorchRL's LossModule attribute
    for loss in (by_keyword, by_set_keys, by_attribute):
        assert loss.loss_mask_key == loss.tensor_keys.loss_mask == ("masks", "real")
        assert ("masks", "real") in loss.in_keys
        out = loss(renamed)
        for key, value in expected.items():
            torch.testing.assert_close(out[key], value, msg=key)
    loss = _loss(agent)
    loss.loss_mask_key = "other"
    assert loss.tensor_keys.loss_mask == "other"
    with pytest.raises(ValueError, match="always masked"):
        loss.loss_mask_key = None


def test_refusals():
    agent = make_agent("lstm")
    batch = _padded(agent)
    loss = _loss(agent)
    with pytest.raises(ValueError, match="bool"):
        loss(batch.set("loss_mask", batch["loss_mask"].float()))
    with pytest.raises(ValueError, match="normalize_advantage_exclude_dims"):
        _loss(agent, normalize_advantage_exclude_dims=(-1,))
    with pytest.raises(KeyError, match="value_target"):
        _loss(agent)(_padded(agent).exclude("value_target"))
    # TorchRL's loss failed on it with "'NoneType' object has no attribute 'requires_grad'"
    with pytest.raises(KeyError, match="needs the actions taken, 'action'"):
        _loss(agent)(_padded(agent).exclude("action"))
    # torch's max() of the empty ratios failed naming nothing (after, with a process
    # group, the count's all-reduce: the other ranks then waited in the next collective)
    empty = _padded(agent)[:0]
    with pytest.raises(ValueError, match=r"empty minibatch \(batch size \[0, \d+\]\)"):
        _loss(agent)(empty)


def test_padding_only_and_a_mask_key_renamed_on_one_side_are_refused():
    agent = make_agent("lstm")
    batch = _padded(agent)
    assert not batch["loss_mask"].all()  # it has padding
    # every loss and metric was NaN (max_ratio 0.0), the gradients zero
    padding = batch.clone()
    padding["loss_mask"][:] = False
    with pytest.raises(ValueError, match=r"padding only: 'loss_mask' is False at all \d+"):
        _loss(agent)(padding)
    # a mask key the padded input lacks: its padding was counted as real steps, silently
    with pytest.raises(KeyError, match=r"mask key 'mask' is not in the minibatch.*'loss_mask'"):
        _loss(agent, loss_mask_key="mask")(batch)
    # renamed on the padder's side only: no leaf named loss_mask, but rollout_steps is 0
    # on the padding
    renamed = batch.clone().rename_key_("loss_mask", "mask")
    with pytest.raises(KeyError, match=r"mask key 'loss_mask' is not.*'rollout_steps'"):
        _loss(agent)(renamed)
    expected = _loss(agent)(batch)  # renamed on both sides: the same loss
    got = _loss(agent, loss_mask_key="mask")(renamed)
    assert torch.equal(got["loss_objective"], expected["loss_objective"])


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("clip_epsilon", 0.0, "clip_epsilon must be a finite number in (0, 1)"),
        ("clip_epsilon", -0.2, "clip_epsilon must be a finite number in (0, 1)"),
        ("clip_epsilon", float("nan"), "clip_epsilon must be a finite number in (0, 1)"),
        ("clip_epsilon", True, "clip_epsilon must be a finite number in (0, 1)"),
        # 1 - 1.5 < 0: the lower bound's log was NaN, and so was loss_objective
        ("clip_epsilon", 1.5, "pair; got 1.5"),
        ("clip_epsilon", (1.2, 0.3), "0 < low < 1 and high > 0"),
        ("clip_epsilon", (0.1, float("nan")), "0 < low < 1 and high > 0"),
        ("clip_epsilon", (0.1,), "must hold two finite numbers"),
        ("clip_value", -0.1, "clip_value must be None, True, False or a finite number > 0"),
        ("clip_value", float("inf"), "clip_value must be None, True, False or a finite"),
        ("critic_coeff", -1.0, "critic_coeff must be None or a finite number >= 0, got -1.0"),
        ("critic_coeff", float("nan"), "critic_coeff must be None or a finite number >= 0"),
        ("entropy_coeff", float("nan"), "entropy_coeff must be a finite number"),
        ("entropy_coeff", {"action": float("inf")}, "entropy_coeff must be a finite number"),
    ],
)
def test_coefficients_torchrl_would_misuse_are_refused_by_name(option, value, message):
    # TorchRL's ClipPPOLoss took each of these and trained on (clip range inverted or NaN)
    agent = make_agent("lstm")
    kwargs = {"clip_epsilon": CLIP, "entropy_coeff": ENTROPY, "critic_coeff": CRITIC}
    kwargs[option] = value
    with pytest.raises(ValueError, match=re.escape(message)):
        RecurrentPPOLoss(agent.actor, agent.critic, **kwargs)
    for fine in ({"clip_value": True}, {"clip_value": 0.5}, {"critic_coeff": None}):
        RecurrentPPOLoss(agent.actor, agent.critic, **fine)


def test_an_asymmetric_clip_epsilon_is_taken_as_torchrl_takes_it():
    # ClipPPOLoss takes (low, high); the check refused it as "not a finite number"
    agent = make_agent("lstm")
    loss = RecurrentPPOLoss(agent.actor, agent.critic, clip_epsilon=(0.1, 0.3))
    low, high = loss._clip_bounds
    assert math.isclose(float(low), math.log(0.9), rel_tol=1e-6)
    assert math.isclose(float(high), math.log(1.3), rel_tol=1e-6)
    out = loss(_padded(agent))
    assert torch.isfinite(out["loss_objective"])


def test_advantage_and_log_prob_shapes_that_would_broadcast_are_refused():
    """A [B, Lp] advantage (or a [B, Lp, 1] log-prob) broadcasts against the [B, Lp, 1]
    log-ratios into a [B, Lp, Lp] loss when B == Lp or B == 1: refused by name, not computed;
    for other B the log-prob once failed inside TorchRL with a broadcast error naming nothing."""
    agent = make_agent("lstm")
    loss = _loss(agent)
    for rows in (1, 3, 4):  # one sequence; fewer; as many sequences as positions (Lp = 4)
        batch = _padded(agent)[:rows]
        assert batch.batch_size[1] == 4
        bad = batch.clone().set("advantage", batch["advantage"].squeeze(-1))
        with pytest.raises(ValueError, match=r"'advantage' must have shape \[\*batch, 1\]"):
            loss(bad)
        bad = batch.clone().set("action_log_prob", batch["action_log_prob"].unsqueeze(-1))
        with pytest.raises(ValueError, match=r"'action_log_prob' must hold one log-prob.*got \["):
            loss(bad)
        loss(batch)  # the right shapes still pass


def test_a_log_prob_per_action_dimension_is_refused_with_the_way_out():
    # torch.distributions.Normal gives [B, Lp, A]: the refusal said what was wrong, not how
    # to mend it (a distribution that sums over the dimensions, or a summed log-prob)
    agent = make_agent("lstm")
    loss = _loss(agent)
    batch = _padded(agent)
    per_dim = batch.clone().set(
        "action_log_prob", batch["action_log_prob"][..., None].expand(*batch.batch_size, 3).clone()
    )
    with pytest.raises(
        ValueError,
        match=r"got \[.*, 3\]: one per action dimension\? .*"
        r"IndependentNormal",
    ):
        loss(per_dim)
    # a log-prob whose leading dims are not the steps' gets no such hint
    from rppo_td.objectives._loss import _log_prob_shape_error

    error = _log_prob_shape_error(loss.tensor_keys, torch.Size([4, 5, 1]), [4, 6, 3])
    assert "action dimension" not in str(error)


def test_only_an_out_of_bounds_failure_of_the_log_prob_is_read_as_a_bad_action(monkeypatch):
    agent = make_agent("lstm")
    loss = _loss(agent)
    for error, message in [
        (RuntimeError("something else"), r"^something else$"),
        (IndexError("index 9 is out of bounds for dimension 0"), r"^the stored 'action' holds"),
        (RuntimeError("index 9 is out of bounds for dimension 2"), r"^the stored 'action' holds"),
    ]:

        def fail(*args, error=error, **kwargs):
            raise error

        monkeypatch.setattr(loss, "_log_weight", fail)
        with pytest.raises(type(error), match=message):
            loss(_padded(agent))


def test_critic_loss_type_and_normalize_advantage_are_checked_at_construction():
    # "l3" failed at the first forward (TorchRL's NotImplementedError); "yes" was truthy
    import numpy as np

    agent = make_agent("lstm")
    with pytest.raises(ValueError, match=r"loss_critic_type must be one of \['l1', 'l2', "):
        RecurrentPPOLoss(agent.actor, agent.critic, loss_critic_type="l3")
    for bad in ("yes", 1, None):
        with pytest.raises(TypeError, match="normalize_advantage must be True or False"):
            RecurrentPPOLoss(agent.actor, agent.critic, normalize_advantage=bad)
    loss = RecurrentPPOLoss(agent.actor, agent.critic, normalize_advantage=np.bool_(True))
    assert loss.normalize_advantage is True


def test_an_action_outside_the_action_space_is_named():
    # torch's "index 7 is out of bounds for dimension 2 with size 2" named no key
    agent = make_agent("lstm")
    loss = _loss(agent)
    for bad in (7, -1):
        batch = _padded(agent)
        batch["action"][0, 0] = bad
        with pytest.raises(RuntimeError, match=r"the stored 'action' holds an action outside"):
            loss(batch)


def test_make_value_estimator_returns_the_loss_for_every_estimator():
    from torchrl.objectives.utils import ValueEstimators

    agent = make_agent("lstm")
    loss = _loss(agent)
    for kind in (None, ValueEstimators.GAE, ValueEstimators.TD0, ValueEstimators.TDLambda):
        assert loss.make_value_estimator(kind, gamma=0.9) is loss


def test_padded_sequences_without_advantage_reach_no_estimator_that_misuses_them():
    # TorchRL's "gae" alias gave TorchRL's GAE, which (as TD(lambda) and V-trace) ran its
    # recursion through the padding: padded rewards moved loss_objective from 2.31 to -44.45
    from torchrl.objectives.utils import ValueEstimators

    from rppo_td import GAEEstimator

    agent = make_agent("lstm")
    batch = _padded(agent).exclude("advantage")
    batch["next"] = TensorDict(
        {
            "observation": torch.randn(*batch.batch_size, 2),
            "reward": torch.randn(*batch.batch_size, 1),
            "done": torch.zeros(*batch.batch_size, 1, dtype=torch.bool),
            "terminated": torch.zeros(*batch.batch_size, 1, dtype=torch.bool),
        },
        batch.batch_size,
    )
    assert not batch["loss_mask"].all()
    for alias in ("gae", "GAE", ValueEstimators.GAE):
        loss = _loss(agent).make_value_estimator(alias, gamma=0.9)
        assert isinstance(loss.value_estimator, GAEEstimator)
        with pytest.raises(KeyError, match=r"'advantage' is missing .* before SequencePadder"):
            loss(batch)
    for recursive in (ValueEstimators.TD1, ValueEstimators.TDLambda):
        loss = _loss(agent).make_value_estimator(recursive, gamma=0.9)
        with pytest.raises(ValueError, match="would run its recursion over time through their"):
            loss(batch)
    # TD(0) reads one step at a time: padded sequences reach it
    _loss(agent).make_value_estimator(ValueEstimators.TD0, gamma=0.9)._check_estimator_input(batch)


def test_one_number_tensor_coefficients_are_taken_as_clipppoloss_takes_them():
    agent = make_agent("lstm")
    batch = _padded(agent)
    given = _loss(agent, clip_value=CLIP_VALUE)(batch)
    as_tensors = RecurrentPPOLoss(
        agent.actor, agent.critic, clip_epsilon=CLIP, entropy_coeff=ENTROPY,
        critic_coeff=torch.tensor(CRITIC), loss_critic_type="l2",
        clip_value=torch.tensor(CLIP_VALUE),
    )(batch)  # fmt: skip
    for key in ("loss_objective", "loss_critic", "value_clip_fraction"):
        torch.testing.assert_close(as_tensors[key], given[key])
    with pytest.raises(ValueError, match="clip_value must be None"):
        _loss(agent, clip_value=torch.tensor([0.1, 0.2]))
    with pytest.raises(ValueError, match=r"needs a batch of steps .* got batch size \[\]"):
        _loss(agent)(batch[0, 0])


@pytest.mark.parametrize("kind", [np.float32, np.float64])
def test_numpy_number_coefficients_are_taken_as_floats(kind):
    # a sweep's np.linspace: TorchRL refuses np.float32 for some coefficients itself
    agent = make_agent("lstm")
    batch = _padded(agent)
    given = _loss(agent, clip_value=CLIP_VALUE)(batch)
    for clip in (kind(CLIP), (kind(CLIP), kind(CLIP))):
        as_numpy = RecurrentPPOLoss(
            agent.actor, agent.critic, clip_epsilon=clip, entropy_coeff=kind(ENTROPY),
            critic_coeff=kind(CRITIC), loss_critic_type="l2", clip_value=kind(CLIP_VALUE),
        )(batch)  # fmt: skip
        for key in ("loss_objective", "loss_critic", "loss_entropy", "value_clip_fraction"):
            torch.testing.assert_close(as_numpy[key], given[key])


def test_normalized_advantages_all_equal_give_no_policy_gain():
    """Equal advantages standardise to 0 (they were about 0.75 at every step, all one sign)."""
    agent = make_agent("lstm")
    batch = _padded(agent)
    batch["advantage"] = torch.full_like(batch["advantage"], 0.3)
    out = _loss(agent, normalize_advantage=True)(batch)
    assert out["loss_objective"] == 0


def test_one_real_value_is_not_normalized_as_in_clip_ppo_loss():
    """ClipPPOLoss leaves one advantage as it is; standardised it was 0 and the minibatch
    gave no policy gradient."""
    agent = make_agent("lstm")
    batch = _padded(agent)[:1]
    batch["loss_mask"] = torch.zeros_like(batch["loss_mask"])
    batch["loss_mask"][0, 0] = True
    expected, _ = _reference(agent, batch)  # not normalised
    out = _loss(agent, normalize_advantage=True)(batch)
    torch.testing.assert_close(out["loss_objective"], expected["loss_objective"].detach())
    assert out["loss_objective"] != 0


def test_a_mask_that_is_not_a_true_prefix_is_refused_by_name():
    """Padding before a real step would run through the recurrent core into it."""
    agent = make_agent("lstm")
    batch = _padded(agent)
    batch["loss_mask"] = batch["loss_mask"].clone()
    batch["loss_mask"][0, 0] = False
    with pytest.raises(ValueError, match=r"'loss_mask' must be a True prefix in every row"):
        _loss(agent)(batch)


def test_a_feed_forward_loss_takes_a_mask_with_gaps():
    """Without a recurrent core nothing runs from one step into the next: any step may be
    masked (steps after an autoreset, say), as before the True-prefix check."""
    torch.manual_seed(0)
    actor, critic = _feed_forward(actions=4)
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[1, 2] = False
    td = TensorDict(
        {
            "observation": torch.randn(4, 6, 3),
            "action": torch.randint(0, 4, (4, 6)),
            "action_log_prob": torch.randn(4, 6) - 1.4,
            "advantage": torch.randn(4, 6, 1),
            "value_target": torch.randn(4, 6, 1),
            "loss_mask": mask,
        },
        [4, 6],
    )
    ours = RecurrentPPOLoss(actor, critic)(td)["loss_objective"]
    theirs = ClipPPOLoss(actor, critic)(td[mask].exclude("loss_mask"))["loss_objective"]
    torch.testing.assert_close(ours, theirs)


def test_per_head_entropy_coefficients_on_a_single_head_policy_are_refused_by_name():
    """A mapping for entropy_coeff needs a composite distribution: on one head it is refused
    naming the setting (TorchRL failed inside with "'Tensor' object has no attribute
    'items'")."""
    agent = make_agent("lstm")
    loss = RecurrentPPOLoss(agent.actor, agent.critic, entropy_coeff={"action": 0.01})
    with pytest.raises(ValueError, match=r"entropy_coeff is a mapping .*'action'.* not composite"):
        loss(_padded(agent))


def test_per_head_entropy_coefficients_weigh_each_heads_real_steps():
    """entropy_coeff={head: coeff} (TorchRL's map for composite actions) weighs each head's
    entropy, over the real steps only: the padded loss equals ClipPPOLoss on the real steps."""
    from tensordict.nn import (
        CompositeDistribution,
        TensorDictModule,
        TensorDictSequential,
        set_composite_lp_aggregate,
    )
    from torchrl.modules import ProbabilisticActor, ValueOperator

    torch.manual_seed(0)
    with set_composite_lp_aggregate(False):
        split = TensorDictModule(
            lambda x: (x[..., :2], x[..., 2:]),
            ["features"],
            [("params", "a1", "logits"), ("params", "a2", "logits")],
        )

        def two_heads(heads, a2):
            """A two-head composite actor on a Linear(3, 5); ``a2``: the second's class."""
            return ProbabilisticActor(
                TensorDictSequential(
                    TensorDictModule(torch.nn.Linear(3, 5), ["observation"], ["features"]), heads
                ),
                in_keys=["params"],
                distribution_class=CompositeDistribution,
                distribution_kwargs={
                    "distribution_map": {"a1": torch.distributions.Categorical, "a2": a2}
                },
                return_log_prob=True,
                out_keys=["a1", "a2"],
            )

        actor = two_heads(split, torch.distributions.Categorical)
        critic = ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"])
        mask = torch.tensor([[True, True, True, False, False], [True] * 5])
        td = TensorDict(
            {
                "observation": torch.randn(2, 5, 3),
                "advantage": torch.randn(2, 5, 1),
                "value_target": torch.randn(2, 5, 1),
                "loss_mask": mask,
            },
            [2, 5],
        )
        with torch.no_grad():
            td = actor(td)
        coeff = {"a1_entropy": 0.1, "a2_entropy": 0.0}
        ours = RecurrentPPOLoss(actor, critic, entropy_coeff=coeff)(td)["loss_entropy"]
        real = td[mask].exclude("loss_mask")  # the 8 real steps, batch [8]
        theirs = ClipPPOLoss(actor, critic, entropy_coeff=coeff)(real)["loss_entropy"]
        torch.testing.assert_close(ours, theirs)
        scalar = RecurrentPPOLoss(actor, critic, entropy_coeff=0.1)(td)["loss_entropy"]
        torch.testing.assert_close(
            scalar, ClipPPOLoss(actor, critic, entropy_coeff=0.1)(real)["loss_entropy"]
        )

        # heads of other event shapes (a Normal over [1] beside a Categorical), B == Lp: added
        # as they came, the [B, Lp, 1] and [B, Lp, 1, 1] entropies broadcast to a wrong
        # number (B == Lp) or failed naming nothing (B != Lp)
        three = TensorDictModule(
            lambda x: (x[..., :3], x[..., 3:4], x[..., 4:].exp()),
            ["features"],
            [("params", "a1", "logits"), ("params", "a2", "loc"), ("params", "a2", "scale")],
        )
        mixed = two_heads(three, torch.distributions.Normal)
        for b in (4, 3):
            mask = torch.ones(b, 4, dtype=torch.bool)
            mask[0, 2:] = False
            td = TensorDict(
                {
                    "observation": torch.randn(b, 4, 3),
                    "advantage": torch.randn(b, 4, 1),
                    "value_target": torch.randn(b, 4, 1),
                    "loss_mask": mask,
                },
                [b, 4],
            )
            with torch.no_grad():
                td = mixed(td)
                dist = mixed.get_dist(td)
                each = dist.dists["a1"].entropy() + dist.dists["a2"].entropy().squeeze(-1)
            out = RecurrentPPOLoss(mixed, critic, entropy_coeff=0.1)(td)
            torch.testing.assert_close(out["entropy"], each[mask].mean())
            # each head's mean over the real steps, under ClipPPOLoss's key
            heads = out["composite_entropy"]
            torch.testing.assert_close(heads["a1_entropy"], dist.dists["a1"].entropy()[mask].mean())
            torch.testing.assert_close(
                heads["a2_entropy"], dist.dists["a2"].entropy().squeeze(-1)[mask].mean()
            )
            real = td[mask].exclude("loss_mask")
            theirs = ClipPPOLoss(mixed, critic, entropy_coeff=0.1)(real)
            torch.testing.assert_close(out["loss_entropy"], theirs["loss_entropy"])
            weights = {"a1_entropy": 0.1, "a2_entropy": 0.5}
            out = RecurrentPPOLoss(mixed, critic, entropy_coeff=weights)(td)
            expected = -(
                0.1 * dist.dists["a1"].entropy() + 0.5 * dist.dists["a2"].entropy().squeeze(-1)
            )[mask].mean()
            torch.testing.assert_close(out["loss_entropy"], expected)


def test_entropy_is_the_mean_over_real_steps():
    agent = make_agent("lstm")
    batch = _padded(agent)
    out = RecurrentPPOLoss(agent.actor, agent.critic)(batch)
    assert 0 < out["entropy"] <= math.log(ACTIONS) + 1e-6
    assert out["loss_critic"] > 0
    reference, _ = _reference(agent, batch)
    # the default critic loss is smooth L1, weighted by critic_coeff = 1
    mask = batch["loss_mask"]
    states = [batch[k][:, 0] for k in agent.state_keys]
    embed, _ = agent.run(batch["observation"], states)
    value = agent.value_head(embed)[mask]
    expected = F.smooth_l1_loss(value, batch["value_target"][mask])
    torch.testing.assert_close(out["loss_critic"], expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out["entropy"], reference["entropy"], atol=1e-6, rtol=1e-5)


def test_a_batch_of_one_dimension():
    """``[N]`` steps (no time) work too: a recurrent network is not required."""
    torch.manual_seed(0)
    actor, critic = _feed_forward(actions=2)
    batch = TensorDict(
        {
            "observation": torch.randn(6, 3),
            "advantage": torch.randn(6, 1),
            "value_target": torch.randn(6, 1),
            "loss_mask": torch.tensor([True] * 4 + [False] * 2),
        },
        batch_size=[6],
    )
    with torch.no_grad():
        batch = actor(batch)
    out = RecurrentPPOLoss(actor, critic)(batch)
    assert all(v.shape == () for v in out.values())
    assert out["clip_fraction"] == 0


def test_reduction_none_keeps_positions_and_zeroes_padding():
    agent = make_agent("lstm")
    batch = _garbage(_padded(agent))
    mask = batch["loss_mask"]
    out = _loss(agent, reduction="none")(batch)
    mean = _loss(agent)(batch)
    for key in ("loss_objective", "loss_critic", "loss_entropy"):
        assert out[key].shape == mask.shape, key
        assert (out[key][~mask] == 0).all(), key
        torch.testing.assert_close(out[key][mask].mean(), mean[key], msg=key)
    assert out["clip_fraction"].shape == () and out["ESS"].shape == ()


def test_unknown_options_are_refused_not_swallowed():
    # TorchRL's PPOLoss ignores keyword arguments it does not know; RecurrentPPOLoss names them
    import gymnasium as gym

    from rppo_td.modules import RecurrentActor, RecurrentActorCritic, RecurrentCritic

    net = RecurrentActorCritic(gym.spaces.Box(-1, 1, (2,)), gym.spaces.Discrete(2), hidden_size=4)
    actor, critic = RecurrentActor(net), RecurrentCritic(net)
    with pytest.raises(TypeError, match=r"\['burn_in', 'start_state'\]; .*SequenceStartStates"):
        RecurrentPPOLoss(actor, critic, burn_in=4, start_state="refreshed")
    with pytest.raises(TypeError, match=r"unexpected keyword arguments \['clip_epslion'\]"):
        RecurrentPPOLoss(actor, critic, clip_epslion=0.1)
    with pytest.raises(TypeError, match="entropy_coeff"):  # TorchRL's own message
        RecurrentPPOLoss(actor, critic, entropy_coef=0.1)
    RecurrentPPOLoss(actor, critic, entropy_bonus=False, separate_losses=True, functional=False)


def _shared_net_batch(recurrence: str, seed: int):
    """A ``shared_critic`` net on MultiDiscrete observations, and a padded batch for it."""
    import gymnasium as gym

    from rppo_td.modules import RecurrentActorCritic

    torch.manual_seed(seed)
    nvec = [3, 4, 2]
    net = RecurrentActorCritic(
        gym.spaces.MultiDiscrete(nvec),
        gym.spaces.Discrete(3),
        recurrence=recurrence,
        hidden_size=8,
        shared_critic=True,
        encoder_skip=recurrence != "none",
    )
    b, length = 5, 6
    g = torch.Generator().manual_seed(seed)
    batch = TensorDict(
        {
            "observation": torch.stack(
                [torch.randint(0, n, (b, length), generator=g) for n in nvec], -1
            ),
            "is_init": torch.zeros(b, length, 1, dtype=torch.bool),
            "action": torch.randint(0, 3, (b, length), generator=g),
            "action_log_prob": -torch.rand(b, length, generator=g) - 0.5,
            "advantage": torch.randn(b, length, 1, generator=g),
            "value_target": torch.randn(b, length, 1, generator=g),
            "state_value": torch.randn(b, length, 1, generator=g),
            "loss_mask": torch.arange(length).expand(b, length)
            < torch.tensor([6, 3, 1, 6, 5]).unsqueeze(1),
        },
        [b, length],
    )
    for key in net.state_keys:
        batch[key] = torch.randn(b, length, *net.state_shape, generator=g)
    return net, batch


@pytest.mark.parametrize("functional", [True, False])
@pytest.mark.parametrize("recurrence", ["lstm", "gru", "none"])
def test_a_shared_trunk_runs_once_for_both_heads_with_the_same_terms_and_gradients(
    recurrence, functional
):
    import copy

    from tensordict.nn import TensorDictSequential

    from rppo_td.modules import RecurrentActor, RecurrentCritic

    net, batch = _shared_net_batch(recurrence, seed=3)
    results = []
    # the critic hidden in a TensorDictSequential: the loss cannot tell that it shares the
    # actor's trunk, so it runs the trunk once per network (TorchRL's way): the reference
    for wrap in (False, True):
        twin = copy.deepcopy(net)
        critic = RecurrentCritic(twin)
        loss = RecurrentPPOLoss(
            RecurrentActor(twin),
            TensorDictSequential(critic) if wrap else critic,
            clip_epsilon=CLIP,
            entropy_coeff=ENTROPY,
            critic_coeff=CRITIC,
            loss_critic_type="l2",
            normalize_advantage=True,
            clip_value=CLIP_VALUE,
            functional=functional,
        )
        calls: list[int] = []
        twin.actor_trunk.register_forward_hook(lambda *_, calls=calls: calls.append(1))
        out = loss(batch.clone())
        assert len(calls) == (2 if wrap else 1)
        total = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
        total.backward()
        grads = {name: p.grad for name, p in twin.named_parameters()}
        results.append((out, grads))
    (out, grads), (expected, expected_grads) = results
    assert set(out.keys()) == set(expected.keys())
    for key, value in expected.items():
        torch.testing.assert_close(out[key], value, msg=key)
    for name, grad in expected_grads.items():
        assert grad is not None and grad.abs().sum() > 0, name
        torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_a_shared_trunk_runs_once_per_network_where_it_must():
    import gymnasium as gym

    from rppo_td.modules import RecurrentActor, RecurrentActorCritic, RecurrentCritic

    net, batch = _shared_net_batch("lstm", seed=4)
    calls = []
    net.actor_trunk.register_forward_hook(lambda *_: calls.append(1))
    # separate_losses: the critic's loss must not move the shared trunk, so it runs apart
    # with its detached copy of the parameters
    loss = RecurrentPPOLoss(RecurrentActor(net), RecurrentCritic(net), separate_losses=True)
    loss(batch.clone())
    assert len(calls) == 2
    # the value read under another key than the critic writes: TorchRL's error, as before
    calls.clear()
    loss = RecurrentPPOLoss(RecurrentActor(net), RecurrentCritic(net))
    loss.set_keys(value="other_value")
    with pytest.raises(KeyError, match="other_value"):
        loss(batch.clone())

    # a critic subclass that changes the value: its forward must run
    class ScaledCritic(RecurrentCritic):
        def forward(self, tensordict):
            out = super().forward(tensordict)
            out.set("state_value", 100 * out.get("state_value"))
            return out

    calls.clear()
    RecurrentPPOLoss(RecurrentActor(net), ScaledCritic(net))(batch.clone())
    assert len(calls) == 2
    # a critic of its own
    own = RecurrentActorCritic(
        gym.spaces.MultiDiscrete([3, 4, 2]), gym.spaces.Discrete(3), hidden_size=8
    )
    assert not RecurrentActor(own).shares_trunk_with(RecurrentCritic(own))
    assert not RecurrentActor(net).shares_trunk_with(RecurrentCritic(own))


def _rppo_net_batch(shared_critic: bool):
    """rppo_td's net on Box(3) observations and a 3 x 4 minibatch of it, states included."""
    import gymnasium as gym

    from rppo_td.modules import RecurrentActorCritic

    torch.manual_seed(0)
    net = RecurrentActorCritic(
        gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), hidden_size=4,
        shared_critic=shared_critic,
    )  # fmt: skip
    b, steps = 3, 4
    batch = TensorDict(
        {
            "observation": torch.randn(b, steps, 3),
            "is_init": torch.zeros(b, steps, 1, dtype=torch.bool),
            "action": torch.randint(0, 2, (b, steps)),
            "action_log_prob": torch.full((b, steps), -0.7),
            "advantage": torch.randn(b, steps, 1),
            "value_target": torch.randn(b, steps, 1),
            "loss_mask": torch.ones(b, steps, dtype=torch.bool),
            **{key: torch.randn(b, steps, 1, 4) for key in net.state_keys},
        },
        [b, steps],
    )
    return net, batch


@pytest.mark.parametrize("shared_critic", [False, True])
def test_separate_losses_trains_what_only_the_critic_reads(shared_critic):
    # both wrappers hold the whole net: TorchRL detached every critic parameter (the value
    # head's too), so the critic loss trained nothing
    from rppo_td.modules import RecurrentActor, RecurrentCritic

    net, batch = _rppo_net_batch(shared_critic)

    def grads(separate: bool, term: str) -> dict[str, torch.Tensor | None]:
        net.zero_grad(set_to_none=True)
        loss = RecurrentPPOLoss(RecurrentActor(net), RecurrentCritic(net), separate_losses=separate)
        loss(batch.clone())[term].backward()
        return {name: p.grad for name, p in net.named_parameters()}

    critic_only = {id(p) for p in net.critic_only_parameters()}
    names = {name for name, p in net.named_parameters() if id(p) in critic_only}
    assert any(name.startswith("value_head") for name in names)
    assert shared_critic or any(name.startswith("critic_trunk") for name in names)
    apart, together = grads(True, "loss_critic"), grads(False, "loss_critic")
    for name, grad in apart.items():
        if name in names:  # what only the critic reads: the same gradient as without
            torch.testing.assert_close(grad, together[name], msg=name)
        else:  # the actor's: not moved by the critic's loss
            assert grad is None or not grad.abs().sum(), name


@pytest.mark.parametrize("shared_critic", [False, True])
def test_a_state_missing_from_the_minibatch_is_refused_for_rppo_modules(shared_critic):
    # in step mode a missing state is a zero one; in the loss every sequence ran from zero
    from rppo_td.modules import RecurrentActor, RecurrentCritic

    net, batch = _rppo_net_batch(shared_critic)
    loss = RecurrentPPOLoss(RecurrentActor(net), RecurrentCritic(net))
    loss(batch)
    for key in net.state_keys:
        role = "actor" if key in net.actor_state_keys else "critic"
        module = "RecurrentActor" if role == "actor" else "RecurrentCritic"
        with pytest.raises(KeyError, match=rf"the {role}'s {module} reads '{key}'"):
            loss(batch.exclude(key))


def test_a_degenerate_padded_distribution_leaves_the_real_entropy_analytic():
    # TorchRL samples a Monte-Carlo entropy for the whole minibatch where the analytic one is
    # not finite anywhere: a scale of inf at padding changed the real steps' entropy
    from tensordict.nn import TensorDictModule
    from torchrl.modules import IndependentNormal, ProbabilisticActor, ValueOperator

    torch.manual_seed(0)
    linear = torch.nn.Linear(3, 4)

    def loc_scale(x):
        loc, log_std = linear(x).chunk(2, -1)
        return loc, log_std.clamp(max=80.0).exp()

    actor = ProbabilisticActor(
        TensorDictModule(loc_scale, ["observation"], ["loc", "scale"]),
        in_keys=["loc", "scale"],
        distribution_class=IndependentNormal,
        return_log_prob=True,
    )
    critic = ValueOperator(torch.nn.Linear(3, 1), in_keys=["observation"])
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    td = TensorDict(
        {
            "observation": torch.randn(2, 4, 3),
            "advantage": torch.randn(2, 4, 1),
            "value_target": torch.randn(2, 4, 1),
            "loss_mask": mask,
        },
        [2, 4],
    )
    with torch.no_grad():
        actor(td)
        expected = actor.get_dist(td).entropy()[mask].mean()
    dirty = td.clone()
    dirty["observation"][~mask] = 1e30  # the padding's scale is inf, its entropy -inf
    out = RecurrentPPOLoss(actor, critic)(dirty)
    torch.testing.assert_close(out["entropy"], expected)


def test_out_keys_are_the_keys_forward_returns():
    from rppo_td.modules import RecurrentActor, RecurrentCritic

    net, batch = _rppo_net_batch(shared_critic=False)
    batch["state_value"] = torch.randn(*batch.batch_size, 1)  # clip_value's old values
    for options in (
        {},
        {"clip_value": 0.2},
        {"entropy_bonus": False},
        {"log_explained_variance": False},
    ):
        loss = RecurrentPPOLoss(RecurrentActor(net), RecurrentCritic(net), **options)
        assert set(loss.out_keys) == set(loss(batch).keys()), options


def test_value_targets_and_old_values_of_another_shape_are_refused_by_name():
    # TorchRL's distance_loss failed on them naming no key (or broadcast to [B, Lp, Lp])
    from rppo_td.modules import RecurrentActor, RecurrentCritic

    net, batch = _rppo_net_batch(shared_critic=False)
    batch["state_value"] = torch.randn(*batch.batch_size, 1)
    loss = RecurrentPPOLoss(RecurrentActor(net), RecurrentCritic(net), clip_value=0.2)
    loss(batch)
    for key in ("value_target", "state_value"):
        for shape in ((3, 4), (3, 4, 2)):
            bad = batch.clone().set(key, torch.randn(shape))
            with pytest.raises(ValueError, match=rf"'{key}' must have shape \[\*batch, 1\]"):
                loss(bad)


def test_fractional_actions_of_a_categorical_policy_are_refused():
    agent = make_agent("lstm")
    batch = _padded(agent)
    whole = batch.clone().set("action", batch["action"].float())  # 1.0 is action 1: accepted
    expected = _loss(agent)(batch)
    torch.testing.assert_close(_loss(agent)(whole)["loss_objective"], expected["loss_objective"])
    fractional = whole.clone()
    fractional["action"][0, 0] = 1.5  # read as action 1, silently
    with pytest.raises(ValueError, match=r"'action' holds 1.5, a fraction, for a categorical"):
        _loss(agent)(fractional)
    # a fraction in the padding is replaced before use: not refused
    padding = whole.clone()
    row, col = (~batch["loss_mask"]).nonzero()[0].tolist()
    padding["action"][row, col] = 0.5
    _loss(agent)(padding)


@pytest.mark.parametrize("grouped", [False, True])
def test_agents_layout_means_over_every_agent_step(grouped, monkeypatch):
    # TorchRL's agents' layout, values [B, Lp, A, 1] under a loss_mask [B, Lp]: every term and
    # diagnostic was A times too large (summed over steps x agents, divided by the steps)
    from tensordict.nn import TensorDictModule
    from torchrl.modules import ProbabilisticActor

    from rppo_td.objectives import _loss

    if grouped:  # the process-group path, as one rank: its all-reduces are the identity
        monkeypatch.setattr(_loss, "resolve_group", lambda group: (object(), 1))
        monkeypatch.setattr(_loss, "settings_across_group", lambda *args: None)
        monkeypatch.setattr(_loss, "all_reduce", lambda x, group, op=None: x.detach().clone())
    b, lp, a = 3, 4, 3
    torch.manual_seed(0)
    net = TensorDictModule(
        torch.nn.Linear(3, 3), [("agents", "observation")], [("agents", "logits")]
    )
    actor = ProbabilisticActor(
        net, in_keys=[("agents", "logits")], out_keys=[("agents", "action")],
        distribution_class=torch.distributions.Categorical, return_log_prob=True,
        log_prob_key=("agents", "action_log_prob"),
    )  # fmt: skip
    critic = TensorDictModule(
        torch.nn.Linear(3, 1), [("agents", "observation")], [("agents", "state_value")]
    )
    agents = {
        "observation": torch.randn(b, lp, a, 3),
        "advantage": torch.randn(b, lp, a, 1),
        "value_target": torch.randn(b, lp, a, 1),
    }
    mask = torch.tensor([[True] * 4, [True, True, False, False], [True, False, False, False]])
    td = TensorDict({"agents": TensorDict(agents, [b, lp, a]), "loss_mask": mask}, [b, lp])
    with torch.no_grad():
        td = critic(actor(td))
    td["agents", "action_log_prob"] += 0.5 * torch.randn(b, lp, a)  # a policy that moved
    td["agents", "state_value"] += 0.5 * torch.randn(b, lp, a, 1)  # and a critic
    keys = {
        "advantage": ("agents", "advantage"),
        "value_target": ("agents", "value_target"),
        "value": ("agents", "state_value"),
    }
    ours = RecurrentPPOLoss(actor, critic, clip_value=0.2)
    ours.set_keys(**keys)
    theirs = ClipPPOLoss(actor, critic, clip_value=0.2)  # on the real steps alone
    theirs.set_keys(**keys)
    out, real = ours(td), theirs(td[mask].unsqueeze(0))
    names = ("loss_objective", "loss_entropy", "loss_critic", "clip_fraction", "kl_approx")
    for name in (*names, "entropy", "value_clip_fraction"):
        torch.testing.assert_close(out[name], real[name], msg=name)
    # TorchRL's ESS of a [1, N, A] batch is a mean over dim 0 of one; ours, over every value
    with torch.no_grad():
        now = actor.get_dist(td).log_prob(td["agents", "action"])
    weight = (now - td["agents", "action_log_prob"])[mask].exp()
    assert 0 < out["ESS"] <= 1
    torch.testing.assert_close(
        out["ESS"], weight.sum().square() / weight.square().sum() / weight.numel()
    )


def test_the_options_compared_across_ranks():
    # an entropy_coeff mapping was read as TorchRL's placeholder 0.0 (two ranks with other
    # per-head weights passed the check), and a float64 tensor of 0.2 differed from 0.2
    import warnings

    import gymnasium as gym

    from rppo_td.modules import RecurrentActor, RecurrentActorCritic, RecurrentCritic

    net = RecurrentActorCritic(gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2), hidden_size=4)
    actor, critic = RecurrentActor(net), RecurrentCritic(net)
    options = RecurrentPPOLoss(actor, critic, entropy_coeff={"action": 0.02})._group_options()
    assert options["entropy_coeff"] == {"action": pytest.approx(0.02)}
    as_float = RecurrentPPOLoss(actor, critic, clip_epsilon=0.2)._group_options()
    with warnings.catch_warnings():  # TorchRL copies the tensor with torch.tensor(...)
        warnings.simplefilter("ignore", UserWarning)
        as_tensor = RecurrentPPOLoss(
            actor, critic, clip_epsilon=torch.tensor(0.2, dtype=torch.float64)
        )._group_options()
    assert as_float == as_tensor
