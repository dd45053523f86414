#!/usr/bin/env bash
# GPU verification in one short run, for a machine with an NVIDIA GPU (a short loan is enough), steps in order of
# value, each under its own timeout and all within GPU_CHECK_BUDGET_S seconds (default 480; a step that would
# start with too little time left is skipped and says so):
#   1. the environment: GPU, driver, CUDA torch, vllm, deepspeed, ray (uses a python that already has CUDA torch;
#      installs the GPU extras into .venv only when none has; says what is missing);
#   2. the learner at the published single-GPU baselines (benchmarks/published_steps.py, jobs/plan/published.py:
#      Qwen3-0.6B full and LoRA r16 at 65,536 tokens per micro-batch, Qwen3-4B LoRA r16 at 65,536 and 16,384;
#      random Qwen3-shaped weights, bf16 DeepSpeed ZeRO-2, checkpointing on, two micro-batches per step): measured
#      peak memory (allocated and reserved), step seconds, tok/s and MFU beside the published figures and the
#      planner's estimate; one JSON line each in $OUT/published_steps.jsonl;
#   3. one learner step at the paper's math shape (benchmarks/paper_step.py: a random Qwen3-4B-shaped model built
#      from its config, vocabulary 151,936, LoRA r64, bf16 ZeRO-2, chunked LM head, 40,960 tokens in one
#      micro-batch, checkpointing on; 8,192 tokens with it off, in step 4): peak GPU memory against the planner;
#   4. what time remains: the GPU-marked tests (NCCL weight broadcast, vLLM on CUDA) when Ray and vLLM are there,
#      the in-process DeepSpeed learner tests (DeepSpeed on the GPU against the torch learner on CPU; with Ray,
#      also colocated LoRA policies), a short training run on a random Qwen3-0.6B-shaped model (vLLM engines, the
#      DeepSpeed learner in bf16, NCCL weight sync; needs Ray and vLLM), and the learner update benchmark
#      (benchmarks/update.py: plain loop vs DeepSpeed ZeRO-2/3) against the FLOP bound of the measured matmul rate;
#   5. one summary block ($OUT/gpu_check_summary.txt, rewritten after every step so a cut-short run keeps it).
# Everything comes back in three files under $OUT: gpu_check.log (every step's output), gpu_check_summary.txt
# and published_steps.jsonl.
# Usage: benchmarks/gpu_check.sh [extra key=value overrides for the training run]
# A machine without a package index: carry the missing pure-python packages as wheels, install them with
# `pip install --target DIR` and put DIR and the checkout on PYTHONPATH before calling this script.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-/tmp/gpu_check}"
BUDGET_S="${GPU_CHECK_BUDGET_S:-480}"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check.log"
STEPS_DIR="$(mktemp -d)"  # each step's own log (appended to $LOG) and the training run: three files go back
: >"$LOG"
: >"$OUT_DIR/published_steps.jsonl"
SUMMARY=()
note() {
    SUMMARY+=("[${SECONDS}s] $1"); echo "== [${SECONDS}s] $1" | tee -a "$LOG"
    printf '%s\n' "${SUMMARY[@]}" >"$OUT_DIR/gpu_check_summary.txt"
}
has() { $PY -c "import $1" 2>/dev/null; }
# The seconds a step may take: its own limit, or what is left of the budget when less.
cap() { local left=$((BUDGET_S - SECONDS)); [ "$left" -lt 1 ] && left=1; if [ "$left" -lt "$1" ]; then echo "$left"; else echo "$1"; fi; }
# Whether at least $1 seconds of the budget are left; else the summary says the step $2 was skipped.
enough() {
    [ $((BUDGET_S - SECONDS)) -ge "$1" ] && return 0
    note "skipped, budget spent (${SECONDS} of ${BUDGET_S} s): $2"; return 1
}
# Run a command under `cap $1`, its output in $STEPS_DIR/$2.log and appended to $LOG; returns its exit status.
step() {
    local limit=$1 name=$2 rc
    shift 2
    echo "---- $name (limit $(cap "$limit") s) ----" >>"$LOG"
    timeout "$(cap "$limit")" "$@" >"$STEPS_DIR/$name.log" 2>&1
    rc=$?
    cat "$STEPS_DIR/$name.log" >>"$LOG"
    return $rc
}

# 1. environment
if ! command -v nvidia-smi >/dev/null; then
    note "no nvidia-smi: this is not a GPU machine"; exit 1
fi
note "gpu: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | head -1)"
cuda_torch() { "$1" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; }
PY=""
for candidate in .venv/bin/python python3; do
    if command -v "$candidate" >/dev/null && cuda_torch "$candidate"; then PY=$candidate; break; fi
done
if [ -z "$PY" ]; then
    if MARL_GPU=1 timeout "$(cap 1200)" scripts/install.sh >>"$LOG" 2>&1; then
        note "install: GPU extras installed into .venv"; PY=.venv/bin/python
    else
        note "install: no python with CUDA torch and scripts/install.sh failed (no package index?)"; PY=python3
    fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export MARL_CACHE="${MARL_CACHE:-$PWD/.cache/marl}"
$PY - >>"$LOG" 2>&1 <<'EOF'
import importlib, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
for name in ("vllm", "deepspeed", "ray", "transformers", "peft", "omegaconf"):
    try:
        print(name, importlib.import_module(name).__version__)
    except Exception as e:  # noqa: BLE001 - report whatever is missing
        print(name, "MISSING", e)
EOF
note "stack: $(grep -E '^(torch|vllm|deepspeed|ray|transformers|omegaconf) ' "$LOG" | tr '\n' ';')"

# 2. the published single-GPU baselines: their random models built first (saved under $MARL_CACHE, 4B ~8 GB), so
# each baseline's limit is its own steps'; then the baselines, most telling first (jobs/plan/published.py PUBLISHED: 0 = 0.6B full,
# 3 = 4B LoRA 65,536, 2 = 4B LoRA 16,384, 1 = 0.6B LoRA); one process each, so each peak is its own.
if enough 60 "building the random models"; then
    step 240 build_models $PY -m benchmarks.published_steps --build --config 0 --config 3
    note "random Qwen3-0.6B and 4B models (exit $?): $(grep '^BUILT' "$STEPS_DIR/build_models.log" | tr '\n' ' ')"
fi
for index in 0 3 2 1; do
    enough 60 "published baseline $index" || continue
    step 200 "published_$index" $PY -m benchmarks.published_steps --config "$index" --steps 1
    rc=$?
    grep '^PUBLISHED_STEP ' "$STEPS_DIR/published_$index.log" | sed 's/^PUBLISHED_STEP //' \
        >>"$OUT_DIR/published_steps.jsonl"
    line=$(grep '^SUMMARY ' "$STEPS_DIR/published_$index.log" | sed 's/^SUMMARY //')
    note "published baseline $index (exit $rc): ${line:-$(tail -1 "$STEPS_DIR/published_$index.log")}"
done
note "8-GPU baselines (4B LoRA r16 at 65,536; 4B full under FSDP at 16,384 and 65,536): not run on one GPU"

# 3. the paper's learner step against the planner (torch and deepspeed only), on the 4B folder step 2 built
# (max_positions only sizes the config: the same cached model serves).
PAPER_MODEL="builtin:qwen3-4b-shape?vocab=151936&max_positions=65536"
paper_step() {
    step "$2" "paper_step_$1" $PY -m benchmarks.paper_step --model "$PAPER_MODEL" --checkpointing "$1" --tokens "$3"
    note "paper-shape learner step, checkpointing $1, $3 tokens (exit $?): $(grep '^PAPER_STEP' \
        "$STEPS_DIR/paper_step_$1.log" || tail -1 "$STEPS_DIR/paper_step_$1.log")"
}
enough 60 "paper-shape learner step, checkpointing true" && paper_step true 180 40960

# 4. what time remains
train_run() {  # a short training run, Qwen3-0.6B-shaped: vLLM engine, DeepSpeed learner, weight sync
    local run_dir="$STEPS_DIR/runs" ngpu transport share
    # NCCL cannot put two ranks on one device: the NCCL weight channel needs a second GPU for the engine.
    ngpu=$(nvidia-smi -L | wc -l)
    transport=object_store; [ "$ngpu" -ge 2 ] && transport=nccl
    share=0.5; [ "$ngpu" -ge 2 ] && share=1
    step 1200 train $PY -m jobs.train --config jobs/configs/tiny.yaml \
        model.path=builtin:qwen3-0.6b-shape model.dtype=bfloat16 marl.workflow=single_agent marl.sharing=shared \
        rollout.backend=vllm rollout.engines_per_role=1 rollout.engine_num_gpus=$share rollout.vllm.kv_cache_gb=0 \
        rollout.vllm.gpu_memory_utilization=0.35 rollout.prompts_per_step=16 rollout.samples_per_prompt=4 \
        rollout.sampling.max_new_tokens=256 learner.backend=deepspeed learner.ranks=1 \
        learner.rank_num_gpus=$share sync.transport=$transport steps=4 data.eval_size=0 run_name=gpu_check \
        out_dir="$run_dir" "$@"
    note "training run ($ngpu GPU(s), sync.transport=$transport) exit $? (0 ok, 2 config, 3 input, 4 training failure)"
    $PY - "$run_dir/gpu_check/metrics.jsonl" >>"$LOG" 2>&1 <<'EOF'
import json, statistics, sys
rows = [json.loads(x) for x in open(sys.argv[1]) if x.strip()]
steps = [r for r in rows if "time/step_s" in r][1:] or [r for r in rows if "time/step_s" in r]
med = lambda k: statistics.median(r.get(k, float("nan")) for r in steps)
tps = statistics.median(r["rollout/tokens"] / r["time/rollout_s"] for r in steps)
print(f"RESULT steps={len(steps)} step_s={med('time/step_s'):.2f} rollout_s={med('time/rollout_s'):.2f} "
      f"gen_tokens_per_s={tps:.0f} update_s={med('time/update_s'):.2f} sync_s={med('time/sync_s'):.3f} "
      f"sync_GB={med('sync/bytes') / 1e9:.2f}")
EOF
    note "throughput: $(grep '^RESULT' "$LOG" | tail -1 || echo 'no metrics (see the train step in the log)')"
}
if enough 120 "deepspeed learner tests"; then
    step 300 deepspeed_tests $PY -m pytest tests/learners/test_deepspeed.py -q -p no:cacheprovider -m "not slow"
    note "deepspeed learner on the GPU vs torch learner on CPU (exit $?): $(tail -1 "$STEPS_DIR/deepspeed_tests.log")"
fi
# Without checkpointing 40,960 tokens would need ~190 GB of activations (the plan says so): 8,192 tokens instead.
enough 60 "paper-shape learner step, checkpointing false" && paper_step false 120 8192
# the learner update against the FLOP bound: full fine-tuning (ZeRO-2 and 3), then LoRA r64 (ZeRO-2)
for mode in full lora; do
    enough 90 "update benchmark, $mode" || continue
    flags="--full --stages 2,3"; [ "$mode" = lora ] && flags="--stages 2"
    # shellcheck disable=SC2086 # $flags is several words
    step 300 "update_$mode" $PY -m benchmarks.update --model builtin:qwen3-0.6b-shape --dtype bfloat16 --rows 64 \
        --seq 512 --prompt 128 --micro 16 --warmup 1 --steps 3 $flags
    note "update benchmark, $mode (exit $?): $(grep -E '^(FLOP bound|summary)' "$STEPS_DIR/update_$mode.log" | tr '\n' ' ')"
done
if has ray && has vllm; then
    if enough 120 "gpu tests"; then
        step 900 gpu_tests $PY -m pytest -m gpu -q -p no:cacheprovider
        note "gpu tests (exit $?): $(tail -1 "$STEPS_DIR/gpu_tests.log")"
    fi
    # Colocated LoRA policies on DeepSpeed ZeRO-2 (one engine per policy over one base) against separate
    # learners, both on the GPU; its learner groups import Ray (cluster/group.py).
    if enough 120 "colocated LoRA tests"; then
        step 600 colocated_tests $PY -m pytest tests/learners/test_colocated.py -q -p no:cacheprovider
        note "colocated LoRA on DeepSpeed vs separate learners (exit $?): $(tail -1 "$STEPS_DIR/colocated_tests.log")"
    fi
    enough 180 "training run" && train_run "$@"
else
    note "gpu tests, colocated LoRA tests, training run: not run (they need Ray and vLLM, which this python lacks)"
fi

echo; echo "================ GPU check summary ================"
cat "$OUT_DIR/gpu_check_summary.txt"
