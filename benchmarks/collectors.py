"""Collection speed: the own VectorCollector vs TorchRL's Collector (two env constructions).

All three collect ``[W, T]`` rollouts in the same layout (observation, action, log-prob, value,
``is_init``, the recurrent states entering and leaving each step, reward and episode flags) for
the same LSTM actor-critic (``build_agent(TrainConfig())``) on the same checked envs
(``rppo_td.envs.make_env``), with ``TensorDictSequential(RecurrentActor(net),
RecurrentCritic(net))`` as the policy:

- ``vector``: ``rppo_td``'s ``VectorCollector`` over ``make_vector_env``, built as the
  trainer builds it: gymnasium's ``SyncVectorEnv`` of checked copies in ``SAME_STEP``
  autoreset or, for ``rppo_td/CartPoleNoVel-v1``, ``CartPoleNoVelVectorEnv`` (the copies as
  arrays); for that env also
- ``vector, checked copies``: the same collector over the ``SyncVectorEnv`` of checked copies
  (``CheckedVectorEnv``), the same episodes.
- ``torchrl gym-vector``: ``TorchRLCollector(batching="vector")``: TorchRL's ``Collector`` over
  one ``GymWrapper`` of a ``SyncVectorEnv`` in ``AutoresetMode.DISABLED`` (TorchRL resets the
  finished sub-envs itself), plus ``InitTracker`` and the state primer.
- ``torchrl serial``: ``TorchRLCollector(batching="serial")``: the ``Collector`` over a
  ``SerialEnv`` of one ``GymWrapper`` per env.

Each candidate is one whole rollout; they are timed interleaved after a warm-up (median of the
repeats, ``_common.time_interleaved``), in one process with ``torch.set_num_threads`` as the
trainer sets it (``--threads``, default the config's). Prints steps/s, the ratio of each to
``vector``, and the machine load before and after. The PPO update is timed by
``benchmarks/update.py``.

    python benchmarks/collectors.py [--workers 16] [--steps 32] [--repeats 15] [--output NAME]
    python benchmarks/collectors.py --quick
"""

from __future__ import annotations

import argparse
import os

import torch
from _common import (
    at_least,
    format_seconds,
    print_table,
    results_name,
    time_interleaved,
    train_refusal,
    write_json,
)
from tensordict.nn import TensorDictSequential

from rppo_td.envs import make_vector_env, resolve_env_id
from rppo_td.envs._cartpole_vector import CartPoleNoVelVectorEnv
from rppo_td.envs._make import _Maker
from rppo_td.envs._vector import CheckedVectorEnv
from rppo_td.modules import RecurrentActor, RecurrentCritic
from rppo_td.train import TrainConfig
from rppo_td.train._setup import build_agent
from rppo_td.train._torchrl_collector import TorchRLCollector
from rppo_td.train._vector_collector import VectorCollector


def main() -> None:
    """Builds the three collectors, times them interleaved and prints the table."""
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--env", default=defaults.env, help="gymnasium id")
    parser.add_argument(
        "--workers",
        type=at_least(1, 100_000),
        default=None,
        help=f"W (default {defaults.num_workers}; at most 100000, as rppo-train)",
    )
    parser.add_argument(
        "--steps",
        type=at_least(1, 1_000_000),
        default=None,
        help=f"T (default {defaults.rollout_steps}; at most 1000000)",
    )
    parser.add_argument(
        "--repeats", type=at_least(1), default=None, help="timed rollouts per candidate (15)"
    )
    parser.add_argument(
        "--threads", type=at_least(1), default=defaults.threads, help="torch threads"
    )
    parser.add_argument("--quick", action="store_true", help="W=4, T=8, two repeats unless given")
    parser.add_argument(
        "--output", type=results_name, default=None, help="also write benchmarks/results/NAME.json"
    )
    args = parser.parse_args()
    refused = train_refusal(["--env", args.env])
    if refused is not None:
        parser.error(f"--env {args.env!r}: {refused}")
    quick = {"workers": 4, "steps": 8, "repeats": 2}
    full = {"workers": defaults.num_workers, "steps": defaults.rollout_steps, "repeats": 15}
    for flag, value in (quick if args.quick else full).items():  # a flag given wins
        if getattr(args, flag) is None:
            setattr(args, flag, value)
    if args.threads:
        torch.set_num_threads(args.threads)
    w, t = args.workers, args.steps
    load_before = os.getloadavg()
    print(
        f"{os.cpu_count()} CPUs, load average {load_before}, torch threads "
        f"{torch.get_num_threads()}; env {args.env}, W={w}, T={t}"
    )

    torch.manual_seed(0)
    net = build_agent(TrainConfig(env=args.env))
    policy = TensorDictSequential(RecurrentActor(net), RecurrentCritic(net))
    envs = {"vector": make_vector_env(args.env, w)}
    if isinstance(envs["vector"], CartPoleNoVelVectorEnv):
        name = resolve_env_id(args.env)
        copies = [_Maker(name, {}) for _ in range(w)]
        envs["vector, checked copies"] = CheckedVectorEnv(copies, env_id=name)
    vectors = {
        label: VectorCollector(
            env, policy, leaves=net.leaves, frames_per_batch=w * t, seed=0, device="cpu"
        )
        for label, env in envs.items()
    }
    torchrl = {
        batching: TorchRLCollector(
            args.env, net, policy, num_workers=w, rollout_steps=t, seed=0, batching=batching
        )
        for batching in ("vector", "serial")
    }
    candidates = {
        **{label: collector.rollout for label, collector in vectors.items()},
        "torchrl gym-vector": torchrl["vector"].rollout,
        "torchrl serial": torchrl["serial"].rollout,
    }
    try:
        times = time_interleaved(candidates, repeats=args.repeats, warmup=2)
    finally:
        for collector in [*vectors.values(), *torchrl.values()]:
            collector.shutdown()
    load_after = os.getloadavg()

    base = times["vector"]["median"]
    rows = []
    results = {}
    for name, figures in times.items():
        steps_per_s = w * t / figures["median"]
        results[name] = {**figures, "steps_per_s": steps_per_s}
        rows.append(
            [
                name,
                format_seconds(figures["median"]),
                f"{steps_per_s:,.0f}",
                f"{w * t / figures['min']:,.0f}",
                f"{base / figures['median']:.2f}x",
            ]
        )
    print(f"\nOne [W={w}, T={t}] rollout, median of {args.repeats} interleaved repeats")
    print_table(["collector", "rollout", "steps/s", "best steps/s", "speed vs vector"], rows)
    print(f"load average after {load_after}")
    if args.output:
        path = write_json(
            args.output,
            {
                "env": args.env,
                "workers": w,
                "time_steps": t,
                "repeats": args.repeats,
                "cpus": os.cpu_count(),
                "load_average_before": list(load_before),
                "load_average_after": list(load_after),
                "results": results,
            },
        )
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
