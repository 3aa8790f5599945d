"""Can the agent's policy compare a remembered cue with one in view? A supervised check.

MiniGrid Memory asks the policy, at the junction, for "forward" when the object in view is the
one seen in the start room and "turn" otherwise: an XOR of the recurrent state and the current
observation. This trains ``RecurrentActorCritic.policy`` on exactly that, without RL: sequences
of ``--length`` steps in MiniGrid Memory's symbolic observation space (``[28]``, one-hot
encoded by the agent), cue ``a`` (key or ball) at step 0 where the start room's object is seen,
corridor views after it, cue ``b`` at the last step; the label ``a == b`` is fitted with
cross-entropy on the last step's first two logits. It prints, per ``head_layers`` and seed, the
first iteration (of ``--iterations`` Adam steps, batch 256) at which a fresh batch is classified
without error.

``head_layers=0`` is a policy affine in the core's output, which is what every ``head_layers``
gave before checkpoint format 3 (the policy head lacked its ReLU). ``--forget-bias`` is added to
the LSTM's forget-gate bias at initialisation (0: PyTorch's initialisation, where the gate starts
near 0.5 and a cue fades by about ``2**-9`` over the 9 steps before the comparison).

    python benchmarks/memory_readout.py                 # head_layers 0/1 x forget_bias 0/5
    python benchmarks/memory_readout.py --quick         # one seed, few iterations
    python benchmarks/memory_readout.py --head-layers 1 --forget-bias 5 --encoder-skip 0 1
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import torch
from _common import (
    at_least,
    check_seeds,
    finite_float,
    positive_float,
    results_name,
    write_json,
)
from tensordict import TensorDict

from rppo_td.modules import RecurrentActorCritic

# the symbolic view's layout: 9 cells x (object, colour, state), then the direction
CELLS, KEY, BALL, EMPTY, LEFT_OF_AGENT, AHEAD = 9, 5, 6, 1, 2, 1
SPACE = gym.spaces.MultiDiscrete([11, 6, 3] * CELLS + [4])


def batch(size: int, length: int, generator: torch.Generator) -> tuple[TensorDict, torch.Tensor]:
    """Observations ``[size, length, 28]`` and labels ``[size]`` (1: the cues match)."""
    obs = torch.zeros(size, length, 3 * CELLS + 1, dtype=torch.int64)
    obs[..., 0 : 3 * CELLS : 3] = EMPTY
    a = torch.randint(KEY, BALL + 1, (size,), generator=generator)
    b = torch.randint(KEY, BALL + 1, (size,), generator=generator)
    obs[:, 0, 3 * LEFT_OF_AGENT] = a  # the start room's object, beside the agent
    obs[:, -1, 3 * AHEAD] = b  # the junction's object, ahead
    obs[:, -1, -1] = 3  # facing another way at the junction
    return TensorDict({"observation": obs}, [size, length]), (a == b).long()


def first_solved(
    head_layers: int, forget_bias: float, encoder_skip: bool, seed: int, args: argparse.Namespace
) -> int | None:
    """The first iteration whose fresh batch is classified without error, or None."""
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    net = RecurrentActorCritic(
        SPACE,
        gym.spaces.Discrete(3),
        recurrence="lstm",
        hidden_size=args.hidden_size,
        head_layers=head_layers,
        forget_bias=forget_bias,
        encoder_skip=encoder_skip,
        shared_critic=True,
    )
    optimizer = torch.optim.Adam(net.parameters(), lr=args.learning_rate)
    for iteration in range(args.iterations):
        obs, label = batch(256, args.length, generator)
        state = tuple(torch.zeros(256, *net.state_shape) for _ in net.actor_state_keys)
        features, _ = net.actor_trunk(obs, state)
        logits = net.action_head.linear(net.policy_mlp(features[:, -1]))[:, :2]
        if bool((logits.argmax(-1) == label).all()):
            return iteration
        loss = torch.nn.functional.cross_entropy(logits, label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--head-layers", type=at_least(0), nargs="+", default=[0, 1])
    parser.add_argument("--forget-bias", type=finite_float, nargs="+", default=[0.0, 5.0])
    parser.add_argument(
        "--encoder-skip",
        type=int,
        nargs="+",
        choices=[0, 1],
        default=[0],
        help="1: the heads also read the encoder's features (RecurrentActorCritic encoder_skip)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="default 0 1 2")
    parser.add_argument("--iterations", type=at_least(1), default=None, help="default 2000")
    parser.add_argument("--length", type=at_least(1), default=9, help="steps from cue a to cue b")
    parser.add_argument("--hidden-size", type=at_least(1), default=128)
    parser.add_argument("--learning-rate", type=positive_float, default=1e-3)
    parser.add_argument("--threads", type=at_least(1), default=1)
    parser.add_argument(
        "--quick", action="store_true", help="one seed, 20 iterations, unless given"
    )
    parser.add_argument(
        "--output", type=results_name, default=None, help="JSON name under benchmarks/results/"
    )
    args = parser.parse_args()
    check_seeds(parser, "--seeds", args.seeds)
    if args.seeds is None:  # a flag given wins over --quick
        args.seeds = [0] if args.quick else [0, 1, 2]
    if args.iterations is None:
        args.iterations = 20 if args.quick else 2000
    torch.set_num_threads(args.threads)
    results = []
    for head_layers in args.head_layers:
        for forget_bias in args.forget_bias:
            for skip in args.encoder_skip:
                for seed in args.seeds:
                    start = time.perf_counter()
                    solved = first_solved(head_layers, forget_bias, bool(skip), seed, args)
                    seconds = time.perf_counter() - start
                    results.append(
                        {
                            "head_layers": head_layers,
                            "forget_bias": forget_bias,
                            "encoder_skip": bool(skip),
                            "seed": seed,
                            "solved_at": solved,
                        }
                    )
                    shown = "not within" if solved is None else f"at iteration {solved} of"
                    print(
                        f"head_layers={head_layers} forget_bias={forget_bias:g} "
                        f"encoder_skip={skip} seed={seed}: "
                        f"solved {shown} {args.iterations} ({seconds:.0f} s)",
                        flush=True,
                    )
    name = args.output or ("memory_readout_quick" if args.quick else "memory_readout")
    write_json(name, {"settings": vars(args), "results": results})


if __name__ == "__main__":
    main()
