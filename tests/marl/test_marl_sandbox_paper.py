"""The paper's grader settings in the sandbox: the per-test limit stopped inside the child, the LiveCodeBench
prelude, and line-wise output comparison with a Decimal fallback (hand-written cases)."""

from __future__ import annotations

import pytest
from sandbox_leftovers import functional, machine_unharmed  # noqa: F401 - machine_unharmed is autouse

from marl.tasks.sandbox import Program, SandboxLimits, run
from marl.tasks.sandbox.prelude import prelude_source
from marl.tasks.sandbox.runner import compare_outputs, lines_decimal_equal, outputs_equal

SLOW_SECOND = "import time\nline = input()\nif line == 'slow':\n    {slow}\nprint(line)\n"


@pytest.mark.parametrize("slow", [
    "time.sleep(3)",  # the alarm interrupts it
    # Swallows the alarm and ends anyway, past the limit: timed out all the same.
    "try:\n        time.sleep(3)\n    except BaseException:\n        time.sleep(0.2)",
    "while True:\n        pass",
])
def test_a_test_past_its_per_test_limit_times_out_inside_the_child(slow):
    program = Program(code=SLOW_SECOND.format(slow=slow), style="stdio", inputs=("a", "slow", "c"),
                      outputs=("a", "slow", "c"))
    limits = SandboxLimits(timeout_s=120.0, timeout_per_test_s=0.5)
    assert limits.for_program(program).timeout_s == (0.5 + 1) * 3 + 5  # the wall alone would allow 3 s
    result = run(program, limits)
    assert (result.reason, result.detail) == ("timeout", "case 2: over the 0.5 s per-test limit")
    assert result.wall_s < 2.5
    fast = Program(code=SLOW_SECOND.format(slow="pass"), style="stdio", inputs=("a", "b"), outputs=("a", "b"))
    assert run(fast, limits).passed  # the control


def test_a_functional_check_past_its_per_test_limit_times_out():
    code = "import time\ndef f():\n    time.sleep(3)\n    return 1\n"
    result = run(functional(code), SandboxLimits(timeout_s=120.0, timeout_per_test_s=0.5))
    assert result.reason == "timeout" and "0.5 s per-test limit" in result.detail and result.wall_s < 2.5


FORGETFUL = (
    "def depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n"
    "q = deque([3, 1, 2])\nheappush(h := [], 5)\n"
    "print(gcd(12, 18), sorted(q), h, depth(5000), comb(5, 2), accumulate is itertools.accumulate)\n"
)


def test_the_prelude_runs_code_that_forgets_imports_and_recurses_deep():
    program = Program(code=FORGETFUL, style="stdio", inputs=("",), outputs=("6 [1, 2, 3] [5] 5000 10 True",))
    without = run(program, SandboxLimits(timeout_s=10.0))
    assert without.reason == "failed" and "NameError" in without.detail
    assert run(program, SandboxLimits(timeout_s=10.0, prelude=True)).passed
    functional_code = "def f():\n    return len(Counter('aab')) - 1\n"
    assert run(functional(functional_code), SandboxLimits(timeout_s=10.0, prelude=True)).passed


def test_prelude_source_by_hand():
    source = prelude_source()
    assert source.startswith("from string import *\nfrom re import *\n")
    assert "from typing import *\nimport string\n" in source and "import typing" not in source
    assert source.endswith("import json\nsys.setrecursionlimit(50000)\n")


@pytest.mark.parametrize("got, want, lines, decimal", [
    ("0.50\n", "0.5", False, True),  # equal as Decimals
    ("1e3 2", "1000 2.0", False, True),
    ("abc 1", "abc 1.0", False, False),  # a token that is no number: text only
    ("1\n 2", "1\n2", False, True),  # LiveCodeBench strips each line at both ends
    ("1 2\n", "1 2  \n\n", True, True),
    ("1\n2", "1\n2\n3", False, False),
    ("nan", "nan", True, True),  # equal as text; as Decimals NaN would never be equal
    ("1 nan", "1.0 nan", False, False),
    ("sNaN 1", "sNaN 1.0", False, False),  # a signalling NaN refuses to compare: not equal, no error
])
def test_output_comparison_by_hand(got, want, lines, decimal):
    assert outputs_equal(got, want) is lines
    assert outputs_equal(got, want, "lines_decimal") is lines_decimal_equal(got, want) is decimal


def test_lines_decimal_end_to_end():
    program = Program(code="print(1 / 2)\nprint(' 3')\n", style="stdio", inputs=("",), outputs=("0.50\n3",))
    assert run(program, SandboxLimits(timeout_s=10.0)).reason == "failed"
    assert run(program, SandboxLimits(timeout_s=10.0, output_match="lines_decimal")).passed
    assert compare_outputs(["0.5"], ("0.50",), "lines_decimal") == (True, "ok", "")
    with pytest.raises(ValueError, match="output_match"):
        SandboxLimits(output_match="tokens")
