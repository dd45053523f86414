"""benchmarks/gpu_questions.py --cpu-dry-run: every question's code path runs on CPU at tiny shapes and writes
its one JSON line (with the torch version), so the GPU check is known to run before a GPU is lent."""

from __future__ import annotations

import json

import pytest

from benchmarks import gpu_questions


@pytest.mark.parametrize("step", sorted(gpu_questions.STEPS))
def test_each_question_runs_dry_on_cpu(step, capsys):
    assert gpu_questions.main([step, "--cpu-dry-run"]) == 0, capsys.readouterr().out
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["step"] == step and record["dry_run"] and record["torch"] and "error" not in record
    if step == "receive":
        assert record["bucket_by_bucket"]["buckets"] > 1
    if step == "ipc":
        assert record["fingerprint_matches"] and record["bytes_match"] and record["buckets"] > 1
    if step == "c10d":
        assert all(r["ok"] for r in record["one_rank"] + record["two_ranks_one_gpu"])  # gloo on CPU: works
