"""What refreshed start states and burn-in cost: one PPO update, timed against stored states.

A rollout ``[W, T]`` is collected on ``rppo_td/CartPoleNoVel-v1`` by the default LSTM agent
(the trainer's own collector); then the trainer's whole update (GAE, splitting, chunking,
padding, ``epochs`` epochs of minibatches with Adam steps) runs on copies of it, interleaved,
for each start-state setting: ``stored`` (the reference, no ``SequenceStartStates``),
``refreshed``, ``zero``, ``stored`` with burn-in and ``refreshed`` with burn-in. Ratios are
against ``stored`` measured in the same run. The refresh path itself is also timed against
the step-by-step reference path (``scan_step_by_step``) that any TorchRL module takes.

    python benchmarks/start_states.py
    python benchmarks/start_states.py --quick
"""

from __future__ import annotations

import argparse
import copy

import torch
from _common import format_seconds, print_table, results_name, time_interleaved, write_json

from rppo_td import EpisodeSplitter, SequenceChunker, SequencePadder, SequenceStartStates
from rppo_td.envs import CARTPOLE_NOVEL_ID, make_vector_env
from rppo_td.modules import RecurrentActor, RecurrentActorCritic, RecurrentCritic, RecurrentPolicy
from rppo_td.train._ppo import PPOSettings, PPOUpdate
from rppo_td.train._vector_collector import VectorCollector
from rppo_td.transforms._start_states import scan_step_by_step

VARIANTS = {
    "stored": ("stored", 0),
    "refreshed": ("refreshed", 0),
    "zero": ("zero", 0),
    "stored + burn-in 4": ("stored", 4),
    "refreshed + burn-in 4": ("refreshed", 4),
}


def collect(workers: int, steps: int, hidden: int) -> tuple[RecurrentActorCritic, object]:
    env = make_vector_env(CARTPOLE_NOVEL_ID, workers)
    torch.manual_seed(0)
    net = RecurrentActorCritic(
        env.single_observation_space,
        env.single_action_space,
        hidden_size=hidden,
        normalize_observations=True,
    )
    collector = VectorCollector(
        env, RecurrentPolicy(net), leaves=net.leaves, frames_per_batch=workers * steps, seed=0
    )
    rollout = next(iter(collector))
    collector.shutdown()
    return net, rollout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--output",
        type=results_name,
        default=None,
        help="JSON name (default start_states, start_states_quick)",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    workers, steps, length, epochs = (4, 16, 8, 2) if args.quick else (16, 32, 16, 10)
    hidden = 16 if args.quick else 64
    net, rollout = collect(workers, steps, hidden)
    candidates = {}
    for name, (start_state, burn_in) in VARIANTS.items():
        own = copy.deepcopy(net)
        settings = PPOSettings(
            gamma=0.98,
            lmbda=0.8,
            sequence_length=length,
            epochs=epochs,
            num_minibatches=1,
            value_coef=0.5,
            entropy_coef=0.0,
            max_grad_norm=0.5,
            normalize_advantage=False,
            start_state=start_state,
            burn_in=burn_in,
        )
        update = PPOUpdate(
            RecurrentActor(own),
            RecurrentCritic(own),
            torch.optim.Adam(own.parameters(), lr=1e-3),
            settings=settings,
            generator=torch.Generator().manual_seed(0),
        )
        candidates[name] = lambda update=update: update(rollout.clone(), clip_epsilon=0.2)
    repeats = 3 if args.quick else 15
    times = time_interleaved(candidates, repeats=repeats)
    reference = times["stored"]["median"]
    rows = [
        [name, format_seconds(t["median"]), f"{t['median'] / reference:.2f}x"]
        for name, t in times.items()
    ]
    print(f"one PPO update, W={workers} T={steps} L={length} epochs={epochs} LSTM {hidden}")
    print_table(["start state", "median", "vs stored"], rows)

    # the refresh alone: rppo_td's fast path against the step-mode reference path
    sequences = SequencePadder()(
        SequenceChunker(sequence_length=length)(EpisodeSplitter()(rollout.clone()))
    )
    modules = [RecurrentActor(net), RecurrentCritic(net)]
    fast = SequenceStartStates(modules, start_state="refreshed")
    view = rollout.select(*net.observation_keys, "is_init", *net.state_keys)

    def step_mode() -> None:
        for module in modules:
            start = {key: view[key][:, 0] for key in module.state_keys}
            scan_step_by_step(module, view, start)

    refresh = time_interleaved(
        {"fast path": lambda: fast(sequences), "step-mode reference": step_mode},
        repeats=repeats,
    )
    ratio = refresh["step-mode reference"]["median"] / refresh["fast path"]["median"]
    print_table(
        ["refresh of one rollout", "median"],
        [[name, format_seconds(t["median"])] for name, t in refresh.items()],
    )
    print(f"fast path {ratio:.1f}x faster than the step-mode reference")
    path = write_json(
        args.output or ("start_states_quick" if args.quick else "start_states"),
        {
            "shape": {
                "workers": workers,
                "steps": steps,
                "sequence_length": length,
                "epochs": epochs,
                "hidden": hidden,
            },
            "update": times,
            "update_ratios": {name: t["median"] / reference for name, t in times.items()},
            "refresh": refresh,
            "refresh_speedup": ratio,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
