"""Which starts a trained MiniGrid Memory agent solves: its deterministic success by start x.

MiniGrid Memory puts the agent at a random ``x`` of the start room and hallway (``1`` to
``hallway_end``: 6 in S9), facing the junction, with the cue at ``(1, height // 2 - 1)``. With
the 3x3 view the cue is in view at the first step only from ``x = 1``; from ``x = 2, 3`` the
agent must turn round to see it, and from ``x >= 4`` turn round and walk back. A policy that
remembers the cue but never learnt to look back solves ``x = 1`` and guesses elsewhere, so the
split by start says which of these skills a run has, where its final eval only says how often
it won. Beside each start's successes: the policy's first action there (its mode: ``L``, ``R``
turn left or right, ``F`` forward) and the mode's mean probability; a policy that goes forward
at the start with probability near 1 no longer explores turning round.

Each episode ``i`` is played by ``rppo_td.train.evaluate_agent`` (the mode of the policy,
env ``i`` seeded ``--seed + i``, as ``rppo-eval`` scores); its start is read from a second env
reset with the same seed (the layout depends on the reset seed only). An episode counts as
solved if its return is positive (the matching object reached; the other one gives 0).

    python benchmarks/minigrid_starts.py runs/s9-seed0 runs/s9-seed1      # run directories
    python benchmarks/minigrid_starts.py runs/s9-seed0/checkpoint.pt --episodes 600
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from _common import print_table, results_name, write_json

import rppo_td.envs  # noqa: F401  (registers the rppo_td/ ids)
from rppo_td._validation import first_line
from rppo_td.modules import RecurrentActor, RecurrentActorCritic, observation_to_tensordict
from rppo_td.train import evaluate_agent, load_agent
from rppo_td.train._checkpoint import CheckpointError, checkpoint_file
from rppo_td.train._evaluate import _acting as acting

# MiniGrid Memory's three actions as rppo_td/MiniGrid-Memory* keeps them
ACTIONS = "LRF"


def start_positions(env_id: str, episodes: int, seed: int) -> tuple[list[int], np.ndarray]:
    """The agent's start ``x`` and first observation of each episode ``i`` (seed ``seed + i``)."""
    env = gym.make(env_id)
    try:
        unwrapped = env.unwrapped
        first = [env.reset(seed=seed)[0]]
        # set by MiniGrid Memory's reset (its layout), which no other env has
        if not hasattr(unwrapped, "success_pos") or not hasattr(unwrapped, "agent_pos"):
            raise SystemExit(
                f"{env_id} is not a MiniGrid Memory env (its unwrapped env "
                f"{type(unwrapped).__name__} has no success_pos after a reset): this "
                "script splits MiniGrid Memory episodes by start"
            )
        starts = [int(unwrapped.agent_pos[0])]
        for i in range(1, episodes):
            first.append(env.reset(seed=seed + i)[0])
            starts.append(int(unwrapped.agent_pos[0]))
        return starts, np.stack(first)
    finally:
        env.close()


def first_actions(agent: RecurrentActorCritic, first: np.ndarray) -> tuple[list[int], list[float]]:
    """The policy's mode at each episode's first step, and the mode's probability."""
    td = observation_to_tensordict(first, agent.leaves, (len(first),))
    td.set("is_init", torch.ones(len(first), 1, dtype=torch.bool))
    with acting(agent, True):  # as rppo-eval acts: no grad, eval mode, the mode
        RecurrentActor(agent)(td)
    return td.get("action").tolist(), td.get("action_log_prob").exp().tolist()


def by_start(path: str, episodes: int, seed: int) -> dict:
    """The checkpoint's deterministic returns, and its successes per start ``x``."""
    file = checkpoint_file(path)
    agent, config, _ = load_agent(file)
    return by_start_of(file, agent, config, episodes, seed)


def by_start_of(file: Path, agent: RecurrentActorCritic, config, episodes: int, seed: int) -> dict:
    """``by_start`` of a checkpoint loaded already (``load_agent``)."""
    starts, first = start_positions(config.env, episodes, seed)
    modes, chances = first_actions(agent, first)
    result = evaluate_agent(agent, config.env, episodes=episodes, seed=seed)
    returns = result["eval_returns"]
    played = Counter(starts)
    solved = Counter(x for x, value in zip(starts, returns, strict=True) if value > 0)
    first_step = {}
    for x in played:
        here = [(m, p) for s, m, p in zip(starts, modes, chances, strict=True) if s == x]
        mode = Counter(m for m, _ in here).most_common(1)[0][0]
        chance = sum(p for m, p in here if m == mode) / len(here)
        first_step[str(x)] = [ACTIONS[mode], round(chance, 3)]
    return {
        "checkpoint": str(file),
        "env": config.env,
        "train_seed": config.seed,
        "eval_return_mean": result["eval_return_mean"],
        "solved": sum(solved.values()),
        "episodes": episodes,
        "by_start": {str(x): [solved[x], played[x]] for x in sorted(played)},
        # per start: the commonest first mode, and its probability averaged over all episodes
        # of that start (0 where another mode was taken)
        "first_action": {x: first_step[x] for x in sorted(first_step, key=int)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("runs", nargs="+", help="run directories or checkpoint files")
    parser.add_argument("--episodes", type=int, default=300, help="episodes per checkpoint")
    parser.add_argument("--seed", type=int, default=100_000, help="first episode's reset seed")
    parser.add_argument(
        "--output", type=results_name, default=None, help="JSON name under benchmarks/results/"
    )
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes must be >= 1, got {args.episodes}")
    if not 0 <= args.seed <= 2**32 - args.episodes:
        parser.error(
            f"--seed must be in [0, {2**32 - args.episodes}] (episode i resets with seed + i, "
            f"below 2**32), got {args.seed}"
        )
    # every checkpoint is loaded before any is evaluated: a bad path ends the script first
    loaded = []
    for path in args.runs:
        if not Path(path).expanduser().exists():
            parser.error(f"{path} does not exist: give a run directory or a checkpoint file")
        try:
            file = checkpoint_file(path)
            agent, config, _ = load_agent(file)
        except (CheckpointError, ValueError) as err:
            parser.error(f"{path}: {first_line(err)}")
        start_positions(config.env, 1, args.seed)  # a MiniGrid Memory env, or SystemExit
        loaded.append((file, agent, config))
    results = [by_start_of(*run, args.episodes, args.seed) for run in loaded]
    starts = sorted({int(x) for r in results for x in r["by_start"]})
    rows = [
        [
            r["checkpoint"],
            str(r["train_seed"]),
            f"{r['eval_return_mean']:.3f}",
            f"{r['solved']}/{r['episodes']}",
            *(
                "{}/{} · {} {:.2f}".format(*r["by_start"][str(x)], *r["first_action"][str(x)])
                if str(x) in r["by_start"]
                else "-"
                for x in starts
            ),
        ]
        for r in results
    ]
    print_table(["checkpoint", "seed", "eval", "solved", *(f"x = {x}" for x in starts)], rows)
    if args.output:
        print(f"wrote {write_json(args.output, {'results': results})}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
