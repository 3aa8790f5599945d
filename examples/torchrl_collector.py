"""Recurrent PPO from TorchRL parts, with rppo_td as the data pipeline.

A TorchRL ``Collector`` gathers ``[W, T]`` rollouts from ``W`` CartPole environments with an
LSTM policy; rppo_td turns each rollout into padded sequences ``[N, Lp]`` with a ``loss_mask``;
``rppo_td.RecurrentPPOLoss`` (a subclass of TorchRL's ``ClipPPOLoss``) trains on minibatches of
whole sequences, its loss terms and diagnostics over the real steps only.

    python examples/torchrl_collector.py                  # 30 updates, under a minute on a CPU
    RPPO_TD_TINY=1 python examples/torchrl_collector.py   # two updates, for CI

Thirty updates are a demonstration of the wiring, not a trained agent.

The policy, the environments and the collector are TorchRL's; the data path and the masked
loss are rppo_td's.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs import Compose, GymEnv, InitTracker, RewardSum, SerialEnv, TransformedEnv
from torchrl.modules import MLP, LSTMModule, ProbabilisticActor, ValueOperator

import rppo_td
from rppo_td.functional import masked_mean


@dataclass
class Config:
    """Settings of this example; ``RPPO_TD_TINY=1`` shrinks the budget for CI."""

    env_id: str = "CartPole-v1"
    """Any gymnasium id with a Discrete action space."""
    num_workers: int = 4
    """W: environments stepped side by side (rows of the rollout)."""
    rollout_steps: int = 64
    """T: steps per worker per rollout (columns of the rollout)."""
    sequence_length: int = 16
    """L: the longest sequence the loss back-propagates through."""
    updates: int = 30
    """How many rollouts to collect and train on."""
    epochs: int = 4
    """Passes over each rollout's sequences."""
    num_minibatches: int = 4
    """Minibatches per epoch, balanced by real steps."""
    hidden_size: int = 64
    """LSTM hidden size."""
    gamma: float = 0.99
    """Discount."""
    lmbda: float = 0.95
    """GAE lambda."""
    lr: float = 3e-4
    """Adam learning rate."""
    start_state: str = "refreshed"
    """Each sequence's start state before each epoch: stored, refreshed or zero."""
    burn_in: int = 0
    """Steps of the same episode run (no gradient, no loss) before each sequence, from its
    stored or zero start state; a refreshed state has run through them already (so 0 here)."""
    seed: int = 0
    """Seeds torch, the environments and the minibatch order."""
    threads: int = 1
    """torch CPU threads. At these sizes one is fastest (rppo-train's default too): on a shared
    2-core machine torch's default took about 40 s an update, one thread about 0.6 s."""


def make_config() -> Config:
    """The default config, or a tiny one when ``RPPO_TD_TINY`` is set."""
    if os.environ.get("RPPO_TD_TINY"):
        return Config(num_workers=2, rollout_steps=32, updates=2, epochs=1, num_minibatches=2)
    return Config()


def main(cfg: Config) -> None:
    """Collects, runs the pipeline and trains; prints shapes once and losses every update."""
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)

    # ---- the policy: observation -> LSTM -> (logits, value) -------------------------------
    lstm = LSTMModule(
        input_size=4, hidden_size=cfg.hidden_size, in_key="observation", out_key="embed"
    )
    logits = TensorDictModule(
        MLP(in_features=cfg.hidden_size, out_features=2, num_cells=[64]),
        in_keys=["embed"],
        out_keys=["logits"],
    )
    actor = ProbabilisticActor(
        TensorDictSequential(lstm, logits),
        in_keys=["logits"],
        distribution_class=torch.distributions.Categorical,
        return_log_prob=True,  # writes action_log_prob, which the loss reads
    )
    # the critic shares the LSTM; its head reads the same embedding
    critic = TensorDictSequential(
        lstm,
        ValueOperator(
            MLP(in_features=cfg.hidden_size, out_features=1, num_cells=[64]), in_keys=["embed"]
        ),
    )

    # ---- the environments -------------------------------------------------------------------
    # InitTracker writes is_init, the primer stores the LSTM state entering each step, RewardSum
    # writes the running episode return (for printing only)
    def make_env() -> GymEnv:
        return GymEnv(cfg.env_id, categorical_action_encoding=True)

    env = TransformedEnv(
        SerialEnv(cfg.num_workers, make_env),
        Compose(InitTracker(), lstm.make_tensordict_primer(), RewardSum()),
    )
    env.set_seed(cfg.seed)

    # ---- the collector: one [W, T] rollout per iteration ------------------------------------
    collector = Collector(
        env,
        actor,
        frames_per_batch=cfg.num_workers * cfg.rollout_steps,
        total_frames=cfg.updates * cfg.num_workers * cfg.rollout_steps,
    )

    # ---- rppo_td: rollout [W, T] -> padded sequences [N, Lp] --------------------------------
    # GAE calls the critic one step at a time (the LSTM's sequential mode) from the state stored
    # at each step, for state_value and ("next", "state_value"); it runs the critic on a
    # selection of the critic's inputs, so only those two values (and the advantages) enter
    # the rollout.
    pipeline = Compose(
        rppo_td.GAE(gamma=cfg.gamma, lmbda=cfg.lmbda, value_network=critic),
        rppo_td.EpisodeSplitter(),
        rppo_td.SequenceChunker(sequence_length=cfg.sequence_length),
        rppo_td.SequencePadder(),
    )
    # before each epoch: the start states from the LSTM as it is now (the stored ones go stale
    # after the first epoch); with start_state stored or zero, burn_in warms them up instead.
    # The actor and the critic share the LSTM, so its state keys are computed once.
    start_states = rppo_td.SequenceStartStates(
        [actor, critic], start_state=cfg.start_state, burn_in=cfg.burn_in
    )
    sampler = rppo_td.SequenceSampler(
        cfg.num_minibatches, generator=torch.Generator().manual_seed(cfg.seed)
    )

    # ---- the loss: RecurrentPPOLoss, everything over real steps only ------------------------
    # A ClipPPOLoss subclass: it reads loss_mask, normalises the advantage over the real steps
    # and runs the LSTM in recurrent mode itself (each sequence from the state stored at
    # position 0; padding comes after the real steps, so it never changes a real step's
    # output). TorchRL's own ClipPPOLoss with `loss_fn.loss_mask_key = "loss_mask"` (inside
    # `set_recurrent_mode(True)`) gives the same loss terms, but its diagnostics are inflated
    # by the padding: clip_fraction and kl_approx are not 0 at unchanged weights.
    loss_fn = rppo_td.RecurrentPPOLoss(
        actor, critic, clip_epsilon=0.2, entropy_coeff=0.01, normalize_advantage=True
    )
    optimizer = torch.optim.Adam(loss_fn.parameters(), lr=cfg.lr)

    for update, rollout in enumerate(collector):
        # only what the loss needs; the collector's extra keys would be padded too
        returns = rollout["next", "episode_reward"][rollout["next", "done"]]
        rollout = rollout.select(
            "observation",
            "action",
            "action_log_prob",
            "is_init",
            "recurrent_state_h",
            "recurrent_state_c",
            ("next", "reward"),
            ("next", "terminated"),
            ("next", "truncated"),
            ("next", "done"),
            ("next", "observation"),
            ("next", "is_init"),
            ("next", "recurrent_state_h"),
            ("next", "recurrent_state_c"),
        )
        padded = pipeline(rollout)
        if update == 0:
            print(f"rollout   {tuple(rollout.batch_size)}  (W, T)")
            print(f"padded    {tuple(padded.batch_size)}  (N, Lp)")
            print(
                f"loss_mask {tuple(padded['loss_mask'].shape)}, "
                f"{int(padded['loss_mask'].sum())} real steps"
            )
            print(
                f"recurrent_state_h {tuple(padded['recurrent_state_h'].shape)}"
                "  (N, Lp, layers, H); position 0 starts each sequence"
            )
        for _ in range(cfg.epochs):
            for minibatch in sampler(start_states(padded)):  # [B, Lp]
                losses = loss_fn(minibatch)
                loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(loss_fn.parameters(), 0.5)
                optimizer.step()
        value_error = masked_mean(
            (padded["value_target"] - padded["state_value"]).abs(), padded["loss_mask"]
        )
        recent = f"{returns.mean().item():6.1f}" if returns.numel() else "   n/a"
        print(
            f"update {update + 1:3d}  last minibatch {tuple(minibatch.batch_size)}  "
            f"loss {loss.item():+.3f}  kl {losses['kl_approx'].item():+.4f}  "
            f"|value error| {value_error.item():.3f}  "
            f"episodes ended {returns.numel():2d}  mean return {recent}"
        )
        collector.update_policy_weights_()
    collector.shutdown()


if __name__ == "__main__":
    # --help, and no option taken silently: the budget is set by RPPO_TD_TINY only
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    main(make_config())
