"""One update's learning phase: the trainer's PPO epochs on one rollout, before and after.

Times ``Trainer.ppo(rollout)`` (GAE, padding, every epoch's minibatches: loss, backward,
clipping, Adam step) on the first rollout of a preset's run, and one collection step of its
``RecurrentPolicy``, with each of the learning-phase changes of 2026-12-06 on and off, in one
process:

- ``shared trunk``: with ``shared_critic``, ``RecurrentPPOLoss`` runs the shared encoder and
  core once per minibatch for both heads (``RecurrentActor.get_dist_and_value``); off, once
  per network, as TorchRL's ``ClipPPOLoss`` does;
- ``one scatter``: a MultiDiscrete observation one-hot encoded in one scatter; off, one
  ``one_hot`` call per entry, concatenated (MiniGrid's symbolic view has 28 entries).

``before`` has both off, ``after`` both on (the trainer now). ``after + fused Adam`` adds
``torch.optim.Adam(fused=True)`` in place of the trainer's ``foreach=True``: tried, and not
adopted (its gain is small, and its last-bit differences redraw every seed's run). Every
candidate starts from the same parameters and optimiser state (restored before each call),
so each runs the same arithmetic on the same data; the candidates are interleaved and each
figure is a median. The ratios ``before / candidate`` are printed and written to
``benchmarks/results/learn_phase.json`` (or ``--output``).

    python benchmarks/learn_phase.py                       # MiniGrid-MemoryS9, masked CartPole
    python benchmarks/learn_phase.py --presets poc-memory --repeats 5
    python benchmarks/learn_phase.py --presets minigrid-memory-s9 --from-run runs/s9-seed0
    python benchmarks/learn_phase.py --quick
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import tempfile
from collections.abc import Callable

import torch
from _common import (
    at_least,
    format_seconds,
    print_table,
    results_name,
    time_interleaved,
    write_json,
)
from torchrl.envs.utils import ExplorationType, set_exploration_type

from rppo_td._validation import first_line
from rppo_td.modules import _encoders
from rppo_td.train import TrainConfig, Trainer, load_agent
from rppo_td.train._checkpoint import checkpoint_file
from rppo_td.train._cli import list_presets, load_yaml

CHANGES = ("shared trunk", "one scatter")


def per_entry_one_hot(self: _encoders._OneHot, x: torch.Tensor) -> torch.Tensor:
    """The encoder's MultiDiscrete path before: one ``one_hot`` per entry, concatenated."""
    if not self.multi:
        return torch.nn.functional.one_hot(x.long(), self.nvec[0]).float()
    parts = [torch.nn.functional.one_hot(x[..., i].long(), n) for i, n in enumerate(self.nvec)]
    return torch.cat(parts, dim=-1).float()


@contextlib.contextmanager
def changes(trainer: Trainer, on: set[str], optimizers: dict[bool, torch.optim.Optimizer]):
    """The trainer with the changes in ``on`` and the others off."""
    ppo, net = trainer.ppo, trainer.agent
    saved = (ppo.loss._trunk_shared, ppo.optimizer, _encoders._OneHot.forward)
    # None: found at the next call (on); False: the loss runs the trunk once per network
    ppo.loss._trunk_shared = None if "shared trunk" in on else False
    ppo.optimizer = optimizers["fused Adam" in on]
    if "shared trunk" not in on:
        # the collection's RecurrentPolicy as before: the policy's pass, then the value's
        def two_passes(obs, state, restart=None, *, batch_shape=None, normalized=False):
            dist, final = net.policy(
                obs, state, restart, batch_shape=batch_shape, normalized=normalized
            )
            value, _ = net.value(obs, state, restart, normalized=normalized)
            return dist, value, final

        net.policy_and_value = two_passes
    if "one scatter" not in on:
        _encoders._OneHot.forward = per_entry_one_hot  # type: ignore[method-assign]
    try:
        yield
    finally:
        ppo.loss._trunk_shared, ppo.optimizer, _encoders._OneHot.forward = saved
        net.__dict__.pop("policy_and_value", None)


def bench_preset(
    preset: str,
    *,
    repeats: int,
    overrides: dict[str, object] | None = None,
    from_run: str | None = None,
) -> dict[str, object]:
    values = {**load_yaml(preset, preset=True), **(overrides or {})}
    with tempfile.TemporaryDirectory() as tmp:
        config = TrainConfig.from_dict(
            {**values, "output": f"{tmp}/run", "progress": False, "eval_episodes": 0, "threads": 1}
        )
        trainer = Trainer(config)
        try:
            if from_run is not None:
                # the rollout from a trained agent: late training's episodes, not the first ones
                trained, run_config, _ = load_agent(from_run)
                try:
                    trainer.agent.load_state_dict(trained.state_dict())
                except RuntimeError as err:
                    raise SystemExit(
                        f"learn_phase.py: error: --from-run {from_run} is a run of "
                        f"{run_config.env} whose agent does not fit preset {preset}'s "
                        f"({config.env}): give a run of that preset ({first_line(err)})"
                    ) from None
            result = _bench(trainer, preset, repeats)
            result["from_run"] = from_run
            return result
        finally:
            trainer.release()


def _bench(trainer: Trainer, preset: str, repeats: int) -> dict[str, object]:
    agent = trainer.agent
    params = [p for p in agent.parameters()]
    optimizers = {
        fused: torch.optim.Adam(
            params,
            lr=trainer.config.learning_rate,
            eps=1e-5,
            **({"fused": True} if fused else {"foreach": True}),
        )
        for fused in (False, True)
    }
    rollout = next(trainer._batches)
    start = copy.deepcopy(agent.state_dict())
    step_input = rollout[:, 0].exclude("next").clone()

    def restore() -> None:
        agent.load_state_dict(start)
        for optimizer in optimizers.values():
            optimizer.state.clear()

    def learn(on: set[str]) -> Callable[[], None]:
        def run() -> None:
            restore()
            with changes(trainer, on, optimizers):
                trainer.ppo(rollout.clone(), clip_epsilon=trainer.config.clip_epsilon)

        return run

    def collect(on: set[str]) -> Callable[[], None]:
        policy = trainer.collector.policy

        def run() -> None:
            with (
                changes(trainer, on, optimizers),
                torch.no_grad(),
                set_exploration_type(ExplorationType.RANDOM),
            ):
                policy(step_input.copy())

        return run

    candidates: dict[str, set[str]] = {
        "before": set(),
        **{f"{name} only": {name} for name in CHANGES},
        "after": set(CHANGES),
        "after + fused Adam": {*CHANGES, "fused Adam"},
    }
    # both ends compute the same loss on the first minibatch, from the same parameters (over
    # a whole update they drift apart: the gradients' last bits differ, so the steps do)
    ppo = trainer.ppo
    first = next(iter(ppo.sampler(ppo.padder(ppo.prepare(rollout.clone()).select(*ppo.keys)))))
    first_loss = {}
    for name in ("before", "after"):
        restore()
        with changes(trainer, candidates[name], optimizers):
            out = ppo.loss(first.clone())
        terms = [out[k].detach() for k in out.keys() if k.startswith("loss_")]  # noqa: SIM118
        first_loss[name] = float(sum(terms))
    learn_times = time_interleaved(
        {name: learn(on) for name, on in candidates.items()}, repeats=repeats, warmup=1
    )
    collect_times = time_interleaved(
        {name: collect(on) for name, on in (("before", set()), ("after", set(CHANGES)))},
        repeats=max(repeats * 20, 20),
    )
    restore()
    before = learn_times["before"]["median"]
    return {
        "preset": preset,
        "shared_critic": trainer.config.shared_critic,
        "steps_per_update": trainer.config.steps_per_update,
        "epochs": trainer.config.epochs,
        "num_minibatches": trainer.config.num_minibatches,
        "learn": learn_times,
        "learn_ratios": {
            name: before / times["median"]
            for name, times in learn_times.items()
            if name != "before"
        },
        "collect_step": collect_times,
        "collect_ratio": collect_times["before"]["median"] / collect_times["after"]["median"],
        "first_minibatch_loss_before": first_loss["before"],
        "first_minibatch_loss_after": first_loss["after"],
    }


def report(results: list[dict]) -> None:
    names = list(results[0]["learn"])
    print("\nOne update's learning phase (median)")
    print_table(
        ["preset", *names],
        [[r["preset"], *(format_seconds(r["learn"][n]["median"]) for n in names)] for r in results],
    )
    print("\nbefore / candidate (same process)")
    ratio_names = [n for n in names if n != "before"]
    print_table(
        ["preset", *ratio_names, "collection step"],
        [
            [
                r["preset"],
                *(f"{r['learn_ratios'][n]:.2f}x" for n in ratio_names),
                f"{r['collect_ratio']:.2f}x",
            ]
            for r in results
        ],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--presets", nargs="+", default=None, help="default minigrid-memory-s9 cartpole-novel"
    )
    parser.add_argument(
        "--repeats", type=at_least(1), default=None, help="timed calls per candidate (7)"
    )
    parser.add_argument(
        "--from-run",
        default=None,
        help="a run directory of the one preset given: its trained agent collects the rollout",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="poc-memory with a shared critic, two repeats, unless --presets/--repeats given (CI)",
    )
    parser.add_argument(
        "--output", type=results_name, default=None, help="JSON name under benchmarks/results/"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    presets = args.presets or (
        ["poc-memory"] if args.quick else ["minigrid-memory-s9", "cartpole-novel"]
    )
    repeats = args.repeats or (2 if args.quick else 7)
    overrides = {"shared_critic": True} if args.quick else None
    if args.from_run is not None and len(presets) != 1:
        parser.error(f"--from-run needs exactly one preset (its run's), got {presets}")
    known = sorted(name.replace("_", "-") for name in list_presets())
    unknown = [p for p in presets if p.replace("_", "-") not in known]
    if unknown:
        parser.error(f"--presets: unknown preset(s) {unknown}; known: {known}")
    if args.from_run is not None and not checkpoint_file(args.from_run).is_file():
        parser.error(f"--from-run: no checkpoint at {str(checkpoint_file(args.from_run))!r}")
    results = [
        bench_preset(p, repeats=repeats, overrides=overrides, from_run=args.from_run)
        for p in presets
    ]
    report(results)
    name = args.output or ("learn_phase_quick" if args.quick else "learn_phase")
    print("written", write_json(name, {"results": results}))


if __name__ == "__main__":
    main()
