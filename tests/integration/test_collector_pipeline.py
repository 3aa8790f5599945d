"""A TorchRL collector's rollout through the whole pipeline into a masked recurrent PPO loss.

``Collector`` over ``SerialEnv`` of ``TransformedEnv(GymEnv("CartPole-v1"), InitTracker())`` (a
``StepCounter`` adds time-limit truncations) with an ``LSTMModule`` policy and its recurrent-state
primer -> GAE (values from a value module) -> EpisodeSplitter -> SequenceChunker ->
SequencePadder / SequenceSampler -> an LSTM re-run from each sequence's stored state -> a
masked clipped-ratio loss whose backward runs.

The policy is the one that collected the data, so re-running it over the padded sequences
must reproduce the stored ``action_log_prob`` at every real step: that only holds if every
sequence starts from its stored state and never crosses an episode end.
"""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torchrl.data import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
from torchrl.envs import GymEnv, InitTracker, SerialEnv, StepCounter, TransformedEnv
from torchrl.envs.transforms import Compose
from torchrl.modules import LSTMModule, OneHotCategorical, ProbabilisticActor

from rppo_td import (
    GAE,
    EpisodeSplitter,
    GAEEstimator,
    SequenceChunker,
    SequencePadder,
    SequenceReplaySampler,
    SequenceSampler,
)
from rppo_td.functional import masked_mean, masked_normalize
from tests.integration._cartpole import collect_once

NUM_WORKERS = 2
STEPS = 48
MAX_EPISODE_STEPS = 20
SEQUENCE_LENGTH = 8
HIDDEN = 16


def _make_env():
    return TransformedEnv(
        GymEnv("CartPole-v1"), Compose(InitTracker(), StepCounter(max_steps=MAX_EPISODE_STEPS))
    )


class Agent:
    """An LSTM actor and an MLP critic small enough for a CPU test."""

    def __init__(self, env) -> None:
        torch.manual_seed(0)
        self.lstm = LSTMModule(
            input_size=4, hidden_size=HIDDEN, in_key="observation", out_key="embed"
        )
        self.head = torch.nn.Linear(HIDDEN, 2)
        self.actor = ProbabilisticActor(
            TensorDictSequential(
                self.lstm,
                TensorDictModule(self.head, in_keys=["embed"], out_keys=["logits"]),
            ),
            in_keys=["logits"],
            out_keys=["action"],
            distribution_class=OneHotCategorical,
            return_log_prob=True,
            spec=env.action_spec,
        )
        self.critic = TensorDictModule(
            torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1)),
            in_keys=["observation"],
            out_keys=["state_value"],
        )

    def parameters(self):
        return [*self.lstm.parameters(), *self.head.parameters(), *self.critic.parameters()]

    def log_prob(self, minibatch):
        """Re-runs the LSTM over ``[B, Lp]`` sequences from their stored state at position 0."""
        h0 = minibatch["recurrent_state_h"][:, 0].transpose(0, 1).contiguous()
        c0 = minibatch["recurrent_state_c"][:, 0].transpose(0, 1).contiguous()
        embed, _ = self.lstm.lstm(minibatch["observation"], (h0, c0))
        logits = self.head(embed)
        return (torch.log_softmax(logits, -1) * minibatch["action"].float()).sum(-1)


@pytest.fixture(scope="module")
def collected():
    env = SerialEnv(NUM_WORKERS, _make_env)
    agent = Agent(env)
    env = env.append_transform(agent.lstm.make_tensordict_primer())
    env.set_seed(0)
    return agent, collect_once(env, agent.actor, NUM_WORKERS * STEPS)


def _ppo_loss(agent, minibatch, clip=0.2):
    mask = minibatch["loss_mask"]
    log_prob = agent.log_prob(minibatch)
    ratio = (log_prob - minibatch["action_log_prob"]).exp()
    advantage = masked_normalize(minibatch["advantage"].squeeze(-1), mask)
    surrogate = torch.minimum(ratio * advantage, ratio.clamp(1 - clip, 1 + clip) * advantage)
    value = agent.critic(minibatch.select("observation").clone())["state_value"]
    value_loss = masked_mean((value - minibatch["value_target"]).square(), mask)
    return -masked_mean(surrogate, mask) + 0.5 * value_loss, log_prob


def _check_minibatch(agent, minibatch):
    mask = minibatch["loss_mask"]
    loss, log_prob = _ppo_loss(agent, minibatch)
    # same policy, sequences started from their stored state: stored log-probs come back
    torch.testing.assert_close(
        log_prob[mask], minibatch["action_log_prob"][mask], atol=1e-5, rtol=1e-4
    )
    for parameter in agent.parameters():
        parameter.grad = None
    loss.backward()
    grads = [p.grad for p in agent.parameters()]
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    assert any(bool(g.abs().sum() > 0) for g in agent.lstm.parameters() for g in [g.grad])
    return int(mask.sum())


def test_collector_output_has_the_rollout_layout(collected):
    _, rollout = collected
    assert rollout.batch_size == (NUM_WORKERS, STEPS)
    assert rollout["recurrent_state_h"].shape == (NUM_WORKERS, STEPS, 1, HIDDEN)
    assert rollout["is_init"].dtype == torch.bool
    # the time limit makes truncations, CartPole's pole makes terminations (seeded)
    assert bool(rollout["next", "truncated"].any()) and bool(rollout["next", "terminated"].any())
    assert torch.equal(
        rollout["next", "done"], rollout["next", "truncated"] | rollout["next", "terminated"]
    )


def test_pipeline_into_masked_lstm_loss(collected):
    agent, rollout = collected
    td = GAE(gamma=0.99, lmbda=0.95, value_network=agent.critic)(rollout.clone())
    assert td["advantage"].shape == (NUM_WORKERS, STEPS, 1)
    td = SequenceChunker(sequence_length=SEQUENCE_LENGTH)(EpisodeSplitter()(td))
    padded = SequencePadder()(td)
    assert padded.batch_size[1] == SEQUENCE_LENGTH
    assert (SequencePadder().inv(padded) == td).all()
    generator = torch.Generator().manual_seed(0)
    for source in (padded, td):  # padded sequences, and lazily from the chunked rollout
        sampler = SequenceSampler(num_minibatches=4, generator=generator)
        steps = [_check_minibatch(agent, mb) for mb in sampler(source)]
        assert sum(steps) == NUM_WORKERS * STEPS


def test_pipeline_through_compose_and_replay_buffer(collected):
    agent, rollout = collected
    pipeline = Compose(
        GAE(gamma=0.99, lmbda=0.95, value_network=agent.critic),
        EpisodeSplitter(),
        SequenceChunker(sequence_length=SEQUENCE_LENGTH),
        SequencePadder(),
    )
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(NUM_WORKERS, ndim=1),
        sampler=SamplerWithoutReplacement(),
        transform=pipeline,
        batch_size=NUM_WORKERS,
    )
    buffer.extend(rollout.exclude("state_value", ("next", "state_value")))
    padded = buffer.sample()
    assert padded.batch_dims == 2 and int(padded["loss_mask"].sum()) == NUM_WORKERS * STEPS

    # the padded sequences in a second buffer, one epoch of balanced minibatches
    sequences = ReplayBuffer(
        storage=LazyTensorStorage(padded.batch_size[0]),
        sampler=SequenceReplaySampler(3, generator=torch.Generator().manual_seed(1)),
    )
    sequences.extend(padded)
    steps = [_check_minibatch(agent, sequences.sample(1)) for _ in range(3)]
    assert sequences.sampler.ran_out
    assert sum(steps) == NUM_WORKERS * STEPS


def test_split_trajs_output_is_refused(collected):
    # Collector(split_trajs=True) runs torchrl's split_trajectories on this very rollout:
    # [num_trajs, max_len] with its own padding, marked by ("collector", "mask")
    from torchrl.collectors.utils import split_trajectories

    _, rollout = collected
    assert rollout.get(("collector", "mask"), None) is None  # the default output passes
    split = split_trajectories(rollout.clone())
    mask = split["collector", "mask"]
    assert int(mask.sum()) == NUM_WORKERS * STEPS < mask.numel()  # padding it would count
    # the estimator too (RecurrentPPOLoss's own GAE): it once ran on the padding silently
    estimator = GAEEstimator(gamma=0.99, lmbda=0.95, value_network=None)
    for transform in (GAE(gamma=0.99, lmbda=0.95), EpisodeSplitter(), estimator):
        with pytest.raises(ValueError, match=r"split_trajs=True.*split_trajs=False"):
            transform(split.clone())
