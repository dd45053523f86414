"""Episode ⇄ Parquet: a lossless round trip for float32-representable logprobs, and a stable schema."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from marl.types import Completion, Episode, Task, Turn
from rollout.storage import SCHEMA, episodes_to_table, read_episodes, write_episodes

COLUMNS = [
    ("step", pa.int64()),
    ("episode", pa.int64()),
    ("workflow", pa.string()),
    ("task_id", pa.string()),
    ("task_prompt", pa.string()),
    ("task_answer", pa.string()),
    ("task_kind", pa.string()),
    ("sample_index", pa.int64()),
    ("final_answer", pa.string()),
    ("episode_reward", pa.float64()),
    ("failure", pa.string()),
    ("parse_failures", pa.string()),
    ("score_info", pa.string()),
    ("turn", pa.int64()),
    ("role", pa.string()),
    ("agent", pa.string()),
    ("round", pa.int64()),
    ("messages", pa.string()),
    ("response", pa.string()),
    ("prompt_ids", pa.list_(pa.int32())),
    ("response_ids", pa.list_(pa.int32())),
    ("logprobs", pa.list_(pa.float32())),
    ("finish_reason", pa.string()),
    ("policy_id", pa.string()),
    ("version", pa.int64()),
    ("reward", pa.float64()),
]


def _turn(role: str, agent: str, round_: int, text: str, reward: float, version: int = 3) -> Turn:
    messages = [
        {"role": "system", "content": "Be careful — ünïcödé"},
        {"role": "user", "content": f"{agent}?"},
    ]
    completion = Completion(
        text=text,
        prompt_ids=[1, 2, 3, 70000],
        response_ids=[ord(c) for c in text],
        logprobs=[-0.5, -1.25, -0.0078125, -3.0][: len(text)] + [-2.0] * max(len(text) - 4, 0),
        finish_reason="length" if len(text) > 4 else "stop",
        version=version,
        policy_id=f"policy_{role}",
    )
    return Turn(role, agent, round_, messages, completion, reward)


def _episodes() -> list[Episode]:
    solved = Episode(Task("math:1", "1 + 1?", "2", "math"), 0, "eval_opt",
                     turns=[_turn("generator", "generator", 0, "2", 1.0), _turn("evaluator", "evaluator", 0,
                                                                                 "\\boxed{Correct}", 0.5),
                            _turn("generator", "generator", 1, "it is 2", 1.0)],
                     final_answer="2", reward=1.0,
                     score_info={"answer_role": "generator", "reason": "ok", "wall_s": 0.05})
    failed = Episode(Task("digit:7", "Write the digit 7.", "7", "digit"), 3, "orch_workers",
                     turns=[_turn("orchestrator", "orchestrator", 0, "STRATEGY 1: a\nSTRATEGY 2: b", 0.0, 4)],
                     final_answer=None, reward=0.0, failure="too_many_strategies",
                     parse_failures={"orchestrator": 2, "aggregator": 1})
    return [solved, failed]


def test_round_trip_through_parquet_is_lossless(tmp_path):
    episodes = _episodes()
    path = tmp_path / "step.parquet"
    write_episodes(episodes, step=7, path=path)
    assert read_episodes(path) == episodes


def test_one_row_per_turn_with_episode_fields_repeated():
    table = episodes_to_table(_episodes(), step=7)
    assert table.num_rows == 4
    rows = table.to_pylist()
    assert [(r["step"], r["episode"], r["turn"]) for r in rows] == [
        (7, 0, 0),
        (7, 0, 1),
        (7, 0, 2),
        (7, 1, 0),
    ]
    assert [r["task_id"] for r in rows] == ["math:1"] * 3 + ["digit:7"]
    assert [r["agent"] for r in rows] == ["generator", "evaluator", "generator", "orchestrator"]
    assert rows[3]["failure"] == "too_many_strategies" and rows[3]["final_answer"] is None


def test_schema_columns_are_stable(tmp_path):
    assert [(f.name, f.type) for f in SCHEMA] == COLUMNS
    path = tmp_path / "step.parquet"
    write_episodes(_episodes(), step=0, path=path)
    assert pq.read_schema(path).names == [name for name, _ in COLUMNS]
    assert episodes_to_table(_episodes(), step=0).schema.equals(SCHEMA)


def test_episodes_without_turns_are_not_stored(tmp_path):
    empty = Episode(Task("math:9", "?", "0"), 0, "single_agent")
    episodes = _episodes()
    path = tmp_path / "step.parquet"
    write_episodes([episodes[0], empty, episodes[1]], step=1, path=path)
    assert read_episodes(path) == episodes


def test_logprobs_are_stored_as_float32(tmp_path):
    episodes = _episodes()
    episodes[0].turns[0].completion.logprobs = [-0.1]
    path = tmp_path / "step.parquet"
    write_episodes(episodes, step=0, path=path)
    stored = read_episodes(path)[0].turns[0].completion.logprobs
    assert stored != [-0.1] and stored == [float(pa.scalar(-0.1, pa.float32()).as_py())]
