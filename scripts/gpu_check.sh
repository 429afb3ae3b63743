#!/usr/bin/env bash
# The GPU check of both runners (an H200 with torch, Triton, transformers; no pydantic needed):
#   1. every kernel test on CUDA (compiled kernels against their torch references),
#   2. the gpu-marked tests of runner_v1 and runner_v2 (tests/parity, tests/runner_v1, tests/runner_v2),
#   3. the throughput benchmark (docs/architecture.md §6 workload: runner_v1, runner_v2 and HF
#      generate),
#   4. (part `families`) the per-family benchmark (benchmarks/families.py: OPT, the MoE families
#      and DeepSeek-V2 at full layer count, V1 and V2) and the fused MoE kernel benchmark,
#   5. (part `spec`) the speculative decoding benchmark (benchmarks/spec_decode.py: runner_v2
#      with and without speculation, concurrency 1 and 32).
# Logs go under $OUT (default /tmp/gpu-check): kernels.log, gpu_tests.log, throughput.log and
# throughput.json (the benchmark's last line); families.log/.json, fused_moe.log/.json,
# spec_decode.log/.json.
# Exit status: non-zero if any part failed.
#   6. (part `serving`) the serving benchmark (benchmarks/serving.py: `turnout engine serve` on
#      random Qwen3-0.6B weights, V2 and V1, concurrency 1, 64 and 256 from 4 client processes,
#      and offline LLM.generate on the same prompts; then V2 with its engine core in a thread) and the gpu tests of tests/serving. Needs the service's libraries
#      (fastapi, uvicorn, pydantic...): carried as wheels where the machine lacks them.
# Usage (repository root): bash scripts/gpu_check.sh [all|tests|tests-parity|tests-rest|bench|families|spec|serving]
# `tests` is `tests-parity` (the gpu tests of tests/runner_v2 and tests/parity: about 9 minutes on
# a fresh H200, Triton compiling as it goes) and `tests-rest` (tests/kernels compiled, the gpu
# tests of tests/runner_v1 and tests/engine); the benchmark takes 3-4 minutes. Where one command
# is limited to 10 minutes, run tests-parity, tests-rest and bench as three commands.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# turnout imports as turnout.* from src/turnout/ (links to the package folders; no install on
# the GPU machine), and the repository root stays off sys.path (README, "Layout").
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONSAFEPATH=1
PY=${PYTHON:-python3}
PART=${1:-all}
status=0
start=$SECONDS

"$PY" -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__,
  "transformers", transformers.__version__, "gpu", torch.cuda.get_device_name())' 2>&1 | tee "$OUT/versions.log"

if [ "$PART" = all ] || [ "$PART" = tests ] || [ "$PART" = tests-rest ]; then
  # The sm_90 compile checks need no GPU (they run in CI); here the kernels run compiled.
  "$PY" -m pytest -p no:cacheprovider -q -rfEs --durations=10 tests/kernels -k "not compile" 2>&1 \
    | tee "$OUT/kernels.log" || status=1
  "$PY" -m pytest -p no:cacheprovider -q -rfEs --durations=10 -m gpu tests/runner_v1 tests/engine \
    --ignore=tests/engine/test_engine_cli.py 2>&1 \
    | tee "$OUT/gpu_tests_rest.log" || status=1
  echo "kernel, runner_v1 and engine tests done after $((SECONDS - start)) s" | tee -a "$OUT/gpu_tests_rest.log"
fi

if [ "$PART" = all ] || [ "$PART" = tests ] || [ "$PART" = tests-parity ]; then
  "$PY" -m pytest -p no:cacheprovider -q -rfEs --durations=10 -m gpu tests/runner_v2 tests/parity 2>&1 \
    | tee "$OUT/gpu_tests.log" || status=1
  echo "runner_v2 and parity tests done after $((SECONDS - start)) s" | tee -a "$OUT/gpu_tests.log"
fi

if [ "$PART" = all ] || [ "$PART" = bench ]; then
  "$PY" benchmarks/throughput.py 2>&1 | tee "$OUT/throughput.log" || status=1
  tail -n 1 "$OUT/throughput.log" > "$OUT/throughput.json"
  echo "benchmark done after $((SECONDS - start)) s"
fi

if [ "$PART" = serving ]; then
  "$PY" -c "import json, torch; from turnout.engine.model import write_random_weights; \
write_random_weights(json.load(open('policies/reference/model_configs/qwen3-0.6b.json'))['config'], \
'/tmp/qwen3-0.6b', dtype=torch.bfloat16)" || status=1
  for runner in v2 v1; do
    "$PY" benchmarks/serving.py --model /tmp/qwen3-0.6b --runner "$runner" --num-prompts 1024 \
      --input-len 512 --output-len 128 --max-concurrency 1,64,256 --max-num-seqs 256 \
      --max-model-len 1024 --client-procs 4 --offline --log "$OUT/serving-server-$runner.log" 2>&1 \
      | tee "$OUT/serving-$runner.log" || status=1
    tail -n 1 "$OUT/serving-$runner.log" > "$OUT/serving-$runner.json"
  done
  # The same V2 server with its engine core in a thread of the server's process, side by side.
  TURNOUT_ENABLE_MULTIPROCESSING=0 "$PY" benchmarks/serving.py --model /tmp/qwen3-0.6b --runner v2 \
    --num-prompts 1024 --input-len 512 --output-len 128 --max-concurrency 64,256 \
    --max-num-seqs 256 --max-model-len 1024 --client-procs 4 \
    --log "$OUT/serving-server-v2-thread.log" 2>&1 | tee "$OUT/serving-v2-thread.log" || status=1
  tail -n 1 "$OUT/serving-v2-thread.log" > "$OUT/serving-v2-thread.json"
  "$PY" -m pytest -p no:cacheprovider -q -rfEs tests/serving/test_serving_gpu.py 2>&1 \
    | tee "$OUT/serving_tests.log" || status=1
  echo "serving benchmark done after $((SECONDS - start)) s"
fi

if [ "$PART" = all ] || [ "$PART" = families ]; then
  "$PY" benchmarks/families.py 2>&1 | tee "$OUT/families.log" || status=1
  tail -n 1 "$OUT/families.log" > "$OUT/families.json"
  "$PY" benchmarks/fused_moe.py 2>&1 | tee "$OUT/fused_moe.log" || status=1
  tail -n 1 "$OUT/fused_moe.log" > "$OUT/fused_moe.json"
  echo "family benchmarks done after $((SECONDS - start)) s"
fi

if [ "$PART" = all ] || [ "$PART" = spec ]; then
  "$PY" benchmarks/spec_decode.py 2>&1 | tee "$OUT/spec_decode.log" || status=1
  tail -n 1 "$OUT/spec_decode.log" > "$OUT/spec_decode.json"
  echo "speculative decoding benchmark done after $((SECONDS - start)) s"
fi

exit $status
