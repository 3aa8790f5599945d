#!/usr/bin/env bash
# The GPU check of issue 10, for a machine with a CUDA device (about 4 minutes on one GPU):
#   1. the CUDA tests (marked gpu; skipped on machines without a GPU),
#   2. the pipeline benchmark on the device (writes benchmarks/results/pipeline_cuda.json),
#   3. the default training run on the device and on the CPU, same seed, for the wall-clock.
# Figures go to $OUT (or benchmarks/results/gpu/) and are printed; paste them into
# docs/benchmarks.md. Run from anywhere: bash benchmarks/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/results/gpu}"
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))" || exit 1

echo "== CUDA tests"
timeout 300 python -m pytest -q -m gpu -p no:cacheprovider 2>&1 | tail -5 | tee "$out/gpu_tests.txt"

echo "== pipeline benchmark on cuda"
(cd benchmarks && timeout 300 python pipeline.py --device cuda --no-memory --repeats 5 --output pipeline_cuda) 2>&1 \
  | tee "$out/pipeline_cuda.txt" | tail -25

echo "== default run (100k steps): cuda, then cpu"
for device in cuda cpu; do
  rm -rf "$out/run-$device"
  timeout 300 python -m rppo_td.train --device "$device" --output "$out/run-$device" --no-progress \
    > "$out/run-$device.txt" 2>&1
  python - "$out/run-$device/summary.json" "$device" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]}: eval {s['eval_return_mean']:.1f}, training {s['wall_time_s']:.1f} s, {s['fps']:.0f} steps/s")
PY
done
