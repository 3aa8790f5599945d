"""The PPO update, composed from the library: GAE -> splitter -> chunker -> sampler -> loss."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import torch
from tensordict import TensorDictBase
from torch import nn

from rppo_td.modules import RecurrentActor, RecurrentCritic
from rppo_td.objectives import RecurrentPPOLoss
from rppo_td.sampling import SequenceSampler
from rppo_td.train._distributed import average_gradients, mean_over_ranks
from rppo_td.transforms import (
    GAE,
    EpisodeSplitter,
    EpisodicNoveltyBonus,
    SequenceChunker,
    SequencePadder,
    SequenceStartStates,
)

__all__ = ["PPOSettings", "PPOUpdate"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PPOSettings:
    """The PPO hyperparameters of one update (see ``TrainConfig`` for each field)."""

    gamma: float
    lmbda: float
    sequence_length: int
    epochs: int
    num_minibatches: int
    value_coef: float
    entropy_coef: float
    max_grad_norm: float
    normalize_advantage: bool
    advantage_eps: float = 1e-8
    reward_scale: float = 1.0
    start_state: Literal["stored", "refreshed", "zero"] = "stored"
    burn_in: int = 0
    target_kl: float = 0.0


class PPOUpdate:
    """Runs one PPO update on a ``[W, T]`` rollout with the library's public pieces.

    ``GAE(value_network=critic)`` (on the full ``[W, T]``; it computes
    ``("next", "state_value")`` from the states after each step, bootstrapping on
    truncation), ``EpisodeSplitter`` and ``SequenceChunker`` prepare the rollout;
    ``SequencePadder`` regroups it once into sequences ``[N, Lp]`` with ``loss_mask``;
    with ``start_state`` other than ``"stored"`` or ``burn_in``, ``SequenceStartStates``
    sets each sequence's start state with the current networks before each epoch;
    ``SequenceSampler`` draws each epoch's minibatches of whole sequences ``[B, Lp]``;
    with ``target_kl`` above 0 the update stops after the first epoch whose minibatches'
    mean ``kl_k3`` (each measured before its step) exceeds it;
    ``RecurrentPPOLoss`` (TorchRL's ``ClipPPOLoss``, masked, in recurrent mode: each sequence
    from its stored state at position 0) gives the loss terms, summed for one Adam step with
    the gradient norm clipped. ``value_coef`` weighs ``0.5 * (V - target)^2``.

    Args:
        actor: the policy.
        critic: the value network.
        optimizer: over the parameters of both.
        settings: the hyperparameters.
        generator: draws the minibatch order (part of the checkpointed RNG state).
        world_size: ranks of a data-parallel run (torchrun); above 1 every gradient is
            averaged over the ranks after each backward pass, before the norm is clipped.
        novelty: an ``EpisodicNoveltyBonus`` applied to each rollout first (its ``coef`` set
            by the caller between updates), or None.
    """

    def __init__(
        self,
        actor: RecurrentActor,
        critic: RecurrentCritic,
        optimizer: torch.optim.Optimizer,
        *,
        settings: PPOSettings,
        generator: torch.Generator,
        world_size: int = 1,
        novelty: EpisodicNoveltyBonus | None = None,
    ) -> None:
        self.optimizer = optimizer
        self.novelty = novelty
        self.world_size = world_size
        self.settings = settings
        self.gae = GAE(gamma=settings.gamma, lmbda=settings.lmbda, value_network=critic)
        self.splitter = EpisodeSplitter()
        self.chunker = SequenceChunker(sequence_length=settings.sequence_length)
        # padded once per update; each epoch's minibatches are drawn from the padded sequences
        self.padder = SequencePadder()
        # every rank samples its own rollout: no sharding, and the same minibatch count
        self.sampler = SequenceSampler(
            settings.num_minibatches, generator=generator, rank=0, world_size=1
        )
        self.loss = RecurrentPPOLoss(
            actor,
            critic,
            entropy_coeff=settings.entropy_coef,
            critic_coeff=0.5 * settings.value_coef,
            loss_critic_type="l2",
            normalize_advantage=settings.normalize_advantage,
            normalize_advantage_eps=settings.advantage_eps,
            functional=False,
            # the update logs the rollout's explained variance (rollout_explained_variance)
            log_explained_variance=False,
            # the real-step counts and advantage statistics of all ranks together
            process_group="default" if world_size > 1 else None,
        )
        # before each epoch: the sequences' start states from the current networks
        self.start_states: SequenceStartStates | None = None
        if settings.start_state != "stored" or settings.burn_in:
            self.start_states = SequenceStartStates(
                [actor, critic], start_state=settings.start_state, burn_in=settings.burn_in
            )
        self.parameters = [
            p for p in {id(p): p for p in self.loss.parameters()}.values() if p.requires_grad
        ]
        self.skipped = 0  # gradient steps of the current update skipped (not finite)
        self.keys = list(
            dict.fromkeys(
                [
                    *actor.in_keys,
                    *critic.in_keys,
                    "action",
                    "action_log_prob",
                    "advantage",
                    "value_target",
                    "sequence_id",
                    "sequence_offset",
                    *(["episode_id"] if settings.burn_in else []),
                ]
            )
        )

    def prepare(self, rollout: TensorDictBase) -> TensorDictBase:
        """GAE, episode ids and sequence ids on the ``[W, T]`` rollout (in place).

        With ``novelty``, its bonus is added to ``("next", "reward")`` first; with
        ``reward_scale`` other than 1, the reward is then scaled (the value targets and the
        critic learn the scaled returns).
        """
        if self.novelty is not None:
            rollout = self.novelty(rollout)
        if self.settings.reward_scale != 1.0:
            reward = rollout.get(("next", "reward"))
            rollout.set(("next", "reward"), reward * self.settings.reward_scale)
        return self.chunker(self.splitter(self.gae(rollout)))

    def __call__(self, rollout: TensorDictBase, *, clip_epsilon: float) -> dict[str, float]:
        """Prepares ``rollout`` and runs the epochs; the mean of each statistic, and ``epochs``.

        ``epochs`` is the number of epochs run: ``settings.epochs``, or fewer where
        ``target_kl`` stopped the update.
        """
        rollout = self.prepare(rollout)
        data = rollout.select(*self.keys)
        num_sequences = int(data["sequence_id"][-1, -1]) + 1
        if self.settings.num_minibatches > num_sequences:
            raise ValueError(
                f"num_minibatches={self.settings.num_minibatches} exceeds the {num_sequences} "
                "sequences of this rollout; lower it or raise --rollout-steps/--num-workers"
            )
        sequences = self.padder(data)
        self.loss.clip_epsilon.fill_(clip_epsilon)
        totals: dict[str, torch.Tensor] = {}
        count = epochs = 0
        self.skipped = 0
        self.loss.train()
        for _ in range(self.settings.epochs):
            epoch = sequences if self.start_states is None else self.start_states(sequences)
            kl, batches = torch.zeros(()), 0
            for batch in self.sampler(epoch):
                stats = self._step(batch)
                for name, value in stats.items():
                    totals[name] = totals[name] + value if name in totals else value
                kl = kl + stats["kl_k3"]
                count += 1
                batches += 1
            epochs += 1
            # the epoch's mean KL is every rank's (the loss reduces it over the group), so
            # the ranks stop at the same epoch
            if self.settings.target_kl and float(kl) / batches > self.settings.target_kl:
                break
        if self.world_size > 1:
            # each rank's loss terms are its own share (see mean_over_ranks): the logged loss
            # is the one over every rank's steps, as the diagnostics (reduced in the loss) are
            losses = [name for name in totals if name.startswith("loss_")]
            totals.update(mean_over_ranks({name: totals[name] for name in losses}, self.world_size))
        if self.skipped:
            log.warning(
                "%d of %d gradient steps of this update were skipped: the loss or its gradient "
                "was not finite (inf or NaN; loss_total %s, grad_norm %s); those steps left "
                "the parameters as they were%s",
                self.skipped,
                count,
                f"{float(totals['loss_total']) / count:g}",
                f"{float(totals['grad_norm']) / count:g}",
                "" if self.skipped == count else " (the other steps were taken)",
            )
        means = {name: float(value) / count for name, value in totals.items()}
        if self.settings.value_coef > 0:  # without a value loss, no value figure
            # the minibatches' own figure is 1.0 for one-step minibatches and any number for
            # targets that hardly vary: the rollout's (every rank's) is logged, or nothing
            explained = rollout_explained_variance(rollout, self.world_size)
            if explained is not None:
                means["explained_variance"] = explained
        means["epochs"] = epochs
        means["skipped_steps"] = self.skipped
        if self.novelty is not None:
            # the share of the steps that reached a view new to their episode: every rank's
            # rollout has W * T steps, so the ranks' mean is the share over all of them
            share = rollout.get(self.novelty.novel_key).float().mean()
            if self.world_size > 1:
                share = mean_over_ranks({"share": share}, self.world_size)["share"]
            means["novel_fraction"] = float(share)
        return means

    def _step(self, batch: TensorDictBase) -> dict[str, torch.Tensor]:
        """One gradient step on a minibatch ``[B, Lp]``; the loss's outputs, detached."""
        out = self.loss(batch)
        loss = sum(out[key] for key in out.keys() if key.startswith("loss_"))  # noqa: SIM118
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[union-attr]
        if self.world_size > 1:
            average_gradients(self.parameters, self.world_size)
        grad_norm = nn.utils.clip_grad_norm_(
            self.parameters, self.settings.max_grad_norm, foreach=True
        )
        # a loss or gradient of inf or NaN (a reward beyond float32, say): clipping would
        # scale the gradients by 0 (inf) or make every parameter NaN, so no step is taken
        # (the ranks' averaged gradients agree, so they skip together)
        finite = bool(torch.isfinite(grad_norm))
        if finite:
            self.optimizer.step()
        self.skipped += not finite
        # the scalars (a composite action's per-head composite_entropy is a tensordict)
        stats = {
            key: value.detach() for key, value in out.items() if isinstance(value, torch.Tensor)
        }
        stats["loss_total"] = loss.detach()  # type: ignore[union-attr]
        stats["grad_norm"] = grad_norm.detach()
        return stats


def rollout_explained_variance(rollout: TensorDictBase, world_size: int = 1) -> float | None:
    """How much of the rollout's value targets the values it was collected with explain.

    ``1 - Var(value_target - state_value) / Var(value_target)`` over the ``[W, T]`` rollout's
    steps (every rank's: one all-reduce of the means, one of the spreads), in float64: the
    figure stable-baselines3 logs for PPO. None where the targets do not vary (at most
    ``1e-12`` of their mean square: ``gamma = 0`` on a task paying 1 a step), where it is
    undefined; every rank gets the same answer.
    """
    target = rollout.get("value_target").double()
    residual = target - rollout.get("state_value").double()  # the advantage
    centres = {"target": target.mean(), "residual": residual.mean()}
    if world_size > 1:
        centres = mean_over_ranks(centres, world_size)
    spreads = {
        "target": (target - centres["target"]).square().mean(),
        "residual": (residual - centres["residual"]).square().mean(),
        "square": target.square().mean(),
    }
    if world_size > 1:
        spreads = mean_over_ranks(spreads, world_size)
    if not float(spreads["target"]) > 1e-12 * float(spreads["square"]):
        return None
    return 1.0 - float(spreads["residual"]) / float(spreads["target"])
