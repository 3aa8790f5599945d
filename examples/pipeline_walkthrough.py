"""One rollout through the rppo_td pipeline, with the shapes at every stage.

No environment and no network: a small synthetic ``[W, T]`` rollout with hand-placed episode
ends (one termination, one time-limit truncation) goes through ``GAE -> EpisodeSplitter ->
SequenceChunker -> SequencePadder -> DeviceMover -> SequenceSampler``, and the script prints what
each stage adds. The last stage checks the round trip back to ``[W, T]``.

    python examples/pipeline_walkthrough.py
    RPPO_TD_TINY=1 python examples/pipeline_walkthrough.py   # same thing (it is tiny already)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase

import rppo_td


@dataclass
class Config:
    """The synthetic rollout and the pipeline's settings."""

    num_workers: int = 3
    """W: rows of the rollout, one per environment."""
    rollout_steps: int = 10
    """T: columns of the rollout, steps per worker."""
    obs_dim: int = 2
    """Size of the fake observation vector."""
    hidden_size: int = 4
    """H: size of the fake recurrent state (one LSTM layer)."""
    sequence_length: int = 4
    """L: the longest sequence cut from an episode."""
    num_minibatches: int = 2
    """Minibatches per epoch."""
    gamma: float = 0.9
    """Discount."""
    lmbda: float = 0.95
    """GAE lambda."""
    seed: int = 0
    """Seeds the fake data and the minibatch order."""


def fake_rollout(cfg: Config) -> TensorDictBase:
    """A ``[W, T]`` rollout with TorchRL's keys and hand-placed episode ends.

    Worker 0 terminates at t=3 (the pole fell: no bootstrap); worker 1 is truncated at t=6
    (time limit: bootstrap from ``("next", "state_value")``); worker 2 runs the whole rollout.
    """
    W, T = cfg.num_workers, cfg.rollout_steps
    g = torch.Generator().manual_seed(cfg.seed)
    terminated = torch.zeros(W, T, 1, dtype=torch.bool)
    truncated = torch.zeros(W, T, 1, dtype=torch.bool)
    terminated[0, 3] = True
    truncated[1, 6] = True
    done = terminated | truncated
    is_init = torch.zeros(W, T, 1, dtype=torch.bool)
    is_init[:, 1:] = done[:, :-1]  # the step after an end starts an episode
    state_h = torch.randn(W, T, 1, cfg.hidden_size, generator=g)
    state_h[is_init.squeeze(-1)] = 0.0  # a new episode starts from the zero state
    value = torch.randn(W, T, 1, generator=g)
    return TensorDict(
        {
            "observation": torch.randn(W, T, cfg.obs_dim, generator=g),
            "action": torch.randint(0, 2, (W, T), generator=g),
            "action_log_prob": torch.full((W, T), -0.69),
            "state_value": value,
            "is_init": is_init,
            "recurrent_state_h": state_h,  # the state *entering* step t
            "next": {
                "reward": torch.ones(W, T, 1),
                "terminated": terminated,
                "truncated": truncated,
                "done": done,
                "state_value": torch.randn(W, T, 1, generator=g),
            },
        },
        batch_size=[W, T],
    )


def show(stage: str, td: TensorDictBase, *keys: str | tuple[str, ...]) -> None:
    """Prints a stage's batch size and the shape (and values, when small) of some keys."""
    print(f"\n== {stage}: batch {list(td.batch_size)}")
    for key in keys:
        value = td[key]
        print(f"   {key!s:24s} {list(value.shape)!s:18s} {value.dtype}")
        if value.dtype in (torch.bool, torch.int64) and value.numel() <= 40:
            if value.ndim == 3 and value.shape[-1] == 1:  # [W, T, 1] flags: shown as [W, T]
                value = value.squeeze(-1)
            text = str(value.int() if value.dtype == torch.bool else value)
            print("   " + text.replace("\n", "\n   "))


def main(cfg: Config) -> None:
    """Runs one rollout through every stage and prints it."""
    # ---- the rollout: [W, T] ------------------------------------------------------------------
    rollout = fake_rollout(cfg)
    show("rollout", rollout, "observation", "recurrent_state_h", ("next", "done"))

    # ---- GAE on the whole rollout, before any chunking ----------------------------------------
    rollout = rppo_td.GAE(gamma=cfg.gamma, lmbda=cfg.lmbda)(rollout)
    show("GAE", rollout, "advantage", "value_target")
    print("   advantage, worker 0:", [round(x, 2) for x in rollout["advantage"][0, :, 0].tolist()])

    # ---- episode ids: a new id after every done and at the start of every row -----------------
    rollout = rppo_td.EpisodeSplitter()(rollout)
    show("EpisodeSplitter", rollout, "episode_id")

    # ---- sequence ids and offsets: episodes cut into pieces of at most L steps ----------------
    rollout = rppo_td.SequenceChunker(sequence_length=cfg.sequence_length)(rollout)
    show("SequenceChunker", rollout, "sequence_id", "sequence_offset")

    # ---- padded sequences: [W, T] -> [N, Lp], right-padded, with loss_mask --------------------
    padder = rppo_td.SequencePadder()
    padded = padder(rollout)
    show("SequencePadder", padded, "loss_mask", "worker_index", "time_index", "recurrent_state_h")
    first = padded["recurrent_state_h"][:, 0]
    stored = rollout["recurrent_state_h"][padded["worker_index"][:, 0], padded["time_index"][:, 0]]
    print(
        "   position 0 holds the stored state at each sequence's first step:",
        torch.equal(first, stored),
    )
    print(
        f"   {int(padded['loss_mask'].sum())} real steps of {padded['loss_mask'].numel()} "
        "positions; padding is zero and comes last"
    )

    # ---- the training device (the CPU here; "cuda" pins and copies asynchronously) ------------
    device = "cuda" if torch.cuda.is_available() else "cpu"
    padded = rppo_td.DeviceMover(device)(padded)
    print(f"\n== DeviceMover: {padded.device}")

    # ---- one epoch of whole-sequence minibatches, balanced by real steps ----------------------
    sampler = rppo_td.SequenceSampler(
        cfg.num_minibatches, generator=torch.Generator().manual_seed(cfg.seed)
    )
    for i, minibatch in enumerate(sampler(padded)):
        print(
            f"\n== SequenceSampler minibatch {i}: batch {list(minibatch.batch_size)}, "
            f"{int(minibatch['loss_mask'].sum())} real steps"
        )

    # ---- and back: the inverse regroups [N, Lp] into the [W, T] rollout exactly --------------
    restored = padder.inv(padded.cpu())
    same = (restored == rollout).all()
    print(
        f"\n== SequencePadder.inv: batch {list(restored.batch_size)}, round trip exact: "
        f"{bool(same)}"
    )


if __name__ == "__main__":
    # --help, and no option taken silently: the budget is set by RPPO_TD_TINY only
    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()
    main(Config())
