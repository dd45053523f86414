#!/usr/bin/env bash
# GPU verification in one short run, for a machine with an NVIDIA GPU (a short loan is enough):
#   1. the environment: GPU, driver, CUDA torch, vllm, deepspeed, ray (uses a python that already has CUDA torch;
#      installs the GPU extras into .venv only when none has; says what is missing);
#   2. the GPU-marked tests (NCCL weight broadcast, vLLM on CUDA) when Ray and vLLM are there, and always the
#      in-process DeepSpeed learner tests, which then run DeepSpeed on the GPU against the torch learner on CPU
#      (with Ray, also colocated LoRA policies on DeepSpeed against separate learners);
#   3. a short training run on a random model with Qwen3-0.6B's shapes (no weights can be fetched offline):
#      vLLM engines on the GPU, the DeepSpeed learner in bf16, NCCL weight sync; generated tokens/s, update
#      and sync seconds (needs Ray and vLLM);
#   4. the learner update benchmark on the GPU (benchmarks/update.py: plain loop vs DeepSpeed ZeRO-2/3, bf16,
#      Qwen3-0.6B-shaped, full fine-tuning) against the FLOP bound of the measured bf16 matmul rate;
#   5. one learner step at the paper's math shape (benchmarks/paper_step.py: a random Qwen3-4B-shaped model built
#      from its config, vocabulary 151,936, LoRA r64, bf16 ZeRO-2, chunked LM head, 40,960 tokens in one
#      micro-batch, checkpointing on; 8,192 tokens with it off): peak GPU memory against the planner's estimate;
#   6. one summary block at the end (also written to $OUT/gpu_check_summary.txt when $OUT is set).
# Usage: benchmarks/gpu_check.sh [extra key=value overrides for the training run]
# A machine without a package index: carry the missing pure-python packages as wheels, install them with
# `pip install --target DIR` and put DIR and the checkout on PYTHONPATH before calling this script.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-/tmp/gpu_check}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
: >"$LOG"
SUMMARY=()
note() { SUMMARY+=("$1"); echo "== $1" | tee -a "$LOG"; }
has() { $PY -c "import $1" 2>/dev/null; }

# 1. environment
if ! command -v nvidia-smi >/dev/null; then
    note "no nvidia-smi: this is not a GPU machine"; printf '%s\n' "${SUMMARY[@]}"; exit 1
fi
note "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
cuda_torch() { "$1" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; }
PY=""
for candidate in .venv/bin/python python3; do
    if command -v "$candidate" >/dev/null && cuda_torch "$candidate"; then PY=$candidate; break; fi
done
if [ -z "$PY" ]; then
    if MARL_GPU=1 timeout 1200 scripts/install.sh >>"$LOG" 2>&1; then
        note "install: GPU extras installed into .venv"; PY=.venv/bin/python
    else
        note "install: no python with CUDA torch and scripts/install.sh failed (no package index?)"; PY=python3
    fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
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

# 2. tests
export MARL_CACHE="${MARL_CACHE:-$PWD/.cache/marl}"
FULL_STACK=0; has ray && has vllm && FULL_STACK=1
if [ "$FULL_STACK" = 1 ]; then
    timeout 900 $PY -m pytest -m gpu -q -p no:cacheprovider >"$OUT_DIR/gpu_tests.log" 2>&1
    note "gpu tests (exit $?): $(tail -1 "$OUT_DIR/gpu_tests.log")"
else
    note "gpu tests: not run (they need Ray and vLLM, which this python lacks)"
fi
timeout 600 $PY -m pytest tests/learners/test_deepspeed.py -q -p no:cacheprovider -m "not slow" \
    >"$OUT_DIR/deepspeed_tests.log" 2>&1
note "deepspeed learner on the GPU vs torch learner on CPU (exit $?): $(tail -1 "$OUT_DIR/deepspeed_tests.log")"
# Colocated LoRA policies on DeepSpeed ZeRO-2 (one engine per policy over one base) against separate learners,
# both on the GPU; its learner groups import Ray (cluster/group.py).
if has ray; then
    timeout 600 $PY -m pytest tests/learners/test_colocated.py -q -p no:cacheprovider >"$OUT_DIR/colocated_tests.log" 2>&1
    note "colocated LoRA on DeepSpeed vs separate learners (exit $?): $(tail -1 "$OUT_DIR/colocated_tests.log")"
else
    note "colocated LoRA tests: not run (its learner groups need Ray, which this python lacks)"
fi

# 3. a short training run, Qwen3-0.6B-shaped
if [ "$FULL_STACK" = 1 ]; then
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
else
    note "training run: not run (needs Ray and vLLM)"
fi

# 4. the learner update against the FLOP bound: full fine-tuning (ZeRO-2 and 3), then LoRA r64 (ZeRO-2)
for mode in full lora; do
    flags="--full --stages 2,3"; [ "$mode" = lora ] && flags="--stages 2"
    timeout 900 $PY -m benchmarks.update --model builtin:qwen3-0.6b-shape --dtype bfloat16 --rows 64 --seq 512 \
        --prompt 128 --micro 16 --warmup 1 --steps 3 $flags >"$OUT_DIR/update_$mode.log" 2>&1
    note "update benchmark, $mode (exit $?): $(grep -E '^(FLOP bound|summary)' "$OUT_DIR/update_$mode.log" | tr '\n' ' ')"
    sed -n '/^variant/,/^summary/p' "$OUT_DIR/update_$mode.log" >>"$LOG"
done

# 5. the paper's learner step against the planner (needs torch and deepspeed only)
# Without checkpointing 40,960 tokens would need ~190 GB of activations (the plan says so): 8,192 tokens instead.
for ckpt in true false; do
    tokens=40960; [ "$ckpt" = false ] && tokens=8192
    timeout 900 $PY -m benchmarks.paper_step --checkpointing $ckpt --tokens $tokens \
        >"$OUT_DIR/paper_step_$ckpt.log" 2>&1
    note "paper-shape learner step, checkpointing $ckpt (exit $?): $(grep '^PAPER_STEP' "$OUT_DIR/paper_step_$ckpt.log" || tail -1 "$OUT_DIR/paper_step_$ckpt.log")"
done

echo; echo "================ GPU check summary ================"
printf '%s\n' "${SUMMARY[@]}" | tee "$OUT_DIR/gpu_check_summary.txt"
