"""Data sources (validation, bad-row counts, errors) and the resumable PromptSampler."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from marl.tasks.data import (
    digit_tasks,
    gsm8k_test,
    is_generated,
    load_tasks,
    reasoning_gym_tasks,
)
from marl.tasks.overlap import normalise_prompt, prompt_set, shared_tasks, without_prompts
from marl.tasks.rows import load_rows, seeded_cut
from marl.tasks.sampler import PromptSampler
from marl.types import Task

ROWS = [
    {"prompt": "1+1?", "answer": "2", "id": "a"},
    {"prompt": "2+2?", "answer": 4},
    {"prompt": "", "answer": "1"},
    {"prompt": "no answer", "answer": None},
    {"answer": "3"},
    {"prompt": "dup", "answer": "5", "id": "a"},
]


def write_jsonl(path, rows, extra_lines=()):
    lines = [json.dumps(r) for r in rows] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_counts_bad_rows(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", ROWS, extra_lines=["{not json", "[1, 2]", ""])
    report = load_rows(path)
    assert [(t.task_id, t.prompt, t.answer) for t in report.tasks] == [
        ("a", "1+1?", "2"),
        ("train:1", "2+2?", "4"),
    ]
    assert report.skipped == 6
    assert report.reasons == {
        "missing_prompt": 2,
        "missing_answer": 1,
        "duplicate_id": 1,
        "bad_json": 1,
        "not_an_object": 1,
    }


def test_parquet_and_json(tmp_path):
    table = pa.table(
        {
            "prompt": ["", "ok", None, "1+1?", "2+2?"],
            "answer": ["1", None, "3", "2", "4"],
            "id": [None, None, None, "x", None],
        }
    )
    pq.write_table(table, tmp_path / "train.parquet")
    report = load_rows(tmp_path / "train.parquet")
    assert [(t.task_id, t.answer) for t in report.tasks] == [("x", "2"), ("train:4", "4")]
    assert report.reasons == {"missing_prompt": 2, "missing_answer": 1}
    pq.write_table(pa.table({"prompt": ["q"], "answer": [7]}), tmp_path / "ints.parquet")
    assert load_rows(tmp_path / "ints.parquet").tasks[0].answer == "7"
    (tmp_path / "train.json").write_text(json.dumps(ROWS[:2]))
    assert len(load_tasks(str(tmp_path / "train.json"), size=None, seed=0)) == 2
    assert len(load_tasks(str(tmp_path / "train.parquet"), size=1, seed=0)) == 1


def test_file_errors_name_the_path(tmp_path):
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(ValueError, match="missing.jsonl"):
        load_rows(missing)
    empty = write_jsonl(tmp_path / "empty.jsonl", ROWS[2:5])
    with pytest.raises(ValueError, match="empty.jsonl.*no valid rows"):
        load_rows(empty)
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"not parquet")
    with pytest.raises(ValueError, match="broken.parquet"):
        load_rows(broken)


def test_unknown_spec():
    with pytest.raises(ValueError, match="'mystery'"):
        load_tasks("mystery", size=10, seed=0)
    with pytest.raises(ValueError, match="size"):
        load_tasks("digit", size=None, seed=0)
    with pytest.raises(ValueError, match="reasoning_gym:no_such_generator"):
        load_tasks("reasoning_gym:no_such_generator", size=3, seed=0)


def test_reasoning_gym_is_deterministic_by_seed():
    a = load_tasks("reasoning_gym:basic_arithmetic", size=5, seed=1)
    b = reasoning_gym_tasks("basic_arithmetic", size=5, seed=1)
    c = reasoning_gym_tasks("basic_arithmetic", size=5, seed=2)
    assert a == b and [t.prompt for t in a] != [t.prompt for t in c]
    assert a[0].task_id == "basic_arithmetic:1:0" and a[0].answer


def test_digit_tasks_deterministic():
    tasks = digit_tasks(20, seed=3)
    assert tasks == digit_tasks(20, seed=3) != digit_tasks(20, seed=4)
    assert all(t.prompt == f"Write the digit {t.answer}." and t.kind == "digit" for t in tasks)


def test_gsm8k_test_set():
    tasks = gsm8k_test(None)
    assert len(tasks) == 1319
    assert tasks[0].answer == "18" and "ducks" in tasks[0].prompt
    assert all("," not in t.answer for t in tasks)
    assert len(load_tasks("gsm8k", size=10, seed=0)) == 10


def test_sampler_is_deterministic_and_covers_epochs():
    tasks = digit_tasks(7, seed=0)
    s1, s2 = PromptSampler(tasks, seed=5), PromptSampler(tasks, seed=5)
    first = s1.next(7)
    assert sorted(t.task_id for t in first) == sorted(t.task_id for t in tasks)
    assert first == s2.next(7)
    assert s1.next(10) == s2.next(3) + s2.next(7)
    assert s1.epoch == 2
    assert PromptSampler(tasks, seed=6).next(7) != first


def test_sampler_state_round_trip():
    tasks = digit_tasks(5, seed=0)
    s = PromptSampler(tasks, seed=1)
    s.next(8)
    state = s.state()
    expected = s.next(6)
    resumed = PromptSampler(tasks, seed=1)
    resumed.load_state(json.loads(json.dumps(state)))
    assert resumed.next(6) == expected
    with pytest.raises(ValueError, match="4 tasks"):
        PromptSampler(tasks[:4], seed=1).load_state(state)
    with pytest.raises(ValueError):
        PromptSampler([], seed=0)


def test_seeded_cut_shuffles_before_cutting():
    tasks = [Task(f"t{i}", f"q{i}", str(i)) for i in range(100)]
    ten = seeded_cut(tasks, 10, seed=0)
    assert len(ten) == 10 and ten != tasks[:10]  # not the head of the listing
    assert ten == seeded_cut(tasks, 10, seed=0) != seeded_cut(tasks, 10, seed=1)
    assert ten == sorted(ten, key=tasks.index)  # chosen rows keep the listing order
    assert set(map(id, ten)) <= set(map(id, seeded_cut(tasks, 20, seed=0)))  # one permutation: nested cuts
    assert seeded_cut(tasks, None, 0) == tasks == seeded_cut(tasks, 500, 0)


def test_listing_sources_are_cut_by_seed_not_by_position(tmp_path):
    rows = [{"prompt": f"q{i}?", "answer": str(i)} for i in range(50)]
    path = str(write_jsonl(tmp_path / "rows.jsonl", rows))
    everything = load_tasks(path, None, seed=0)
    picked = load_tasks(path, 10, seed=0)
    assert len(everything) == 50 and len(picked) == 10
    assert picked != everything[:10] and picked == load_tasks(path, 10, seed=0) != load_tasks(
        path, 10, seed=3
    )
    gsm8k = load_tasks("gsm8k", 10, seed=0)
    assert len(gsm8k) == 10 and gsm8k != gsm8k_test()[:10]


def test_generated_sources_are_named():
    assert is_generated("reasoning_gym:chain_sum?max_terms=2") and is_generated("digit")
    assert is_generated("code_synthetic")
    assert not any(is_generated(s) for s in ("gsm8k", "humaneval", "/data/train.parquet"))


def test_prompts_are_compared_normalised():
    assert normalise_prompt("  What  is\n1 +\t1? ") == "what is 1 + 1?"
    train = [Task("a", "What is 1+1?", "2"), Task("b", "what IS  1+1?", "2"), Task("c", "2+2?", "4")]
    evals = [Task("x", "WHAT is 1+1?\n", "2"), Task("y", "3+3?", "6")]
    assert prompt_set(train) == {"what is 1+1?", "2+2?"}
    assert [t.task_id for t in shared_tasks(train, evals)] == ["x"]
    assert [t.task_id for t in without_prompts(train, prompt_set(evals))] == ["c"]
