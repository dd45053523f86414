#!/usr/bin/env bash
# The GPU check: benchmarks/gpu_questions.py, one question per step, each under its own timeout, one JSON line each
# in $OUT/gpu_questions.jsonl (a step that fails or hangs still leaves its line). For one H100 or H200 with CUDA
# torch and DeepSpeed; no Ray, no vLLM. About 6 minutes; the timeouts add up to 12.
#   benchmarks/gpu_check.sh                 on the GPU
#   benchmarks/gpu_check.sh --cpu-dry-run   the same code paths on CPU, tiny shapes
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-/tmp/gpu_check}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT_DIR"
JSONL="$OUT_DIR/gpu_questions.jsonl"
: >"$JSONL"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | tee "$OUT_DIR/gpu.txt"
for spec in bf16:200 export:150 c10d:100 receive:60 ipc:60 offload:130; do
    step=${spec%%:*} limit=${spec##*:}
    echo "== $step (limit ${limit} s)" >&2
    timeout "$limit" "$PY" -m benchmarks.gpu_questions "$step" "$@" >>"$JSONL" 2>>"$OUT_DIR/gpu_questions.log"
    rc=$?
    [ "$rc" -eq 124 ] && echo "{\"step\": \"$step\", \"error\": \"timed out after ${limit} s\"}" >>"$JSONL"
    tail -n 1 "$JSONL" >&2
done
