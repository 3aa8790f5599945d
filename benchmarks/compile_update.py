"""Does ``torch.compile`` speed up the update? One minibatch of the default run, eager vs compiled.

Times ``RecurrentPPOLoss`` forward + backward on one ``[B, Lp]`` minibatch of the default
trainer's first update (median of 30, two alternating blocks per candidate), after one
compilation. Measured 2026-12-01 on the 2-core CPU machine (a test suite running beside it):
compilation 45.8 s, eager 12.0 / 11.4 ms, compiled 16.1 / 16.6 ms: slower (graph breaks at the
tensordict plumbing and at the module's data-dependent check for restarts inside a sequence),
so the trainer has no ``torch.compile`` option. On a GPU the answer may differ: rerun there.

    python benchmarks/compile_update.py
"""

from __future__ import annotations

import statistics
import tempfile
import time

import torch
from _common import first_minibatch

from rppo_td.train import TrainConfig, Trainer


def main() -> None:
    """Prints the compile time and the eager and compiled medians, two blocks each."""
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(TrainConfig(output=f"{tmp}/run", progress=False, eval_episodes=0))
        ppo = trainer.ppo
        minibatch = first_minibatch(trainer)

        def step(loss_fn) -> None:
            out = loss_fn(minibatch)
            loss = out["loss_objective"] + out["loss_critic"] + out["loss_entropy"]
            trainer.optimizer.zero_grad()
            loss.backward()

        def median_ms(loss_fn, n: int = 30) -> float:
            for _ in range(3):
                step(loss_fn)
            times = []
            for _ in range(n):
                start = time.perf_counter()
                step(loss_fn)
                times.append(time.perf_counter() - start)
            return statistics.median(times) * 1000

        compiled = torch.compile(ppo.loss, dynamic=False)
        start = time.perf_counter()
        step(compiled)
        print(f"compilation: {time.perf_counter() - start:.1f} s")
        for _ in range(2):
            print(f"eager {median_ms(ppo.loss):.2f} ms, compiled {median_ms(compiled):.2f} ms")
        trainer.release()


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    ).parse_args()  # --help, and no option taken silently
    main()
