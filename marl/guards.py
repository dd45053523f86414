"""Output guards: the format a role's turns are held to while they are sampled (`marl.guards.<role>`).

A guard is free text of at most `budget` characters followed by a format: one of a list of strings (choice),
a regular expression (regex), an EBNF grammar in xgrammar's syntax (ebnf) or a JSON schema (json_schema).
The free text is printable ASCII, newlines and tabs: one byte each, so a token of it holds at least one
character and the free part takes at most `budget` tokens; a role whose response cap holds the budget, the
format's longest text and the end token therefore always ends in the format (checked at config load where
the format's length is known).

Both engines sample through the same compiled grammar, and the learner replays it over the sampled tokens
(marl/guard_grammar.py compiles it; learners/compute/guard_masks.py replays it), so the log-probs, entropy and
PPO ratio are those of the distribution the tokens were drawn from. A workflow declares the guards of its
coordinating roles as `guards(opts) -> {role: Guard}` beside its options; `marl.guards.<role>: builtin` turns
one on, `{budget: N}` changes its budget, `{kind, text | choices, budget}` writes one.

This module is pure (no xgrammar): the spec, the config's reading of it, and the metrics of guarded turns.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from marl.types import Episode

GUARD_KINDS: tuple[str, ...] = ("choice", "regex", "ebnf", "json_schema")
# The free text's characters, as an xgrammar character class: printable ASCII, newline and tab.
FREE_CHARS = r"[ -~\n\t]"


@dataclass(frozen=True)
class Guard:
    """Free text of at most `budget` characters, then the format `kind`/`text` (choice: `text` holds the
    strings). `format_chars`: the longest text the format matches when known (choice: computed), 0 when
    unknown; the config check of the role's response cap reads it."""

    kind: str
    text: str | tuple[str, ...]
    budget: int = 0
    format_chars: int = 0

    def longest(self) -> int:
        """The format's longest text in characters (0: unknown)."""
        if self.kind == "choice":
            return max(len(c) for c in self.text)
        return self.format_chars


def boxed_choices(words: list[str]) -> tuple[str, ...]:
    """`\\boxed{w}` for each word."""
    return tuple(f"\\boxed{{{w}}}" for w in words)


def guard_problem(guard: Guard) -> str | None:
    """What is wrong with the spec itself (not its grammar), or None."""
    if guard.kind not in GUARD_KINDS:
        return f"kind must be one of {', '.join(GUARD_KINDS)}; got {guard.kind!r}"
    if guard.kind == "choice":
        if not isinstance(guard.text, tuple) or not guard.text:
            return "choices must be a non-empty list of strings"
        if not all(isinstance(c, str) and c for c in guard.text):
            return f"choices must be non-empty strings; got {list(guard.text)!r}"
    elif not isinstance(guard.text, str) or not guard.text.strip():
        return f"text must hold the {guard.kind} (a non-empty string)"
    if not isinstance(guard.budget, int) or isinstance(guard.budget, bool) or guard.budget < 0:
        return f"budget must be an integer >= 0; got {guard.budget!r}"
    return None


def read_guards(values: Mapping[str, Any], roles: tuple[str, ...],
                builtin: Callable[[], Mapping[str, Guard]], workflow: str) -> dict[str, Guard]:
    """The run's guards from `marl.guards` (`values`: role -> `builtin`, `{budget: N}` or `{kind, text |
    choices, budget}`), `builtin()` giving the workflow's own. Raises ValueError naming `marl.guards.<role>`
    (and the field) for a role the workflow does not have, a role with no built-in guard asked for one, or a
    malformed spec. Grammars are compiled separately (marl.guard_grammar.check_guards)."""
    out: dict[str, Guard] = {}
    for role, value in values.items():
        key = f"marl.guards.{role}"
        if role not in roles:
            raise ValueError(f"{key}: {workflow} has no role {role!r}; its roles: {', '.join(roles)}")
        guard = _one(key, value, functools.partial(_builtin_of, builtin, role), workflow)
        problem = guard_problem(guard)
        if problem:
            raise ValueError(f"{key}: {problem}")
        out[role] = guard
    return out


def _builtin_of(builtin: Callable[[], Mapping[str, Guard]], role: str) -> Guard | None:
    return builtin().get(role)


def _one(key: str, value: Any, builtin: Callable[[], Guard | None], workflow: str) -> Guard:
    if isinstance(value, str) and value == "builtin" or isinstance(value, Mapping) and "kind" not in value:
        own = builtin()
        if own is None:
            raise ValueError(f"{key}: {workflow} declares no built-in guard for this role; "
                             "write one as {kind, text | choices, budget}")
        extra = set(value) - {"budget"} if isinstance(value, Mapping) else set()
        if extra:
            raise ValueError(f"{key}.{sorted(extra)[0]}: a built-in guard takes only budget")
        budget = value.get("budget", own.budget) if isinstance(value, Mapping) else own.budget
        return Guard(own.kind, own.text, budget, own.format_chars)
    if not isinstance(value, Mapping):
        raise ValueError(f"{key} must be builtin, {{budget: N}} or {{kind, text | choices, budget}}; "
                         f"got {value!r}")
    unknown = set(value) - {"kind", "text", "choices", "budget"}
    if unknown:
        raise ValueError(f"{key}.{sorted(unknown)[0]}: unknown field (kind, text, choices, budget)")
    kind = value["kind"]
    if kind == "choice":
        choices = value.get("choices", value.get("text"))
        if isinstance(choices, str) or choices is None:
            raise ValueError(f"{key}.choices must be a non-empty list of strings; got {choices!r}")
        return Guard("choice", tuple(choices), value.get("budget", 0))
    return Guard(str(kind), value.get("text", ""), value.get("budget", 0))


def cap_problem(role: str, guard: Guard, cap: int) -> str | None:
    """Whether the response cap `cap` (tokens) holds the free budget, the format's longest text and the end
    token, so a guarded turn cannot be cut before its format ends (unknown format lengths are not checked)."""
    need = guard.budget + guard.longest() + 1
    if guard.longest() and cap < need:
        return (f"marl.guards.{role}.budget={guard.budget}: the role's response cap of {cap} tokens cannot "
                f"hold it, the format's {guard.longest()} characters and the end token ({need}); lower the "
                f"budget or raise rollout.role_max_new_tokens.{role}")
    return None


def guard_metrics(episodes: list[Episode], guards: Mapping[str, Guard],
                  at_budget: Callable[[Guard, str], bool]) -> dict[str, float]:
    """Per guarded role: guard/turns/<role> (turns sampled under its guard), guard/at_budget/<role> (the share
    of them whose free text used the whole budget, `at_budget` deciding; guards with a budget only) and
    guard/parse_rate/<role> (the share of turns the workflow parsed: 1 by construction)."""
    out: dict[str, float] = {}
    for role, guard in guards.items():
        texts = [t.text for e in episodes for t in e.turns if t.role == role]
        failures = sum(e.parse_failures.get(role, 0) for e in episodes)
        out[f"guard/turns/{role}"] = float(len(texts))
        out[f"guard/parse_rate/{role}"] = 1.0 - failures / len(texts) if texts else float("nan")
        if guard.budget:
            hits = sum(at_budget(guard, text) for text in texts)
            out[f"guard/at_budget/{role}"] = hits / len(texts) if texts else float("nan")
    return out
