"""Episode ⇄ Arrow/Parquet with one explicit schema: one row per turn, episode fields repeated."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from marl.types import Completion, Episode, Task, Turn

SCHEMA = pa.schema([
    ("step", pa.int64()),
    ("episode", pa.int64()),  # index of the episode within the step
    ("workflow", pa.string()),
    ("task_id", pa.string()),
    ("task_prompt", pa.string()),
    ("task_answer", pa.string()),
    ("task_kind", pa.string()),
    ("sample_index", pa.int64()),
    ("final_answer", pa.string()),
    ("episode_reward", pa.float64()),
    ("failure", pa.string()),
    ("parse_failures", pa.string()),  # JSON {role: count}
    ("score_info", pa.string()),  # JSON: answer_role and what the scorer reported (code: reason, times)
    ("turn", pa.int64()),
    ("role", pa.string()),
    ("agent", pa.string()),
    ("round", pa.int64()),
    ("messages", pa.string()),  # JSON chat messages sent to the engine
    ("response", pa.string()),
    ("prompt_ids", pa.list_(pa.int32())),
    ("response_ids", pa.list_(pa.int32())),
    ("logprobs", pa.list_(pa.float32())),
    ("finish_reason", pa.string()),
    ("policy_id", pa.string()),
    ("version", pa.int64()),
    ("reward", pa.float64()),
])


def _rows(step: int, index: int, ep: Episode) -> list[dict]:
    base = {
        "step": step, "episode": index, "workflow": ep.workflow, "task_id": ep.task.task_id,
        "task_prompt": ep.task.prompt, "task_answer": ep.task.answer, "task_kind": ep.task.kind,
        "sample_index": ep.sample_index, "final_answer": ep.final_answer, "episode_reward": ep.reward,
        "failure": ep.failure, "parse_failures": json.dumps(ep.parse_failures),
        "score_info": json.dumps(ep.score_info),
    }
    return [{
        **base, "turn": k, "role": t.role, "agent": t.agent, "round": t.round,
        "messages": json.dumps(t.messages), "response": t.completion.text,
        "prompt_ids": t.completion.prompt_ids, "response_ids": t.completion.response_ids,
        "logprobs": t.completion.logprobs, "finish_reason": t.completion.finish_reason,
        "policy_id": t.completion.policy_id, "version": t.completion.version, "reward": t.reward,
    } for k, t in enumerate(ep.turns)]


def episodes_to_table(episodes: list[Episode], step: int) -> pa.Table:
    rows = [r for i, ep in enumerate(episodes) for r in _rows(step, i, ep)]
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def write_episodes(episodes: list[Episode], step: int, path: str | Path) -> None:
    pq.write_table(episodes_to_table(episodes, step), str(path))


def read_episodes(path: str | Path) -> list[Episode]:
    """Episodes back from a file written by `write_episodes` (episodes without turns are not stored)."""
    episodes: dict[int, Episode] = {}
    for r in pq.read_table(str(path), schema=SCHEMA).to_pylist():
        ep = episodes.get(r["episode"])
        if ep is None:
            task = Task(r["task_id"], r["task_prompt"], r["task_answer"], r["task_kind"])
            ep = episodes[r["episode"]] = Episode(
                task,
                r["sample_index"],
                r["workflow"],
                final_answer=r["final_answer"],
                reward=r["episode_reward"],
                failure=r["failure"],
                parse_failures=json.loads(r["parse_failures"]),
                score_info=json.loads(r["score_info"] or "{}"),
            )
        completion = Completion(r["response"], r["prompt_ids"], r["response_ids"], r["logprobs"],
                                r["finish_reason"], r["version"], r["policy_id"])
        ep.turns.append(
            Turn(r["role"], r["agent"], r["round"], json.loads(r["messages"]), completion, r["reward"])
        )
    return [episodes[k] for k in sorted(episodes)]
