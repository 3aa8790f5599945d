"""One update's data work on one rollout: rppo_td, the loop reference, TorchRL and a copy.

What is timed, per rollout shape (batch ``[W, T]``, see ``_common.PIPELINE_SHAPES``):

- ``rppo_td``: GAE -> EpisodeSplitter -> SequenceChunker -> one epoch of ``SequenceSampler``
  minibatches gathered lazily from the rollout (every minibatch materialised, then dropped, as
  a trainer consumes them one at a time).
- ``rppo_td reuse``: the same with ``SequenceSampler(reuse_memory=True)``: the minibatches of
  the epoch are written into two buffers taken in turn, so no fresh pages per minibatch.
  (The trainer used it once; it now samples padded sequences, the ``rppo_td padded`` path
  below.)
- ``rppo_td padded``: the README's composition: the same, but through ``SequencePadder``
  first and the sampler over its output (whose leaves, not read by anyone before the sampler,
  are gathered per minibatch straight from the rollout: the padder makes no copy).
- ``rppo_td torch ops``: ``rppo_td`` with numba's kernels off (``rppo_td._native``): GAE,
  chunking and the layout in torch operations only, as on a GPU or without numba.
- ``loop reference``: ``rppo_td.testing.reference`` (GAE, episode ids, sequences and padding by
  Python loops), then the same epoch of minibatches by indexing its padded output. CPU only; timed
  once, after the others.
- ``torchrl split``: ``torchrl.collectors.utils.split_trajectories`` alone, given the episode
  ids as ``("collector", "traj_ids")`` as a collector would (it does less: no GAE, no chunking).
- ``torchrl pipeline``: TorchRL's ``vec_generalized_advantage_estimate``, then
  ``split_trajectories``, then one epoch of minibatches of whole trajectories.
- ``copy``: one ``copy_`` of the rollout's bytes into preallocated memory, the physical limit;
  ``copy fresh``: the same bytes cloned into new memory (what any producer of new tensors pays
  for first touching its pages).

All candidates run interleaved in one process; the table gives medians and ratios. Then a
per-stage breakdown of ``rppo_td`` and its peak memory (see ``--help`` and docs/benchmarks.md).

Peak memory: each path runs once in a fresh subprocess; the kernel's resident-set high-water
mark (``VmHWM``, reset through ``/proc/self/clear_refs``) minus the resident set just before
the run is the extra memory, reported as a multiple of the rollout's own bytes. On CUDA it is
``torch.cuda.max_memory_allocated`` over ``memory_allocated`` before the run.

    python benchmarks/pipeline.py            # full shapes, about a minute or two on a CPU
    python benchmarks/pipeline.py --quick    # tiny shapes, one repeat: a smoke test
    python benchmarks/pipeline.py --device cuda
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from _common import (
    GAMMA,
    LMBDA,
    PIPELINE_SHAPES,
    QUICK_SHAPES,
    RolloutShape,
    at_least,
    format_seconds,
    load_reference,
    make_rollout,
    nbytes,
    print_table,
    results_name,
    shape_dict,
    synchronize,
    time_interleaved,
    write_json,
)
from tensordict import TensorDictBase
from torchrl.collectors.utils import split_trajectories
from torchrl.envs import Compose
from torchrl.objectives.value.functional import vec_generalized_advantage_estimate

from rppo_td import (
    GAE,
    EpisodeSplitter,
    RolloutKeys,
    SequenceChunker,
    SequenceLayout,
    SequencePadder,
    SequenceSampler,
)
from rppo_td._buffers import OutputPool
from rppo_td._native import native_kernels
from rppo_td.functional import balanced_minibatches
from rppo_td.sampling._sampler import gathered_bytes

KEYS = RolloutKeys()
STAGES = ("gae", "episodes", "chunk", "layout", "plan", "gather")


# --------------------------------------------------------------------------------------------
# The candidates. Each takes the raw rollout and does the whole update's data work.
# --------------------------------------------------------------------------------------------
class Pipeline:
    """One user's pipeline, built once and called every update (as the README builds it).

    ``padded``: the README's ``Compose(GAE, EpisodeSplitter, SequenceChunker,
    SequencePadder)`` then ``SequenceSampler`` over the padded sequences; else the same
    without the padder, the sampler gathering from the chunked rollout (lazily), with
    ``reuse_memory`` as given.
    """

    def __init__(self, shape: RolloutShape, *, padded: bool = False, reuse: bool = False):
        stages = [
            GAE(gamma=GAMMA, lmbda=LMBDA),
            EpisodeSplitter(),
            SequenceChunker(sequence_length=shape.sequence_length),
        ]
        if padded:
            stages.append(SequencePadder())
        self.transform = Compose(*stages)
        self.sampler = SequenceSampler(
            shape.num_minibatches, generator=torch.Generator().manual_seed(0), reuse_memory=reuse
        )

    def epoch(self, td: TensorDictBase) -> int:
        """One update's data work; returns the real steps seen (the epoch is whole)."""
        # the transforms add keys in place; keep the input as it was
        x = self.transform(td.clone(recurse=False))
        seen = 0
        for minibatch in self.sampler(x):
            seen += minibatch.numel()  # the minibatch is materialised; it dies at the next step
        return seen


def torch_ops_epoch(pipeline: Pipeline, td: TensorDictBase) -> int:
    """``pipeline.epoch`` with numba's kernels off: every stage in torch operations only."""
    with native_kernels(False):
        return pipeline.epoch(td)


def rppo_epoch(
    td: TensorDictBase, shape: RolloutShape, *, padded: bool = False, reuse: bool = False
) -> int:
    """One update through a pipeline built for it alone (the first call of a user's run)."""
    return Pipeline(shape, padded=padded, reuse=reuse).epoch(td)


def rppo_stages(
    td: TensorDictBase, shape: RolloutShape, device: str, pool: OutputPool
) -> dict[str, float]:
    """The same work as ``rppo_epoch`` through the public pieces, timed stage by stage.

    The gather goes into ``pool``'s memory, as the sampler's does (one pool for all runs).
    """
    times: dict[str, float] = {}

    def mark(name: str, start: float) -> float:
        synchronize(device)
        now = time.perf_counter()
        times[name] = times.get(name, 0.0) + now - start
        return now

    synchronize(device)
    start = time.perf_counter()
    x = td.clone(recurse=False)
    x = GAE(gamma=GAMMA, lmbda=LMBDA)(x)
    start = mark("gae", start)
    x = EpisodeSplitter()(x)
    start = mark("episodes", start)
    x = SequenceChunker(sequence_length=shape.sequence_length)(x)
    start = mark("chunk", start)
    layout = SequenceLayout.from_rollout(x, KEYS, "benchmark")
    start = mark("layout", start)
    groups = balanced_minibatches(
        layout.lengths(), shape.num_minibatches, generator=torch.Generator().manual_seed(0)
    )
    start = mark("plan", start)
    epoch_bytes = gathered_bytes(nbytes(x), x.numel(), layout.flat_index.numel())
    if epoch_bytes <= SequenceSampler.epoch_gather_bytes:
        # as the sampler does below its bound: the epoch at once, then a slice per minibatch
        whole = layout.gather(x, KEYS, torch.cat(groups), pool=pool)
        whole.split([len(index) for index in groups])
    else:
        for index in groups:
            layout.gather(x, KEYS, index, pool=pool)
    mark("gather", start)
    return times


def reference_epoch(td: TensorDictBase, shape: RolloutShape, reference) -> int:
    """The loop reference: every stage by Python loops, then the same epoch by indexing."""
    x = td.clone(recurse=False)
    advantage, target = reference.reference_gae(x, GAMMA, LMBDA)
    x.set("advantage", advantage.to(torch.float32))
    x.set("value_target", target.to(torch.float32))
    x.set("episode_id", reference.reference_episode_ids(x))
    sequence_id, offset = reference.reference_chunk_ids(x, shape.sequence_length)
    x.set("sequence_id", sequence_id)
    x.set("sequence_offset", offset)
    padded = reference.reference_pad(x, shape.sequence_length)
    groups = balanced_minibatches(
        padded.get("loss_mask").sum(-1),
        shape.num_minibatches,
        generator=torch.Generator().manual_seed(0),
    )
    return sum(padded[index].numel() for index in groups)


def with_trajectory_ids(td: TensorDictBase) -> TensorDictBase:
    """The rollout plus ``("collector", "traj_ids")``, as a TorchRL collector hands it over."""
    out = td.clone(recurse=False)
    out.set(("collector", "traj_ids"), EpisodeSplitter()(td.clone(recurse=False))["episode_id"])
    return out


def torchrl_split(td: TensorDictBase) -> TensorDictBase:
    """TorchRL's trajectory split, padded to the longest trajectory, with a mask."""
    return split_trajectories(td, trajectory_key=("collector", "traj_ids"))


def torchrl_epoch(td: TensorDictBase, shape: RolloutShape) -> int:
    """TorchRL's vectorised GAE, its split, then an epoch of whole-trajectory minibatches."""
    x = td.clone(recurse=False)
    advantage, target = vec_generalized_advantage_estimate(
        GAMMA,
        LMBDA,
        x.get("state_value"),
        x.get(("next", "state_value")),
        x.get(("next", "reward")),
        x.get(("next", "done")),
        x.get(("next", "terminated")),
    )
    x.set("advantage", advantage)
    x.set("value_target", target)
    trajectories = torchrl_split(x)
    count = trajectories.shape[0]
    order = torch.randperm(count, generator=torch.Generator().manual_seed(0))
    order = order.to(trajectories.device)
    return sum(trajectories[index].numel() for index in order.chunk(shape.num_minibatches))


# --------------------------------------------------------------------------------------------
# Peak memory, measured in a fresh process
# --------------------------------------------------------------------------------------------
def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def memory_child(shape: RolloutShape, mode: str, device: str) -> dict[str, float | None]:
    """Runs one path once and returns its extra bytes at peak (in this fresh process)."""
    td = make_rollout(shape, device=device)
    # warm up every path on a tiny rollout: lazy imports, allocator arenas and kernel caches
    # are not the pipeline's memory (and no path is measured colder than another)
    # (numba's kernels forced on: their import and machine code are not the pipeline's either)
    tiny = make_rollout(QUICK_SHAPES[0], device=device)
    for native in (False, True):
        with native_kernels(native):
            for padded, reuse in ((False, False), (False, True), (True, False)):
                rppo_epoch(tiny, QUICK_SHAPES[0], padded=padded, reuse=reuse)
    gc.collect()

    def run() -> None:
        rppo_epoch(td, shape, padded=mode == "padded", reuse=mode == "reuse")

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        run()
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - before
    else:
        try:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        except OSError:
            return {"extra_bytes": None, "rollout_bytes": nbytes(td)}
        before = _status_kib("VmRSS")
        run()
        extra = (_status_kib("VmHWM") - before) * 1024
    return {"extra_bytes": float(extra), "rollout_bytes": nbytes(td)}


def measure_memory(shape: RolloutShape, modes: str, device: str) -> dict[str, dict]:
    """``memory_child`` in a fresh interpreter (so earlier candidates leave nothing behind).

    ``modes`` is ``lazy``, ``reuse``, ``padded`` or several comma-separated (then they share
    the process, which ``--quick`` accepts to save an interpreter start).
    """
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--memory-child",
        shape.name,
        "--memory-mode",
        modes,
        "--device",
        device,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        print(f"memory child failed for {shape.name} ({modes}):\n{done.stderr[-2000:]}")
        failed = {"extra_bytes": None, "rollout_bytes": None, "ratio": None}
        return {mode: dict(failed) for mode in modes.split(",")}
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for result in results.values():
        extra, size = result["extra_bytes"], result["rollout_bytes"]
        result["ratio"] = None if extra is None else extra / size
    return results


# --------------------------------------------------------------------------------------------
# One shape
# --------------------------------------------------------------------------------------------
def bench_shape(
    shape: RolloutShape, *, device: str, repeats: int, memory: bool, quick: bool, reference
) -> dict[str, object]:
    td = make_rollout(shape, device=device)
    size = nbytes(td)
    source = torch.empty(size, dtype=torch.uint8, device=device).fill_(1)
    target = torch.empty_like(source).fill_(0)
    with_ids = with_trajectory_ids(td)

    # the epoch is whole: every real step once
    steps = shape.workers * shape.time_steps
    lazy, reuse, padded = (
        Pipeline(shape),
        Pipeline(shape, reuse=True),
        Pipeline(shape, padded=True),
    )
    seen = lazy.epoch(td)
    padded_steps = padded.epoch(td)
    assert reuse.epoch(td) == seen
    candidates = {
        "rppo_td": lambda: lazy.epoch(td),
        "rppo_td reuse": lambda: reuse.epoch(td),
        "rppo_td padded": lambda: padded.epoch(td),
        "rppo_td torch ops": lambda: torch_ops_epoch(lazy, td),
        "torchrl split": lambda: torchrl_split(with_ids),
        "torchrl pipeline": lambda: torchrl_epoch(with_ids, shape),
        "copy": lambda: target.copy_(source),
        "copy fresh": lambda: source.clone(),
    }
    times = time_interleaved(candidates, repeats=repeats, device=device, max_seconds=1.0)
    if reference is not None and torch.device(device).type == "cpu":
        # timed apart, after the others: seconds of Python loops, whose millions of small
        # objects would otherwise reshape the heap under the candidates interleaved with it;
        # one warm-up call first, as every candidate has
        times.update(
            time_interleaved(
                {"loop reference": lambda: reference_epoch(td, shape, reference)},
                repeats=1,
                warmup=1,
            )
        )

    pool = OutputPool()
    stage_runs = [rppo_stages(td, shape, device, pool) for _ in range(max(repeats, 1))]
    stages = {name: statistics.median(run[name] for run in stage_runs) for name in STAGES}

    median = {name: t["median"] for name, t in times.items()}
    ours = median["rppo_td"]
    ratios = {
        "rppo_td / copy": ours / median["copy"],
        "rppo_td / copy fresh": ours / median["copy fresh"],
        "rppo_td reuse / copy": median["rppo_td reuse"] / median["copy"],
        "rppo_td padded / copy": median["rppo_td padded"] / median["copy"],
        "torch ops / rppo_td": median["rppo_td torch ops"] / ours,
        "torchrl split / rppo_td": median["torchrl split"] / ours,
        "torchrl pipeline / rppo_td": median["torchrl pipeline"] / ours,
    }
    if "loop reference" in median:
        ratios["loop reference / rppo_td"] = median["loop reference"] / ours
    # the library's own work, each minibatch dropped at once (so its memory is reused)
    ratios["stage sum / copy"] = sum(stages.values()) / median["copy"]
    result: dict[str, object] = {
        "shape": shape_dict(shape),
        "rollout_bytes": size,
        "real_steps": steps,
        "padded_positions_per_epoch": padded_steps,
        "epoch_steps_check": seen == padded_steps,
        "times": times,
        "ratios": ratios,
        "stages": stages,
    }
    if memory:
        if quick:
            measured = measure_memory(shape, "lazy,reuse,padded", device)
        else:
            measured = {
                **measure_memory(shape, "lazy", device),
                **measure_memory(shape, "reuse", device),
                **measure_memory(shape, "padded", device),
            }
        result["memory"] = {
            "rppo_td": measured["lazy"],
            "rppo_td reuse": measured["reuse"],
            "rppo_td padded": measured["padded"],
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, one repeat")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--repeats", type=at_least(1), default=None, help="timed repeats (default 7)"
    )
    parser.add_argument("--threads", type=at_least(1), default=None, help="torch.set_num_threads")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory runs")
    parser.add_argument("--shape", default=None, help="only shapes whose name contains this")
    parser.add_argument(
        "--output", type=results_name, default=None, help="JSON name under benchmarks/results/"
    )
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--memory-mode", default="lazy", help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        device = torch.device(args.device)
    except RuntimeError as err:
        parser.error(f"--device {args.device!r}: {err}")
    if device.type not in ("cpu", "cuda"):
        parser.error(f"--device must be cpu or cuda (cuda:N), got {args.device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device!r}: this torch sees no CUDA device")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    shapes = QUICK_SHAPES if args.quick else PIPELINE_SHAPES
    if args.shape is not None:
        every = shapes
        shapes = tuple(s for s in shapes if args.shape in s.name)
        if not shapes and args.memory_child is None:
            names = ", ".join(repr(s.name) for s in every)
            mode = "--quick shapes" if args.quick else "shapes"
            parser.error(f"--shape {args.shape!r} matches none of the {mode}: {names}")

    if args.memory_child is not None:
        shape = next(s for s in (*PIPELINE_SHAPES, *QUICK_SHAPES) if s.name == args.memory_child)
        modes = args.memory_mode.split(",")
        print(json.dumps({m: memory_child(shape, m, args.device) for m in modes}))
        return

    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 7)
    reference = load_reference()
    if reference is None:
        print("rppo_td.testing needs hypothesis: the loop reference column is left out")
    results = []
    for shape in shapes:
        print(f"{shape.name} ...", flush=True)
        results.append(
            bench_shape(
                shape,
                device=args.device,
                repeats=repeats,
                # --quick measures memory once, on the image shape, to stay quick
                memory=not args.no_memory and (not args.quick or shape.observation == "image"),
                quick=args.quick,
                reference=reference,
            )
        )

    report(results)
    name = args.output or ("pipeline_quick" if args.quick else f"pipeline_{args.device}")
    path = write_json(name, {"device": args.device, "repeats": repeats, "results": results})
    print(f"\nwritten {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")


def report(results: list[dict]) -> None:
    """Prints the time table, the ratio table, the stage breakdown and the memory table."""
    names = [
        "rppo_td",
        "rppo_td reuse",
        "rppo_td padded",
        "rppo_td torch ops",
        "loop reference",
        "torchrl split",
        "torchrl pipeline",
        "copy",
        "copy fresh",
    ]
    print("\nMedian time of one update's data work")
    rows = []
    for r in results:
        t = r["times"]
        rows.append(
            [r["shape"]["name"], f"{r['rollout_bytes'] / 2**20:.1f} MiB"]
            + [format_seconds(t[n]["median"]) if n in t else "-" for n in names]
        )
    print_table(["shape", "rollout", *names], rows)

    print("\nRatios (same process)")
    keys = list(dict.fromkeys(k for r in results for k in r["ratios"]))
    rows = [
        [r["shape"]["name"]] + [f"{r['ratios'][k]:.2f}x" if k in r["ratios"] else "-" for k in keys]
        for r in results
    ]
    print_table(["shape", *keys], rows)

    print("\nWhere rppo_td's time goes (median per stage)")
    rows = [
        [r["shape"]["name"]]
        + [format_seconds(r["stages"][s]) for s in STAGES]
        + [format_seconds(sum(r["stages"].values()))]
        for r in results
    ]
    print_table(["shape", *STAGES, "sum"], rows)

    if any("memory" in r for r in results):
        print("\nPeak extra memory over the rollout's own bytes")
        rows = []
        for r in (r for r in results if "memory" in r):
            row = [r["shape"]["name"]]
            for path in ("rppo_td", "rppo_td reuse", "rppo_td padded"):
                m = r["memory"][path]
                row.append(
                    "-"
                    if m["ratio"] is None
                    else f"{m['extra_bytes'] / 2**20:.1f} MiB ({m['ratio']:.2f}x)"
                )
            rows.append(row)
        print_table(["shape", "rppo_td (lazy)", "rppo_td reuse", "rppo_td padded"], rows)


if __name__ == "__main__":
    main()
