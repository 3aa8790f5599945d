"""numba's kernels on against off: one update's data work, the same pipeline, the same rollout.

``benchmarks/pipeline.py`` times the kernels' path (``rppo_td``) beside ``rppo_td torch ops``
among many candidates, interleaved, each sweeping the caches for the next; its ratio of the
two moves by 10-20% from run to run. This script asks only the one question: the README's
pipeline (lazy: the sampler on the chunked rollout; padded: through ``SequencePadder``) run
back to back with the kernels on and off (``rppo_td._native.native_kernels``), alternating
which goes first, for many rounds; it prints the medians and their ratio.

    python benchmarks/native_kernels.py            # the vector shapes, about a minute
    python benchmarks/native_kernels.py --quick    # tiny shapes, a few rounds: a smoke test
"""

from __future__ import annotations

import argparse
import statistics
import time

from _common import (
    PIPELINE_SHAPES,
    QUICK_SHAPES,
    at_least,
    make_rollout,
    print_table,
    results_name,
    write_json,
)
from pipeline import Pipeline

from rppo_td._native import _numba_installed, native_kernels


def compare(pipeline: Pipeline, td, rounds: int) -> dict[str, float]:
    """Median seconds of ``pipeline.epoch(td)`` with the kernels on and off, alternated."""
    for _ in range(3):  # warm-up: imports, numba's machine code, allocator arenas
        for enabled in (True, False):
            with native_kernels(enabled):
                pipeline.epoch(td)
    times: dict[bool, list[float]] = {True: [], False: []}
    for r in range(rounds):
        for enabled in (True, False) if r % 2 else (False, True):
            with native_kernels(enabled):
                start = time.perf_counter()
                pipeline.epoch(td)
                times[enabled].append(time.perf_counter() - start)
    on, off = statistics.median(times[True]), statistics.median(times[False])
    return {"kernels on s": on, "kernels off s": off, "off / on": off / on}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, a few rounds")
    parser.add_argument("--rounds", type=at_least(1), default=None, help="rounds (default 80)")
    parser.add_argument(
        "--output", type=results_name, default=None, help="JSON name under benchmarks/results/"
    )
    args = parser.parse_args()
    if not _numba_installed():
        parser.error(
            "numba's kernels cannot run here (numba is not installed, or RPPO_TD_NATIVE=0): "
            "'kernels on' would time the torch path twice"
        )
    shapes = (
        QUICK_SHAPES if args.quick else [s for s in PIPELINE_SHAPES if s.observation == "vector"]
    )
    rounds = args.rounds or (3 if args.quick else 80)
    results, rows = [], []
    for shape in shapes:
        td = make_rollout(shape, device="cpu")
        for padded in (False, True):
            measured = compare(Pipeline(shape, padded=padded), td, rounds)
            path = "padded" if padded else "lazy"
            results.append({"shape": shape.name, "path": path, **measured})
            rows.append(
                [
                    shape.name,
                    path,
                    f"{measured['kernels on s'] * 1e3:.2f} ms",
                    f"{measured['kernels off s'] * 1e3:.2f} ms",
                    f"{measured['off / on']:.2f}x",
                ]
            )
    print_table(["shape", "path", "kernels on", "kernels off", "off / on"], rows)
    name = args.output or ("native_kernels_quick" if args.quick else "native_kernels")
    print("written", write_json(name, {"rounds": rounds, "results": results}))


if __name__ == "__main__":
    main()
