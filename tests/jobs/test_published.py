"""The plan of prime-rl's published baselines (jobs/plan/published.py) as docs/scaling.md tables it: the
ratios the page prints are the planner's, each explained; the GPU coefficients stay within the band of this
learner's own measurements on an H200 (benchmarks/results/2026-12-04-gpu-check-h200.md)."""

import re

import pytest

from jobs.pages.baselines import BAND, EXPLAINED, explained, ratios
from jobs.plan.published import MEASURED_H200, PUBLISHED, estimate, memory
from learners.compute.memory import GPU_ALLOCATOR_POOL


def _page_rows() -> list[list[str]]:
    with open("docs/scaling.md") as f:
        section = f.read().split("## Held against published measurements", 1)[1]
    return [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| Qwen3-")]


def test_the_page_prints_the_planners_ratios():
    rows = _page_rows()
    assert len(rows) == len(PUBLISHED)
    for row, p in zip(rows, PUBLISHED, strict=True):
        mem, time = ratios(p)
        assert float(row[6].strip("*")) == round(mem, 2), (p, "memory ratio: regenerate docs/scaling.md")
        assert float(row[10].strip("*")) == round(time, 2), (p, "time ratio: regenerate docs/scaling.md")
        assert row[2] == f"{p.tokens:,}" and row[1] == str(p.gpus)


def test_every_ratio_is_explained_and_a_moved_ratio_refuses_the_page(monkeypatch):
    assert [(round(m, 2), round(t, 2)) for _, m, t, _ in explained()] == [(m, t) for m, t, _ in EXPLAINED]
    for (mem, time, why), p in zip(EXPLAINED, PUBLISHED, strict=True):
        inside = BAND[0] <= mem <= BAND[1] and BAND[0] <= time <= BAND[1]
        assert inside or len(why) > 40, p
    monkeypatch.setattr("learners.compute.memory.GPU_ALLOCATOR_POOL", 1.5)
    with pytest.raises(ValueError, match="rewrite jobs/pages/baselines.py EXPLAINED"):
        explained()


def test_the_plan_stays_within_the_band_of_the_h200_measurements():
    for i, (allocated, reserved, step) in MEASURED_H200.items():
        p = PUBLISHED[i]
        e = estimate(p)
        assert BAND[0] <= e["allocated_gib"] / allocated <= BAND[1], p
        assert BAND[0] <= e["step_s"] / step <= BAND[1], p
        assert reserved / allocated <= GPU_ALLOCATOR_POOL + 1e-9, (
            p,
            "the pool margin must cover every measurement",
        )


def test_the_published_rows_are_the_issue_figures_and_the_8_gpu_ones_shard():
    assert [(p.size, p.lora_rank, p.tokens, p.gpus) for p in PUBLISHED] == [
        ("0.6b", 0, 65536, 1), ("0.6b", 16, 65536, 1), ("4b", 16, 16384, 1), ("4b", 16, 65536, 1),
        ("4b", 16, 65536, 8), ("4b", 0, 16384, 8), ("4b", 0, 65536, 8)]
    one, eight = memory(PUBLISHED[3]), memory(PUBLISHED[4])
    assert eight.weights < one.weights / 4 and eight.activations == one.activations
    assert re.fullmatch(r"ZeRO-[23]", f"ZeRO-{PUBLISHED[4].zero_stage()}")
