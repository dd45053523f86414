"""Answer extraction and scoring of the math and digit families."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from marl.tasks import TASKS, DigitFamily, MathFamily, get_family
from marl.tasks.math import MAX_ANSWER_CHARS, last_boxed
from marl.types import Task

MATH = MathFamily()


def task(answer: str) -> Task:
    return Task(task_id="t", prompt="p", answer=answer)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{\\frac{1}{2}} done", "\\frac{1}{2}"),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),
        ("first \\boxed{1}, finally \\boxed{ 2 }", "2"),
        ("\\boxed{7} then truncated \\boxed{8", "7"),
        ("She makes 9 * 2 = 18.\n#### 1,234", None),  # strict: a box or nothing
        ("no answer here", None),
        ("\\boxed{}", None),
    ],
)
def test_math_extraction(text, expected):
    assert MATH.extract_answer(text) == expected


def test_last_boxed_prefers_boxed_over_gsm8k_marker():
    assert MATH.extract_answer("#### 3\n\\boxed{4}") == "4"
    assert last_boxed("\\fbox{9}") == "9"


@pytest.mark.parametrize(
    ("gold", "answer"),
    [
        ("0.5", "\\frac{1}{2}"),
        ("\\frac{1}{2}", "0.5"),
        ("1/2", "0.5"),
        ("42", "42.0"),
        ("$42$", "42"),
        ("1234", "1,234"),
        ("3/4", "\\dfrac{3}{4}"),
        ("-4", "-4"),
        ("True", "true"),
    ],
)
def test_math_equivalences(gold, answer):
    assert MATH.score(task(gold), answer) == 1.0


@pytest.mark.parametrize(
    ("gold", "answer"),
    [("42", "43"), ("0.5", "1/3"), ("42", None), ("42", ""), ("listen", "silent"), ("42", "4" * 300)],
)
def test_math_mismatches(gold, answer):
    assert MATH.score(task(gold), answer) == 0.0


@pytest.mark.parametrize(
    "answer",
    [
        "x" * (MAX_ANSWER_CHARS + 1),
        "\\frac{" * 30,
        "10^{10^{10^{10}}}",
        "x^x^x^x^x",
        "10^{100000000}",
        "(100!)!",
    ],
)
def test_math_explosive_or_runaway_answers_score_zero_fast(answer):
    start = time.perf_counter()
    assert MATH.score(task("42"), answer) == 0.0
    assert time.perf_counter() - start < 0.5


def test_math_scores_off_the_main_thread():
    # math-verify's signal-based timeout is unavailable in threads; scoring must still work there.
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(MATH.score, task("0.5"), "\\frac{1}{2}").result() == 1.0
        assert pool.submit(MATH.score, task("x^2+y^2"), "y^2 + x^2").result() == 1.0


def test_off_the_main_thread_math_verify_timeout_advice_stays_off_the_console(monkeypatch, caplog):
    import logging

    import math_verify.grader
    import math_verify.parser

    from marl.tasks.math import _no_timeout_advice

    def score_in_thread() -> list[str]:
        for module in (math_verify.parser, math_verify.grader):  # it warns once per process
            monkeypatch.setattr(module, "TIMEOUT_WARNING_SHOWN", False)
        caplog.clear()
        with caplog.at_level(logging.WARNING), ThreadPoolExecutor(1) as pool:
            assert pool.submit(MATH.score, task("0.5"), "\\frac{1}{2}").result() == 1.0
        return [r.getMessage() for r in caplog.records if r.name.startswith("math_verify")]

    assert score_in_thread() == []
    parser_log = logging.getLogger("math_verify.parser")
    parser_log.removeFilter(_no_timeout_advice)  # without the filter the advice reaches the handlers
    try:
        assert any(m.startswith("Timeout is disabled") for m in score_in_thread())
    finally:
        parser_log.addFilter(_no_timeout_advice)


def test_digit_family():
    digit = DigitFamily()
    assert digit.instruction() == ""
    assert digit.extract_answer("  7 is my answer") == "7"
    assert digit.extract_answer("x-3 then 4") == "3"
    assert digit.extract_answer("seven") is None and digit.extract_answer("") is None
    assert digit.score(Task("d", "Write the digit 7.", "7", kind="digit"), "7") == 1.0
    assert digit.score(Task("d", "Write the digit 7.", "7", kind="digit"), "1") == 0.0
    assert digit.score(Task("d", "Write the digit 7.", "7", kind="digit"), None) == 0.0


def test_get_family():
    assert TASKS.names() == ("math", "digit", "code")
    assert get_family("math").name == "math"
    assert [get_family(name).prompt_kind for name in TASKS] == ["math", "math", "code"]
    assert [TASKS[name].eval_source("") for name in TASKS] == ["gsm8k", "digit", "humaneval"]
    assert TASKS["math"].eval_source("reasoning_gym:chain_sum") == "reasoning_gym:chain_sum"
    from marl.tasks.sandbox.limits import SandboxConfig

    assert get_family("code", sandbox=SandboxConfig(timeout_s=3, workers=1)).pool.limits.timeout_s == 3
    with pytest.raises(ValueError, match=r"data\.task must be one of math, digit, code, or a module path"):
        get_family("chess")


def test_math_last_number_fallback_is_opt_in():
    strict, lenient = MathFamily(), MathFamily("last_number")
    text = "The final answer to the arithmetic problem of 3 + 1 = is 4."
    assert strict.extract_answer(text) is None
    assert lenient.extract_answer(text) == "4"
    assert lenient.extract_answer("so \\boxed{7} and then 9") == "7"  # boxed still wins
    assert lenient.extract_answer("no digits") is None
    # '####' before the last number
    assert lenient.extract_answer("She makes 9 * 2 = 18.\n#### 1,234") == "1234"
    assert lenient.extract_answer("#### 5\nlater\n#### 18.\nThen 3") == "18"
    assert strict.extract_answer("#### 5") is None
    assert get_family("math", "last_number").extract_answer("x = -2.5") == "-2.5"
    with pytest.raises(ValueError, match="data.answer_fallback"):
        MathFamily("first_word")
