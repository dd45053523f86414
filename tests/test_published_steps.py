"""benchmarks/published_steps.py, the GPU check's learner steps at the published baselines: the learner it
builds is the planned one (two micro-batches of one sequence, checkpointing, bf16 ZeRO-2 on a GPU), and its
own path runs on CPU at a tiny shape (--cpu-tiny)."""

import json

import pytest

from benchmarks.published_steps import SINGLE_GPU, main, settings, summary
from jobs.plan.published import MICRO_BATCHES, PUBLISHED
from learners.update.micro_batches import micro_batch_rows


def test_only_the_single_gpu_baselines_run_on_one_gpu():
    assert [PUBLISHED[i].gpus for i in SINGLE_GPU] == [1, 1, 1, 1]
    assert len(PUBLISHED) - len(SINGLE_GPU) == 3


def test_the_gpu_learner_is_the_planned_one():
    p = PUBLISHED[3]  # 4B LoRA r16 at 65,536 tokens
    over = settings(p.model(), p, p.tokens, gpu=True)
    for key in ("model.lora.rank=16", "model.dtype=bfloat16", "learner.backend=deepspeed",
                "learner.deepspeed.zero_stage=2", "learner.gradient_checkpointing=true",
                "learner.logits_chunk_tokens=1024", "learner.max_tokens_per_micro_batch=65536",
                "algo.max_len=65536", "algo.old_logprobs=rollout"):
        assert key in over
    assert "model.lora.enabled=False" in settings(PUBLISHED[0].model(), PUBLISHED[0], 65536, gpu=True)


def test_each_step_is_two_micro_batches_of_one_sequence():
    rows = micro_batch_rows([65536] * MICRO_BATCHES, size=32, budget=65536)
    assert rows == [[0], [1]]


@pytest.mark.slow  # ~20 s on the shared 2-core box, most of it importing the learner's stack
def test_cpu_tiny_measures_a_step_beside_the_plan(capsys):
    assert main(["--cpu-tiny", "--config", "1", "--steps", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    record = json.loads(next(x for x in lines if x.startswith("PUBLISHED_STEP ")).split(" ", 1)[1])
    assert "error" not in record, record
    assert record["measured"]["step_s"] > 0 and record["planned"]["peak_gib"] > 0
    assert record["published"]["peak_gib"] == PUBLISHED[1].peak_gib
    assert any(x.startswith("SUMMARY 0.6B LoRA r16") for x in lines)


def test_summary_says_an_error():
    assert summary({"config": "x", "error": "OutOfMemoryError: ..."}) == "x: OutOfMemoryError: ..."


def test_build_only_builds_the_models(capsys):
    assert main(["--cpu-tiny", "--build", "--config", "0", "--config", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("BUILT builtin:qwen3-0.6b-shape?vocab=4096")
