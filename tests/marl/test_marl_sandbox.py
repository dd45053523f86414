"""The code sandbox on ordinary programs: HumanEval's canonical solutions pass (with the pool, in time),
wrong ones fail, failures are classified, stdin/stdout programs behave as in a real run, and the code family
records the reason. Hostile programs: test_marl_sandbox_hostile.py."""

from __future__ import annotations

import time

import pytest

# machine_unharmed is an autouse fixture: importing it is using it.
from sandbox_leftovers import ONE_TEST, functional, machine_unharmed  # noqa: F401

from marl.tasks.code import CodeFamily, program_for
from marl.tasks.data import load_tasks
from marl.tasks.sandbox import Program, SandboxLimits, SandboxPool, run
from marl.types import Task

FAST = SandboxLimits(timeout_s=3.0)


@pytest.fixture(scope="module")
def humaneval():
    return load_tasks("humaneval", None, 0, "code")


def test_every_humaneval_canonical_solution_passes_with_the_pool(humaneval):
    assert len(humaneval) == 164
    start = time.monotonic()
    with SandboxPool(SandboxLimits(), workers=2) as pool:
        results = pool.run_all(program_for(task, task.answer) for task in humaneval)
    elapsed = time.monotonic() - start
    failed = [
        (t.task_id, r.reason, r.detail) for t, r in zip(humaneval, results, strict=True) if not r.passed
    ]
    assert failed == []
    assert elapsed < 60, elapsed
    assert {r.network_isolation for r in results} == {"namespace"}  # this machine grants CAP_SYS_ADMIN
    assert {r.user_isolation for r in results} == {"uid"}  # and runs the tests as root


def test_wrong_humaneval_solutions_fail(humaneval):
    tasks = humaneval[::8]
    with SandboxPool(SandboxLimits(), workers=2) as pool:
        results = pool.run_all(program_for(t, t.meta["prefix"] + "    return None\n") for t in tasks)
    assert not any(r.passed for r in results)
    assert {r.reason for r in results} == {"failed"}


def test_the_control_program_passes():
    result = run(functional("def f():\n    return 1\n"), FAST)
    assert result.passed and result.reason == "ok" and result.returncode == 0
    assert 0 < result.startup_s < result.wall_s and result.cpu_s > 0


@pytest.mark.parametrize(("code", "reason", "detail"), [
    ("def f(:\n    return 1\n", "syntax_error", "SyntaxError"),
    ("def f():\n    return 2\n", "failed", "AssertionError"),
    ("def g():\n    return 1\n", "failed", "no function named 'f'"),
    ("def f():\n    raise KeyError('boom')\n", "failed", "KeyError"),
])
def test_ordinary_failures_are_classified(code, reason, detail):
    result = run(functional(code), FAST)
    assert not result.passed and result.reason == reason and detail in result.detail


def stdio(code: str, cases: list[tuple[str, str]]) -> Program:
    return Program(
        code=code, style="stdio", inputs=tuple(i for i, _ in cases), outputs=tuple(o for _, o in cases)
    )


@pytest.mark.parametrize(
    "code",
    [
        "print(int(input()) * 2)\n",
        "import sys\nprint(sum(map(int, sys.stdin.buffer.read().split())) * 2)\n",
        "print(int(open(0).read()) * 2, end='  \\n\\n')\n",
        "import os\nos.write(1, str(int(input()) * 2).encode())\n",
        "import sys, threading\ndef main():\n    print(int(input()) * "
        "2)\nthreading.Thread(target=main).start()\n",
        "import sys\nprint(int(input()) * 2)\nsys.exit(0)\n",
    ],
)
def test_stdio_programs_read_stdin_and_write_stdout_as_in_a_real_run(code):
    result = run(stdio(code, [("1\n", "2"), ("21\n", "42\n"), ("-4", "-8")]), FAST)
    assert result.passed, result


@pytest.mark.parametrize(("code", "reason", "detail"), [
    ("print(int(input()) * 3)\n", "failed", "case 2: wrong output"),
    ("x = int(input())\nprint(x * 2 if x != 21 else 1 // 0)\n", "failed", "case 2: ZeroDivisionError"),
    ("import sys\nsys.exit(3)\n", "failed", "case 1: exited (3)"),
    ("print(input(\n", "syntax_error", "SyntaxError"),
])
def test_stdio_failures_name_the_case(code, reason, detail):
    result = run(stdio(code, [("0\n", "0"), ("21\n", "42\n"), ("-4", "-8")]), FAST)
    assert result.reason == reason and detail in result.detail


def test_large_inputs_and_outputs_pass_through():
    numbers = " ".join(str(i) for i in range(200_000))  # ~1.3 MB: larger than a pipe buffer
    code = "import sys\nprint(' '.join(reversed(sys.stdin.read().split())))\n"
    expected = " ".join(reversed(numbers.split()))
    assert run(stdio(code, [(numbers, expected)]), SandboxLimits(max_output_bytes=4 * 2**20)).passed


def test_code_family_scores_and_records_the_reason():
    family = CodeFamily(FAST, workers=1)
    task = Task("t", "Write f() returning 1.", "", kind="code",
                meta={"style": "functional", "test": ONE_TEST, "entry_point": "f"})
    try:
        good = family.score_detail(task, family.extract_answer("```python\ndef f():\n    return 1\n```"))
        bad = family.score_detail(task, family.extract_answer("```python\nwhile True: pass\n```"))
        missing = family.score_detail(task, family.extract_answer("no code here"))
    finally:
        family.close()
    assert (good.reward, good.info["reason"], good.info["network_isolation"]) == (1.0, "ok", "namespace")
    assert (bad.reward, bad.info["reason"]) == (0.0, "timeout")
    assert missing.reward == 0.0 and missing.info == {"reason": "no_code_block"}


def test_the_per_test_rule_sets_each_program_s_time_limit():
    limits = SandboxLimits(timeout_s=120.0, timeout_per_test_s=6.0)
    stdio = Program(code="print(1)\n", style="stdio", inputs=("",) * 3, outputs=("1",) * 3)
    three, many = limits.for_program(stdio), limits.for_program(Program(
        code="", style="stdio", inputs=("",) * 20, outputs=("1",) * 20))
    # the CPU limit follows
    assert three.timeout_s == (6 + 1) * 3 + 5 and three.rlimits()["cpu_s"] == (27, 28)
    assert many.timeout_s == 120.0  # (6 + 1) · 20 + 5 = 145, capped
    assert limits.for_program(functional("")).timeout_s == 12.0  # a check() is one test
    assert FAST.for_program(stdio) is FAST  # off: timeout_s for every program
    with pytest.raises(ValueError, match="timeout_per_test_s"):
        SandboxLimits(timeout_per_test_s=-1.0)


def test_a_slow_suite_passes_within_its_per_test_limit():
    # 2 tests of ~0.6 s each: over a flat 1 s limit, within (1 + 1) · 2 + 5 under the per-test rule, each test
    # within its own 1 s.
    code = "import time\ntime.sleep(0.6)\nprint(input())\n"
    program = Program(code=code, style="stdio", inputs=("a", "b"), outputs=("a", "b"))
    assert run(program, SandboxLimits(timeout_s=1.0)).reason == "timeout"
    assert run(program, SandboxLimits(timeout_s=120.0, timeout_per_test_s=1.0)).passed


def test_auto_workers_follow_the_cpus_and_are_counted_again_where_a_pool_lands():
    import os
    import pickle

    pool = SandboxPool(FAST, workers=0)
    assert pool.workers == len(os.sched_getaffinity(0)) >= 1
    assert pickle.loads(pickle.dumps(pool)).__getstate__()["workers"] == 0
    assert SandboxPool(FAST, workers=3).workers == 3
    with pytest.raises(ValueError, match="workers"):
        SandboxPool(FAST, workers=-1)
