"""The code family: extraction rules, code data sources, scoring through every workflow (off the event
loop), and the code/* metrics."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import Future

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from marl_scripted import ScriptedClient

from marl.episode import run_episode
from marl.episode_metrics import code_metrics, episode_metrics
from marl.tasks import CodeFamily, get_family
from marl.tasks.code import INSTRUCTION, code_blocks, last_python_block, program_for
from marl.tasks.code_data import code_synthetic_tasks, humaneval_path, load_code_rows
from marl.tasks.data import load_tasks
from marl.tasks.sandbox import SandboxLimits, SandboxResult
from marl.types import Completion, Episode, Task, Turn
from marl.workflows.common import WorkflowOptions

FAST = SandboxLimits(timeout_s=3.0)
CHECK = "def check(candidate):\n    assert candidate(1) == 8\n    assert candidate(5) == 12\n"
TASK = Task("add7", "Write a Python function `f(x)` that returns x plus 7.", "def f(x):\n    return x + 7\n",
            kind="code", meta={"style": "functional", "entry_point": "f", "test": CHECK})
RIGHT = "Here it is:\n```python\ndef f(x):\n    return x + 7\n```"
WRONG = "```python\ndef f(x):\n    return x + 6\n```"


@pytest.fixture(scope="module")
def family():
    family = CodeFamily(FAST, workers=2)
    yield family
    family.close()


@pytest.mark.parametrize(("text", "expected"), [
    ("```python\nprint(1)\n```", "print(1)\n"),
    ("```py\nx = 1\n```\nthen\n```Python3\nx = 2\n```", "x = 2\n"),  # the last python block
    ("```python\nx = 1\n```\nExample:\n```\n>>> f(2)\n```", "x = 1\n"),  # python beats a later bare block
    ("```\nx = 3\n```", "x = 3\n"),  # no python block: the last bare one
    ("```bash\nrm -rf /\n```", None),  # other languages never count
    ("- step:\n  ```python\n  def f():\n      return 1\n  ```", "def f():\n    return 1\n"),  # dedented
    ("```python\ndef f():\n    return 1\n", None),  # unclosed (truncated) block
    ("use ```python x = 1``` inline", None),
    ("```python\n   \n```", None),
    ("no code at all", None),
])
def test_extraction_rules(text, expected):
    assert last_python_block(text) == expected


def test_code_blocks_keep_order_and_tags():
    text = "```json\n{}\n```\n```python\na\n```\n```\nb\n```"
    assert code_blocks(text) == [("json", "{}\n"), ("python", "a\n"), ("", "b\n")]


def test_program_for_needs_tests():
    with pytest.raises(ValueError, match="no tests"):
        program_for(Task("x", "p", "", kind="code"), "print(1)")
    stdio = program_for(Task("s", "p", "", kind="code", meta={"style": "stdio", "cases": [
        {"input": "1\n", "output": "2\n"}]}), "print(2)")
    assert (stdio.style, stdio.inputs, stdio.outputs) == ("stdio", ("1\n",), ("2\n",))


def test_humaneval_tasks_come_from_the_package_data_file():
    assert humaneval_path().name == "HumanEval.jsonl.gz" and humaneval_path().is_file()
    tasks = load_tasks("humaneval", None, 0, "code")[:3]
    assert [t.task_id for t in tasks] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    # A cut is a seeded selection, not the first rows of the listing.
    cut = load_tasks("humaneval", 3, 0, "code")
    assert len(cut) == 3 and cut == load_tasks("humaneval", 3, 0, "code") != tasks
    first = tasks[0]
    assert first.kind == "code" and first.meta["entry_point"] == "has_close_elements"
    assert "def has_close_elements" in first.prompt and first.answer.startswith(first.meta["prefix"])


def test_synthetic_tasks_are_seeded_and_solvable_in_both_styles(family):
    tasks = code_synthetic_tasks(6, seed=3)
    assert tasks == code_synthetic_tasks(6, seed=3) and tasks != code_synthetic_tasks(6, seed=4)
    assert [t.meta["style"] for t in tasks] == ["functional", "stdio"] * 3
    assert all(family.score(t, t.answer) == 1.0 for t in tasks)
    assert all(family.score(t, "print(0)\n") == 0.0 for t in tasks)


CASES = [{"input": "2 3\n", "output": "5\n", "testtype": "stdin"}, {"input": "10 -4\n", "output": "6"}]
ADDER = "a, b = map(int, input().split())\nprint(a + b)\n"


def test_user_code_rows_in_deepcoder_verl_and_humaneval_layouts(tmp_path, family):
    cases = CASES
    rows = [
        {"id": "deepcoder", "problem": "Add two integers.", "tests": json.dumps(cases)},
        {
            "id": "taco",
            "question": "Add two integers.",
            "tests": json.dumps({"inputs": ["1 1\n"], "outputs": [["2"]]}),
        },
        {
            "id": "verl",
            "prompt": [{"role": "system", "content": "x"}, {"role": "user", "content": "Add them."}],
            "reward_model": {"ground_truth": json.dumps(cases), "style": "rule"},
        },
        {
            "task_id": "he",
            "prompt": "def g(x):\n    \"\"\"Twice x.\"\"\"\n",
            "entry_point": "g",
            "canonical_solution": "    return 2 * x\n",
            "test": "def check(candidate):\n    assert candidate(4) == 8\n",
        },
        {
            "id": "call",
            "problem": "p",
            "tests": json.dumps([{"input": "[1]", "output": "1", "testtype": "functional"}]),
        },
        {
            "id": "apps_call",
            "problem": "p",
            "tests": json.dumps({"inputs": [[1]], "outputs": [1], "fn_name": "f"}),
        },
        {"id": "no_tests", "problem": "p"},
        {"id": "bad", "problem": "p", "tests": "{not json"},
        {"id": "deepcoder", "problem": "duplicate id", "tests": json.dumps(cases)},
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    report = load_code_rows(path)
    assert [t.task_id for t in report.tasks] == ["deepcoder", "taco", "verl", "he"]
    assert report.reasons == {"unsupported_tests": 2, "missing_tests": 1, "bad_tests": 1, "duplicate_id": 1,
                              "bad_json": 1}
    cut = load_tasks(str(path), 2, 0, kind="code")
    assert (
        len(cut) == 2
        and all(t in report.tasks for t in cut)
        and cut == load_tasks(str(path), 2, 0, kind="code")
    )
    deepcoder, taco, verl, he = report.tasks
    assert verl.prompt.startswith("Add them.") and "standard input" in verl.prompt
    assert [family.score(t, ADDER) for t in (deepcoder, taco, verl)] == [1.0, 1.0, 1.0]
    assert family.score(he, he.answer) == 1.0 and family.score(he, "def g(x):\n    return x\n") == 0.0


@pytest.mark.parametrize("layout", ["deepcoder", "verl"])
def test_parquet_code_rows(tmp_path, family, layout):
    def row(i):
        if layout == "deepcoder":
            return {"problem": f"Add two integers ({i}).", "tests": json.dumps(CASES), "starter_code": ""}
        return {"data_source": "code", "prompt": [{"role": "user", "content": f"Add two integers ({i})."}],
                "reward_model": {"ground_truth": json.dumps(CASES), "style": "rule"}}

    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([row(i) for i in range(3)]), path)
    tasks = load_tasks(str(path), None, 0, kind="code")
    assert [t.task_id for t in tasks] == ["rows:0", "rows:1", "rows:2"]
    assert [family.score(t, ADDER) for t in tasks] == [1.0] * 3


def test_a_file_without_usable_code_rows_is_an_error(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text(json.dumps({"problem": "p"}) + "\n")
    with pytest.raises(ValueError, match="no valid code rows"):
        load_tasks(str(path), None, 0, kind="code")


def run(workflow, client, family, opts=WorkflowOptions()):
    return asyncio.run(run_episode(workflow, TASK, client, family, opts, sample_index=0))


def test_single_agent_on_code(family):
    client = ScriptedClient({"solver": RIGHT})
    ep = run("single_agent", client, family)
    assert ep.reward == 1.0 and ep.score_info["reason"] == "ok" and ep.score_info["answer_role"] == "solver"
    assert INSTRUCTION in client.calls[0].messages[-1]["content"]


def test_eval_opt_on_code_runs_two_rounds_and_the_evaluator_reads_the_code(family):
    client = ScriptedClient({"generator": [WRONG, RIGHT],
                             "evaluator": ["Off by one. \\boxed{Incorrect}", "Fine now. \\boxed{Correct}"]})
    ep = run("eval_opt", client, family, WorkflowOptions(max_rounds=2))
    assert [(t.role, t.round) for t in ep.turns] == [("generator", 0), ("evaluator", 0), ("generator", 1),
                                                     ("evaluator", 1)]
    assert "return x + 6" in ep.turns[1].messages[-1]["content"]  # judged from the text, never run
    assert INSTRUCTION in ep.turns[2].messages[-1]["content"]  # the revision request repeats the format
    assert ep.reward == 1.0 and ep.score_info["answer_role"] == "generator"


def test_eval_opt_on_code_stops_after_max_rounds(family):
    client = ScriptedClient({"generator": WRONG, "evaluator": "\\boxed{Incorrect}"})
    ep = run("eval_opt", client, family, WorkflowOptions(max_rounds=2))
    assert len(ep.turns) == 4 and ep.reward == 0.0 and ep.score_info["reason"] == "failed"


def test_voting_on_code_scores_the_chosen_program(family):
    client = ScriptedClient({"generator0": WRONG, "generator1": RIGHT, "generator2": "no idea",
                             "aggregator": "Response 2 handles it. \\boxed{2}"})
    ep = run("voting", client, family)
    assert ep.reward == 1.0 and ep.score_info["answer_role"] == "generator"
    assert "return x + 7" in ep.turns[-1].messages[-1]["content"]
    client = ScriptedClient({"generator0": WRONG, "generator1": RIGHT, "generator2": "no idea",
                             "aggregator": "\\boxed{3}"})
    ep = run("voting", client, family)
    assert ep.reward == 0.0
    assert ep.score_info == {"answer_role": "generator", "reason": "no_code_block", "choice": 3}


def test_orch_workers_on_code_scores_the_synthesised_program(family):
    client = ScriptedClient({"orchestrator": "STRATEGY 1: add directly\nSTRATEGY 2: add in a loop",
                             "worker0": RIGHT, "worker1": WRONG, "synthesizer": RIGHT})
    ep = run("orch_workers", client, family)
    assert ep.reward == 1.0 and ep.score_info["answer_role"] == "synthesizer"
    assert INSTRUCTION in ep.turns[-1].messages[-1]["content"]


def test_scoring_waits_for_the_pool_without_blocking_the_event_loop():
    """While one episode's program runs, the event loop keeps serving other coroutines. A blocking score
    would hold the loop until the safety timer completes the future, and the check below would fail."""
    family = CodeFamily(FAST, workers=1)
    family._checked = True  # the pool is replaced below; no self-check needed
    pending: Future = Future()
    submitted = threading.Event()

    def submit(program):
        submitted.set()
        return pending

    family.pool.submit = submit
    safety = threading.Timer(
        10.0, lambda: pending.done() or pending.set_result(SandboxResult(False, "timeout"))
    )
    safety.start()

    async def main():
        episode = asyncio.ensure_future(
            run_episode("single_agent", TASK, ScriptedClient({"solver": RIGHT}), family, WorkflowOptions(), 0)
        )
        while not submitted.is_set():
            await asyncio.sleep(0)
        loop_was_free = not pending.done()
        pending.set_result(SandboxResult(True, "ok"))
        return loop_was_free, await episode

    try:
        loop_was_free, ep = asyncio.run(main())
    finally:
        safety.cancel()
    assert loop_was_free and ep.reward == 1.0 and ep.score_info["reason"] == "ok"


def test_many_episodes_score_concurrently_through_one_pool(family):
    async def main():
        runs = [
            run_episode("single_agent", TASK, ScriptedClient({"solver": text}), family, WorkflowOptions(), i)
            for i, text in enumerate([RIGHT, WRONG, "none", RIGHT] * 2)
        ]
        return await asyncio.gather(*runs)

    episodes = asyncio.run(main())
    assert [e.reward for e in episodes] == [1.0, 0.0, 0.0, 1.0] * 2
    assert [e.score_info["reason"] for e in episodes[:4]] == ["ok", "failed", "no_code_block", "ok"]


def _episode(reason: str | None, role: str | None, kind: str = "code", failure: str | None = None) -> Episode:
    completion = Completion("x", [1], [2], [-0.1])
    info = {k: v for k, v in (("reason", reason), ("answer_role", role)) if v is not None}
    turns = [Turn("generator", "generator0", 0, [], completion)]
    return Episode(Task("t", "p", "", kind=kind), 0, "voting", turns=turns, failure=failure, score_info=info)


def test_code_metrics_count_reasons_per_answering_role():
    episodes = [
        _episode("timeout", "generator"),
        _episode("timeout", "generator"),
        _episode("crash", "generator"),
        _episode("no_code_block", "synthesizer"),
        _episode("oom", "generator"),
        _episode("ok", "generator"),
        _episode(None, None, failure="too_many_strategies"),
        _episode("syntax_error", "generator"),
    ]
    m = code_metrics(episodes, ["generator", "aggregator", "synthesizer"])
    assert (m["code/timeouts"], m["code/crashes"], m["code/oom"], m["code/no_code_block"]) == (2, 1, 1, 1)
    assert (m["code/syntax_errors"], m["code/output_limits"], m["code/sandbox_errors"]) == (1, 0, 0)
    assert m["code/timeouts/generator"] == 2 and m["code/timeouts/aggregator"] == 0
    assert m["code/no_code_block/synthesizer"] == 1 and m["code/no_code_block/generator"] == 0
    assert set(m) <= set(episode_metrics(episodes, ["generator", "aggregator", "synthesizer"]))


def test_code_metrics_appear_only_with_code_tasks():
    math_only = episode_metrics([_episode(None, "generator", kind="math")], ["generator"])
    assert not any(k.startswith("code/") for k in math_only)


def test_get_family_builds_the_code_family_from_the_config_section():
    from marl.tasks.sandbox.limits import SandboxConfig

    family = get_family(
        "code", sandbox=SandboxConfig(timeout_s=2.5, memory_mb=256, site_packages=True, workers=3)
    )
    assert isinstance(family, CodeFamily) and family.instruction() == INSTRUCTION
    limits = family.pool.limits
    assert (limits.timeout_s, limits.memory_mb, limits.site_packages, family.pool.workers) == (
        2.5,
        256,
        True,
        3,
    )
    with pytest.raises(ValueError, match="timeout_s"):
        get_family("code", sandbox=SandboxConfig(timeout_s=0))


def test_every_sandbox_config_key_reaches_the_sandbox():
    """The schema's `data.sandbox` keys are the section the code family reads, and each sets the limit of its
    name (a key added to the schema but not read would be silently ignored)."""
    import dataclasses

    from jobs.config.schema import DataConfig
    from marl.tasks.sandbox.limits import OutputMatch, SandboxConfig, SandboxLimits, limits_of

    sandbox = next(f for f in dataclasses.fields(DataConfig) if f.name == "sandbox")
    assert sandbox.default_factory is SandboxConfig
    keys = {f.name for f in dataclasses.fields(SandboxConfig)}
    section = SandboxConfig(timeout_s=7.0, timeout_per_test_s=2.0, memory_mb=300, max_output_bytes=999,
                            file_size_mb=9, max_processes=3, site_packages=True, prelude=True,
                            output_match=OutputMatch.lines_decimal, workers=2)
    limits = limits_of(section)
    assert {k: getattr(limits, k) for k in keys - {"workers"}} == {
        k: getattr(section, k) for k in keys - {"workers"}
    }
    assert all(getattr(limits, k) != getattr(SandboxLimits(), k) for k in keys - {"workers"})
