"""How fast can the default run's learning be? The LSTM kernels' floor under its Adam steps.

Takes one ``[B, Lp]`` minibatch of the default trainer's first update and times, interleaved
(``_common.time_interleaved``):

- ``step``: the whole gradient step of the trainer (``RecurrentPPOLoss`` forward, backward,
  gradient clipping, Adam), on the first rollout with its episode ends cleared, so that each
  worker's ``T`` steps make the fewest sequences, ``ceil(T / L)``, as in a late update of a
  solved run;
- ``lstm``: only the actor's and the critic's ``nn.LSTM`` forward and backward on the same
  shape (``[B, L, H]`` inputs from ``[1, B, H]`` states). No change outside the kernel can
  remove this work while the network, the batch and the step count stay as they are.

It prints both per step, then both times the run's gradient steps
(``updates * epochs * num_minibatches``): the second is a floor for the default run's learning
time. ``--sb3-seconds`` (sb3-contrib's training time from ``benchmarks/peer_sb3.py``; by default
the newest full ``results/peer_sb3-<UTC time>.json`` of this machine's CPU model) turns it
into the speed-up over sb3-contrib that the floor alone would allow, collection not counted.

    python benchmarks/learning_floor.py
    python benchmarks/learning_floor.py --quick
"""

from __future__ import annotations

import argparse
import json
import tempfile

import torch
from _common import (
    RESULTS,
    at_least,
    cpu_model,
    first_minibatch,
    positive_float,
    results_name,
    time_interleaved,
    write_json,
)
from torch import nn

from rppo_td.train import TrainConfig, Trainer


def newest_sb3_seconds() -> float | None:
    """sb3-contrib's training seconds in the newest full ``peer_sb3-<UTC time>.json`` of
    this machine's CPU model, if there is one.

    Measured in another run: the file is named in the output. Runs of another CPU model, of
    another budget than the default run's (``--quick``'s 2,048 steps), and files under
    another name (``--output``) are passed over.
    """
    budget = TrainConfig().total_steps
    for file in sorted(RESULTS.glob("peer_sb3-2*.json"), reverse=True):
        data = json.loads(file.read_text())
        row = data.get("rows", {}).get("sb3-contrib RecurrentPPO", {})
        if data.get("environment", {}).get("cpu") != cpu_model():
            continue
        if row.get("env_steps") is None or row["env_steps"] < budget * 0.9:
            continue
        print(f"sb3-contrib's seconds from {file.relative_to(RESULTS.parent.parent)}")
        return row.get("wall_time_s")
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeats", type=at_least(1), default=None, help="default 30")
    parser.add_argument("--sb3-seconds", type=positive_float, default=None)
    parser.add_argument("--quick", action="store_true", help="3 repeats unless given (CI)")
    parser.add_argument(
        "--output", type=results_name, default=None, help="JSON name under benchmarks/results/"
    )
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 30)
    sb3_seconds = args.sb3_seconds or newest_sb3_seconds()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        config = TrainConfig(output=f"{tmp}/run", progress=False, eval_episodes=0)
        trainer = Trainer(config)
        ppo = trainer.ppo
        minibatch = first_minibatch(trainer, episode_ends=False)
        batch, length = minibatch.batch_size
        hidden = config.hidden_size
        cores = [trainer.agent.actor_trunk.core, trainer.agent.critic_trunk.core]
        if not all(isinstance(core, nn.LSTM) for core in cores):
            raise SystemExit("the default agent is expected to have two LSTMs")
        inputs = torch.randn(batch, length, hidden, requires_grad=True)
        state = (torch.zeros(1, batch, hidden), torch.zeros(1, batch, hidden))

        def step() -> None:
            ppo._step(minibatch)

        def lstm() -> None:
            for core in cores:
                out, _ = core(inputs, state)
                out.sum().backward()

        times = time_interleaved({"step": step, "lstm": lstm}, repeats=repeats)
        trainer.release()
    steps = config.num_updates * config.epochs * config.num_minibatches
    medians = {name: t["median"] for name, t in times.items()}
    rows = {name: {"ms_per_step": t * 1e3, "run_s": t * steps} for name, t in medians.items()}
    share = medians["lstm"] / medians["step"]
    print(f"minibatch [{batch}, {length}], hidden {hidden}, {steps} gradient steps in the run")
    for name, row in rows.items():
        print(f"  {name:>4}: {row['ms_per_step']:6.2f} ms per step, {row['run_s']:6.1f} s per run")
    print(f"the LSTM kernels are {share:.0%} of a step")
    allowed = None
    if sb3_seconds:
        allowed = sb3_seconds / rows["lstm"]["run_s"]
        print(
            f"sb3-contrib trained in {sb3_seconds:.1f} s: the LSTM floor alone allows at most "
            f"{allowed:.1f}x, before any collection"
        )
    path = write_json(
        args.output or ("learning_floor_quick" if args.quick else "learning_floor"),
        {
            "minibatch": [batch, length],
            "hidden_size": hidden,
            "gradient_steps": steps,
            "times": rows,
            "lstm_share": share,
            "sb3_seconds": sb3_seconds,
            "speedup_allowed_by_floor": allowed,
        },
    )
    print("written", path)


if __name__ == "__main__":
    main()
