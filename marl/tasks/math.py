"""The math family: answers in the last \\boxed{...} (strict; the lenient fallback also reads GSM8K's '####
N', then the last number), checked by math-verify.

Scoring is 1/0. math-verify compares values, so '\\frac{1}{2}' matches '0.5' and '42' matches '42.0'.
It is imported lazily so `import marl` stays light.
"""

from __future__ import annotations

import logging
import re
import threading
from enum import StrEnum

from marl.types import Task

# Longer "answers" are nearly always runaway text; math-verify can spend seconds on them.
MAX_ANSWER_CHARS = 200
# math-verify's timeout uses signal.alarm, which only works on the main thread; elsewhere it runs
# unbounded, so _looks_explosive screens out the inputs sympy would spend minutes evaluating.
VERIFY_TIMEOUT_S = 2

_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_GSM8K = re.compile(r"####\s*([^\n]+)")
_PLAIN_WORDS = re.compile(r"[A-Za-z][A-Za-z\s'\-]*")
# Power towers (10^{10^{10}}), huge literal exponents, huge or repeated factorials.
_EXPLOSIVE = re.compile(r"\^\s*\{[^{}]*\^|\^\s*[\w.]+\s*\^|\^\s*\{?\s*\d{7,}|\d{6,}\s*!|[)!}]\s*!")


def boxed_contents(text: str) -> list[str]:
    """Contents of every complete \\boxed{...} in order; nested braces are kept, unclosed ones dropped."""
    found: list[str] = []
    for match in _BOX_OPEN.finditer(text):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    found.append(text[start:i].strip())
                    break
    return found


def last_boxed(text: str) -> str | None:
    """The content of the last complete \\boxed{...}, or None."""
    contents = boxed_contents(text)
    return contents[-1] if contents else None


def gsm8k_answer(text: str) -> str | None:
    """The value after the last '#### ' marker, commas and a trailing period removed, or None."""
    matches = _GSM8K.findall(text)
    if not matches:
        return None
    value = matches[-1].strip().replace(",", "").rstrip(".").strip()
    return value or None


def _unwrap(answer: str) -> str:
    """Strip whitespace and one pair of surrounding $ or $$ delimiters."""
    s = answer.strip()
    for fence in ("$$", "$"):
        if len(s) > 2 * len(fence) and s.startswith(fence) and s.endswith(fence):
            return s[len(fence) : -len(fence)].strip()
    return s


def _looks_explosive(answer: str) -> bool:
    """True for text sympy could take unbounded time on, or with unbalanced brackets (never an answer)."""
    opened = sum(answer.count(c) for c in "([{")
    closed = sum(answer.count(c) for c in ")]}")
    return opened != closed or bool(_EXPLOSIVE.search(answer))


def _no_timeout_advice(record: logging.LogRecord) -> bool:
    """Drops math-verify's one-time "Timeout is disabled" warning: off the main thread there is no timeout to
    give it, and _looks_explosive is the bound it advises, so the line only reached every run's console."""
    return not record.getMessage().startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_no_timeout_advice)


def _verify(gold: str, answer: str) -> bool:
    from math_verify import parse, verify

    timeout = VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    try:
        # Wrapping both sides in \boxed{} makes math-verify read them as LaTeX answers
        # ('\dfrac{3}{4}', '2\sqrt{3}', '\$18' all parse this way, not all parse bare).
        parsed_gold = parse(f"\\boxed{{{gold}}}", parsing_timeout=timeout)
        parsed_answer = parse(f"\\boxed{{{answer}}}", parsing_timeout=timeout)
        if not parsed_gold or not parsed_answer:
            return False
        return bool(verify(parsed_gold, parsed_answer, timeout_seconds=timeout))
    except Exception:  # math-verify and sympy raise many types on odd input; that answer is wrong
        return False


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def last_number(text: str) -> str | None:
    """The last integer or decimal in `text` ('... 3 + 1 = is 4.' → '4')."""
    found = _NUMBER.findall(text)
    return found[-1] if found else None


ANSWER_FALLBACKS = ("none", "last_number")


class AnswerFallback(StrEnum):
    """`data.answer_fallback`: the names of ANSWER_FALLBACKS (the config schema's type for the key)."""

    none = "none"
    last_number = "last_number"


class MathFamily:
    """Extraction: the last \\boxed{...}. fallback='none' (strict, as the paper grades: no box scores 0) stops
    there; fallback='last_number' then reads GSM8K's '#### N', else the last number in the text, a lenient
    rule that gives small models that ignore the format a reward signal. Scoring: math-verify equivalence."""

    name = "math"
    prompt_kind = "math"

    def __init__(self, fallback: str = "none"):
        if fallback not in ANSWER_FALLBACKS:
            raise ValueError(f"data.answer_fallback must be one of {ANSWER_FALLBACKS}, got {fallback!r}")
        self.fallback = fallback

    def instruction(self) -> str:
        return "Put your final answer in \\boxed{}."

    def extract_answer(self, text: str) -> str | None:
        boxed = last_boxed(text)
        if boxed or self.fallback == "none":
            return boxed or None
        return gsm8k_answer(text) or last_number(text)

    def score(self, task: Task, answer: str | None) -> float:
        if answer is None:
            return 0.0
        pred, gold = _unwrap(answer), _unwrap(task.answer)
        if not pred or len(pred) > MAX_ANSWER_CHARS:
            return 0.0
        if " ".join(pred.split()).lower() == " ".join(gold.split()).lower():
            return 1.0
        # math-verify reads words as products of symbols, so 'listen' would equal 'silent';
        # word answers are therefore compared as text only.
        if (len(gold) > 1 and _PLAIN_WORDS.fullmatch(gold)) or _looks_explosive(pred):
            return 0.0
        return 1.0 if _verify(gold, pred) else 0.0
