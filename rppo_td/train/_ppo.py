"""The PPO update: the rppo_td pipeline, then masked clipped-surrogate epochs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from rppo_td.agent import RecurrentActorCritic
from rppo_td.functional import masked_mean, masked_normalize
from rppo_td.sampling import SequenceSampler
from rppo_td.transforms import GAE, EpisodeSplitter, SequenceChunker

__all__ = ["PPOSettings", "PPOUpdate", "explained_variance"]


@dataclass(frozen=True)
class PPOSettings:
    """The PPO hyperparameters of one update (see ``TrainConfig`` for each field)."""

    gamma: float
    gae_lambda: float
    sequence_length: int
    epochs: int
    num_minibatches: int
    value_coef: float
    entropy_coef: float
    max_grad_norm: float
    normalize_advantage: bool
    advantage_eps: float = 1e-8


def explained_variance(value: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``1 - Var(target - value) / Var(target)`` over all (real) steps; NaN if Var is 0."""
    var = target.var(unbiased=False)
    return torch.where(var > 0, 1 - (target - value).var(unbiased=False) / var, torch.nan)


class PPOUpdate:
    """Runs one PPO update on a ``[W, T]`` rollout.

    The rollout goes through ``GAE`` (on the full ``[W, T]``, bootstrapping on truncation),
    ``EpisodeSplitter`` and ``SequenceChunker``; ``SequenceSampler`` then gathers each epoch's
    minibatches of whole sequences ``[B, Lp]`` with ``loss_mask`` straight from the rollout.
    Each sequence starts from the stored recurrent state at its position 0. Every loss term is
    a ``masked_mean`` over real steps and advantages are normalised over real steps only
    (``masked_normalize``), per minibatch.

    Args:
        agent: the actor-critic being trained.
        optimizer: over ``agent.parameters()``.
        settings: the hyperparameters.
        generator: draws the minibatch order (part of the checkpointed RNG state).
    """

    def __init__(
        self,
        agent: RecurrentActorCritic,
        optimizer: torch.optim.Optimizer,
        *,
        settings: PPOSettings,
        generator: torch.Generator,
    ) -> None:
        self.agent = agent
        self.optimizer = optimizer
        self.settings = settings
        self.gae = GAE(gamma=settings.gamma, lmbda=settings.gae_lambda)
        self.splitter = EpisodeSplitter()
        self.chunker = SequenceChunker(sequence_length=settings.sequence_length)
        # each minibatch is used (forward and backward) before the next: one buffer per epoch
        self.sampler = SequenceSampler(
            settings.num_minibatches, generator=generator, reuse_memory=True
        )
        self.parameters = [p for p in agent.parameters() if p.requires_grad]
        self.keys = [key for key, _ in agent.leaves] + [
            "action",
            "action_log_prob",
            "advantage",
            "value_target",
            *agent.state_keys,
            "sequence_id",
            "sequence_offset",
        ]

    def prepare(self, rollout: TensorDictBase) -> TensorDictBase:
        """GAE, episode ids and sequence ids on the ``[W, T]`` rollout (in place)."""
        return self.chunker(self.splitter(self.gae(rollout)))

    def __call__(self, rollout: TensorDictBase, *, clip_epsilon: float) -> dict[str, float]:
        """Prepares ``rollout`` and runs the epochs; returns the mean of each statistic."""
        rollout = self.prepare(rollout)
        data = rollout.select(*self.keys)
        num_sequences = int(data["sequence_id"][-1, -1]) + 1
        if self.settings.num_minibatches > num_sequences:
            raise ValueError(
                f"num_minibatches={self.settings.num_minibatches} exceeds the {num_sequences} "
                "sequences of this rollout; lower it or raise --rollout-steps/--num-workers"
            )
        totals: dict[str, torch.Tensor] = {}
        count = 0
        self.agent.train()
        for _ in range(self.settings.epochs):
            for batch in self.sampler(data):
                stats = self._step(batch, clip_epsilon)
                for name, value in stats.items():
                    totals[name] = totals.get(name, 0.0) + value
                count += 1
        result = {name: float(value) / count for name, value in totals.items()}
        ev = explained_variance(rollout["state_value"], rollout["value_target"])
        result["explained_variance"] = float(ev)
        return result

    def _step(self, batch: TensorDict, clip_epsilon: float) -> dict[str, torch.Tensor]:
        """One gradient step on a minibatch ``[B, Lp]``."""
        s = self.settings
        mask = batch["loss_mask"]
        obs = batch.select(*[key for key, _ in self.agent.leaves])
        state = tuple(batch[key][:, 0] for key in self.agent.state_keys)
        log_prob, entropy, value = self.agent.evaluate(obs, state, batch["action"])
        advantage = batch["advantage"].squeeze(-1)
        if s.normalize_advantage:
            advantage = masked_normalize(advantage, mask, eps=s.advantage_eps)
        log_ratio = log_prob - batch["action_log_prob"]
        ratio = log_ratio.exp()
        surrogate = torch.minimum(
            ratio * advantage, ratio.clamp(1 - clip_epsilon, 1 + clip_epsilon) * advantage
        )
        policy_loss = -masked_mean(surrogate, mask)
        value_loss = 0.5 * masked_mean((value - batch["value_target"]).square(), mask)
        entropy_mean = masked_mean(entropy, mask)
        loss = policy_loss + s.value_coef * value_loss - s.entropy_coef * entropy_mean
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.parameters, s.max_grad_norm, foreach=True)
        self.optimizer.step()
        with torch.no_grad():
            clipped = ((ratio - 1).abs() > clip_epsilon).float()
            return {
                "loss_policy": policy_loss.detach(),
                "loss_value": value_loss.detach(),
                "loss_entropy": -entropy_mean.detach(),
                "loss_total": loss.detach(),
                "entropy": entropy_mean.detach(),
                "clip_fraction": masked_mean(clipped, mask),
                "approx_kl": masked_mean((ratio - 1) - log_ratio, mask),
                "grad_norm": grad_norm.detach(),
            }
