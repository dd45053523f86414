"""User rows into Tasks: reading JSONL / JSON / Parquet files, validating rows one by one (bad rows skipped
and counted by reason in a LoadReport), and the seeded cut of a listing. Math sources (marl.tasks.data) and
code sources (marl.tasks.code_data) both build on it.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marl.types import Task

log = logging.getLogger(__name__)

FILE_SUFFIXES = (".jsonl", ".json", ".parquet")


@dataclass
class LoadReport:
    """The valid tasks of one source plus how many rows were skipped, by reason."""

    tasks: list[Task]
    skipped: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1


class BadRow:
    """A row that could not even be read (e.g. a JSONL line that is not JSON)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def cell_text(value: Any) -> str:
    """A cell as stripped text; numbers are accepted (answers are often ints), anything else is empty."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)):
        return str(value)
    return ""


def _row_to_task(row: object, index: int, prefix: str, kind: str, meta: dict[str, Any]) -> Task | str:
    """A Task, or the reason the row is invalid."""
    if isinstance(row, BadRow):
        return row.reason
    if not isinstance(row, dict):
        return "not_an_object"
    prompt, answer = cell_text(row.get("prompt")), cell_text(row.get("answer"))
    if not prompt:
        return "missing_prompt"
    if not answer:
        return "missing_answer"
    task_id = cell_text(row.get("id")) or f"{prefix}:{index}"
    return Task(task_id=task_id, prompt=prompt, answer=answer, kind=kind, meta=dict(meta))


def collect_tasks(results: Iterable[Task | str]) -> LoadReport:
    """Tasks (or the reason a row was skipped) into a LoadReport; ids must be unique."""
    report = LoadReport(tasks=[])
    seen: set[str] = set()
    for result in results:
        if isinstance(result, str):
            report.skip(result)
        elif result.task_id in seen:
            # Duplicate ids would merge two prompts into one advantage group.
            report.skip("duplicate_id")
        else:
            seen.add(result.task_id)
            report.tasks.append(result)
    return report


def validate_rows(
    rows: Iterable[object], prefix: str, kind: str = "math", meta: dict[str, Any] | None = None
) -> LoadReport:
    """Turn raw rows ({'prompt', 'answer', optional 'id'}) into Tasks; ids must be unique."""
    return collect_tasks(_row_to_task(row, index, prefix, kind, meta or {}) for index, row in enumerate(rows))


def log_skips(source: str, report: LoadReport) -> None:
    if report.skipped:
        log.warning("%s: skipped %d rows %s", source, report.skipped, report.reasons)



def read_jsonl(path: Path) -> Iterator[object]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                yield BadRow("bad_json")


def _read_any(path: Path) -> object:
    if path.suffix == ".jsonl":
        return list(read_jsonl(path))
    if path.suffix == ".json":
        return json.loads(path.read_text(encoding="utf-8"))
    import pyarrow.parquet as pq  # lazy: only Parquet users pay for it

    return pq.read_table(path).to_pylist()


def read_rows(path: str | Path) -> list[object]:
    """The raw rows of a user JSONL / JSON / Parquet file (a JSONL line that is
    not JSON becomes a bad row)."""
    path = Path(path)
    if path.suffix not in FILE_SUFFIXES:
        raise ValueError(f"data file {path} must end with one of {FILE_SUFFIXES}")
    if not path.is_file():
        raise ValueError(f"data file {path} does not exist")
    try:
        rows = _read_any(path)
    except Exception as e:  # corrupt Parquet, bad JSON document, unreadable file
        raise ValueError(f"data file {path} could not be read: {e}") from e
    if not isinstance(rows, list):
        raise ValueError(f"data file {path} must hold a list of objects")
    return rows


def row_problem(row: object) -> str | None:
    """Why a raw row cannot be used at all ('bad_json', 'not_an_object'), or None for a dict."""
    if isinstance(row, BadRow):
        return row.reason
    return None if isinstance(row, dict) else "not_an_object"


def load_rows(path: str | Path, kind: str = "math") -> LoadReport:
    """Tasks from a user JSONL / JSON / Parquet file with `prompt` and `answer` (optional `id`)."""
    rows = read_rows(path)
    report = validate_rows(rows, Path(path).stem, kind=kind, meta={"source": str(path)})
    if not report.tasks:
        raise ValueError(f"data file {path} has no valid rows (skipped {report.skipped}: {report.reasons})")
    log_skips(str(path), report)
    return report



def seeded_cut(tasks: list[Task], size: int | None, seed: int) -> list[Task]:
    """`size` of `tasks` chosen by a `seed`-shuffle (all when size is None or >= len), kept in listing order.

    The first `size` of one seeded permutation: a larger size keeps every task a smaller one chose."""
    if size is None or size >= len(tasks):
        return list(tasks)
    order = list(range(len(tasks)))
    random.Random(f"cut:{seed}").shuffle(order)  # a string seed hashes the same in every process
    return [tasks[i] for i in sorted(order[:size])]
