#!/usr/bin/env bash
# GPU verification in one short run, for a machine with an NVIDIA GPU (a short loan is enough):
#   1. the environment: GPU, driver, CUDA torch, vllm, deepspeed (installs the GPU extras when an index is
#      reachable; otherwise uses what the machine has and says what is missing);
#   2. the GPU-marked tests (NCCL weight broadcast, vLLM on CUDA, DeepSpeed ZeRO on GPU);
#   3. a short training run on a random model with Qwen3-0.6B's shapes (no weights can be fetched offline):
#      vLLM engines on the GPU, the DeepSpeed learner in bf16, NCCL weight sync; generated tokens/s, update
#      and sync seconds;
#   4. one summary block at the end (also written to $OUT/gpu_check_summary.txt when $OUT is set).
# Usage: benchmarks/gpu_check.sh [extra key=value overrides for the training run]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-/tmp/gpu_check}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
: >"$LOG"
SUMMARY=()
note() { SUMMARY+=("$1"); echo "== $1" | tee -a "$LOG"; }

# 1. environment
if ! command -v nvidia-smi >/dev/null; then
    note "no nvidia-smi: this is not a GPU machine"; printf '%s\n' "${SUMMARY[@]}"; exit 1
fi
note "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
PY=.venv/bin/python
if ! $PY -c "import torch; assert torch.cuda.is_available()" 2>>"$LOG"; then
    if MARL_GPU=1 timeout 1200 scripts/install.sh >>"$LOG" 2>&1; then
        note "install: GPU extras installed into .venv"
    else
        note "install: scripts/install.sh failed (no package index reachable?); falling back to the system python"
        PY=python3
    fi
fi
$PY - >>"$LOG" 2>&1 <<'EOF'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
for name in ("vllm", "deepspeed", "ray", "transformers", "peft"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as e:  # noqa: BLE001 - report whatever is missing
        print(name, "MISSING", e)
EOF
note "stack: $(grep -E '^(torch|vllm|deepspeed|ray) ' "$LOG" | tr '\n' ';')"

# 2. GPU-marked tests
export MARL_CACHE="${MARL_CACHE:-$PWD/.cache/marl}"
timeout 900 $PY -m pytest -m gpu -q -p no:cacheprovider >"$OUT_DIR/gpu_tests.log" 2>&1
note "gpu tests (exit $?): $(tail -1 "$OUT_DIR/gpu_tests.log")"

# 3. a short training run, Qwen3-0.6B-shaped
RUN_DIR="$OUT_DIR/runs"
# NCCL cannot put two ranks on one device: the NCCL weight channel needs a second GPU for the engine.
NGPU=$(nvidia-smi -L | wc -l)
TRANSPORT=object_store; [ "$NGPU" -ge 2 ] && TRANSPORT=nccl
GPU_SHARE=0.5; [ "$NGPU" -ge 2 ] && GPU_SHARE=1
timeout 1200 $PY -m jobs.train --config jobs/configs/tiny.yaml \
    model.path=builtin:qwen3-0.6b-shape model.dtype=bfloat16 marl.workflow=single_agent marl.sharing=shared \
    rollout.backend=vllm rollout.engines_per_role=1 rollout.engine_num_gpus=$GPU_SHARE rollout.kv_cache_gb=0 \
    rollout.gpu_memory_utilization=0.35 rollout.prompts_per_step=16 rollout.samples_per_prompt=4 \
    rollout.sampling.max_new_tokens=256 learner.backend=deepspeed learner.ranks=1 learner.rank_num_gpus=$GPU_SHARE \
    sync.transport=$TRANSPORT steps=4 data.eval_size=0 run_name=gpu_check out_dir="$RUN_DIR" "$@" \
    >"$OUT_DIR/train.log" 2>&1
note "training run ($NGPU GPU(s), sync.transport=$TRANSPORT) exit $? (0 ok, 2 config, 3 input, 4 training failure): tail in $OUT_DIR/train.log"
$PY - "$RUN_DIR/gpu_check/metrics.jsonl" >>"$LOG" 2>&1 <<'EOF'
import json, statistics, sys
rows = [json.loads(x) for x in open(sys.argv[1]) if x.strip()]
steps = [r for r in rows if "time/step_s" in r][1:] or [r for r in rows if "time/step_s" in r]
med = lambda k: statistics.median(r.get(k, float("nan")) for r in steps)
tps = statistics.median(r["rollout/tokens"] / r["time/rollout_s"] for r in steps)
print(f"RESULT steps={len(steps)} step_s={med('time/step_s'):.2f} rollout_s={med('time/rollout_s'):.2f} "
      f"gen_tokens_per_s={tps:.0f} update_s={med('time/update_s'):.2f} sync_s={med('time/sync_s'):.3f} "
      f"sync_GB={med('sync/bytes') / 1e9:.2f}")
EOF
note "throughput: $(grep '^RESULT' "$LOG" | tail -1 || echo 'no metrics (see train.log)')"

echo; echo "================ GPU check summary ================"
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT_DIR/gpu_check_summary.txt"
