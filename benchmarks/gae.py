"""GAE: rppo_td against TorchRL's loop and vectorised paths and the loop reference.

Every candidate gets the same ``[W, T, 1]`` float32 rewards and values and ``[W, T, 1]`` bool
``terminated`` / ``done`` (random episode ends from ``_common.episode_flags``: terminations,
time-limit truncations, and the rollout's own cut at ``T - 1``), with ``gamma = 0.99`` and
``lmbda = 0.95``. The semantics are the same for all four: ``done`` stops the sum, and only
``terminated`` drops the bootstrap from the next state's value, so a truncated step and the last
step bootstrap.

- ``rppo_td``: ``rppo_td.functional.generalized_advantage_estimate`` (entry checks included).
- ``torchrl loop``: ``torchrl.objectives.value.functional.generalized_advantage_estimate``.
- ``torchrl vec``: ``vec_generalized_advantage_estimate`` (its fast path for scalar gamma and
  lambda).
- ``loop reference``: ``rppo_td.testing.reference``'s ``reference_gae``, one number at a time,
  float64.

The three vectorised candidates are timed interleaved, then the reference once.
Exactness: the largest absolute difference of each candidate's advantage from the reference;
``exact`` in the JSON says whether rppo_td's is within 1e-5 (TorchRL's are reported beside).
Times are medians of interleaved repeats in one process.

    python benchmarks/gae.py
    python benchmarks/gae.py --quick
"""

from __future__ import annotations

import argparse

import torch
from _common import (
    GAMMA,
    LMBDA,
    at_least,
    episode_flags,
    format_seconds,
    load_reference,
    print_table,
    results_name,
    time_interleaved,
    write_json,
)
from tensordict import TensorDict
from torchrl.objectives.value.functional import (
    generalized_advantage_estimate as torchrl_loop,
)
from torchrl.objectives.value.functional import (
    vec_generalized_advantage_estimate as torchrl_vec,
)

from rppo_td.functional import generalized_advantage_estimate

SHAPES = ((32, 512), (256, 512), (1024, 128), (16, 4096))
QUICK_SHAPES = ((4, 32), (2, 64))
TOLERANCE = 1e-5


def make_inputs(workers: int, steps: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Rewards, values and flags ``[W, T, 1]``."""
    g = torch.Generator().manual_seed(seed)
    terminated, truncated = episode_flags(workers, steps, generator=g)
    return {
        "reward": torch.randn(workers, steps, 1, generator=g),
        "state_value": torch.randn(workers, steps, 1, generator=g),
        "next_state_value": torch.randn(workers, steps, 1, generator=g),
        "terminated": terminated.unsqueeze(-1),
        "done": (terminated | truncated).unsqueeze(-1),
    }


def as_rollout(x: dict[str, torch.Tensor]) -> TensorDict:
    """The same inputs under TorchRL's keys, for the reference."""
    workers, steps = x["reward"].shape[:2]
    return TensorDict(
        {
            "state_value": x["state_value"],
            "next": {
                "reward": x["reward"],
                "state_value": x["next_state_value"],
                "terminated": x["terminated"],
                "done": x["done"],
            },
        },
        batch_size=[workers, steps],
    )


def candidates(x: dict[str, torch.Tensor], reference) -> dict:
    r, v, nv, term, done = (
        x["reward"],
        x["state_value"],
        x["next_state_value"],
        x["terminated"],
        x["done"],
    )
    out = {
        "rppo_td": lambda: generalized_advantage_estimate(
            r, v, nv, term, done, gamma=GAMMA, lmbda=LMBDA
        ),
        "torchrl loop": lambda: torchrl_loop(GAMMA, LMBDA, v, nv, r, done, term),
        "torchrl vec": lambda: torchrl_vec(GAMMA, LMBDA, v, nv, r, done, term),
    }
    if reference is not None:
        rollout = as_rollout(x)
        out["loop reference"] = lambda: reference.reference_gae(rollout, GAMMA, LMBDA)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, one repeat")
    parser.add_argument(
        "--repeats", type=at_least(1), default=None, help="timed repeats (default 15)"
    )
    parser.add_argument("--threads", type=at_least(1), default=None, help="torch.set_num_threads")
    parser.add_argument(
        "--output", type=results_name, default=None, help="JSON name under benchmarks/results/"
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 15)
    reference = load_reference()
    if reference is None:
        print(
            "rppo_td.testing needs hypothesis (the test extra): exactness is checked against "
            "TorchRL's loop"
        )

    results = []
    for workers, steps in QUICK_SHAPES if args.quick else SHAPES:
        print(f"{workers}x{steps} ...", flush=True)
        x = make_inputs(workers, steps)
        fns = candidates(x, reference)
        # the vectorised candidates first, interleaved; then the slow Python loop apart, one
        # warm-up call and one timed (its millions of small objects would otherwise reshape
        # the heap under the others)
        fast = {name: fn for name, fn in fns.items() if name != "loop reference"}
        times = time_interleaved(fast, repeats=repeats)
        if "loop reference" in fns:
            times.update(
                time_interleaved({"loop reference": fns["loop reference"]}, repeats=1, warmup=1)
            )
        truth_name = "loop reference" if reference is not None else "torchrl loop"
        truth = fns[truth_name]()[0].to(torch.float64)
        error = {
            name: float((fn()[0].to(torch.float64) - truth).abs().max()) for name, fn in fns.items()
        }
        fastest_torchrl = min(times["torchrl loop"]["median"], times["torchrl vec"]["median"])
        results.append(
            {
                "workers": workers,
                "time_steps": steps,
                "times": times,
                "max_abs_error": error,
                "exact": error["rppo_td"] <= TOLERANCE,
                "fastest torchrl / rppo_td": fastest_torchrl / times["rppo_td"]["median"],
            }
        )

    names = ["rppo_td", "torchrl loop", "torchrl vec", "loop reference"]
    print("\nMedian time of one GAE over [W, T, 1]")
    rows = []
    for r in results:
        rows.append(
            [f"{r['workers']}x{r['time_steps']}"]
            + [format_seconds(r["times"][n]["median"]) if n in r["times"] else "-" for n in names]
            + [f"{r['fastest torchrl / rppo_td']:.2f}x"]
            + [f"{r['max_abs_error'][n]:.1e}" for n in ("rppo_td", "torchrl loop", "torchrl vec")]
        )
    print_table(
        [
            "W x T",
            *names,
            "fastest torchrl / rppo_td",
            "rppo_td max |error|",
            "torchrl loop max |error|",
            "torchrl vec max |error|",
        ],
        rows,
    )
    name = args.output or ("gae_quick" if args.quick else "gae")
    path = write_json(
        name,
        {
            "gamma": GAMMA,
            "lmbda": LMBDA,
            "tolerance": TOLERANCE,
            "repeats": repeats,
            "results": results,
        },
    )
    print(f"\nwritten {path}")


if __name__ == "__main__":
    main()
