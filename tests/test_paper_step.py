"""benchmarks/paper_step.py, the GPU check's learner step at the paper's shape, runs its own path on CPU at a
tiny shape (--cpu-smoke): the learner builds from the built-in's config, trains one step and reports its peak
beside the plan's estimate."""

import pytest

from benchmarks.paper_step import SMOKE_MODEL, main, overrides, run


@pytest.mark.slow  # ~16 s on the shared 2-core box, most of it importing the learner's stack
def test_cpu_smoke_runs_one_step_and_reports_peak_and_estimate():
    out = run(SMOKE_MODEL, tokens=256, rows=2, gpu=False, checkpointing=True)
    assert out["tokens"] == 256 and out["step_s"] > 0
    assert out["measured_rise_gib"] > 0 and out["estimate_rise_gib"] > 0


def test_the_gpu_step_is_the_papers_learner():
    over = overrides("builtin:qwen3-4b-shape?vocab=151936", 40960, 2, gpu=True, checkpointing=True)
    for key in ("model.lora.rank=64", "model.dtype=bfloat16", "learner.backend=deepspeed",
                "learner.logits_chunk_tokens=1024", "learner.max_tokens_per_micro_batch=40960",
                "algo.max_len=20480"):
        assert key in over


def test_cli_prints_one_result_line(capsys, monkeypatch):
    monkeypatch.setattr("benchmarks.paper_step.run", lambda *a: {"step_s": 1.0})
    assert main(["--cpu-smoke"]) == 0
    assert capsys.readouterr().out.startswith("PAPER_STEP {")
