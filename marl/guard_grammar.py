"""A guard's grammar (marl/guards.py) through xgrammar: its one EBNF text, the compile check at config load,
and the token masks of one tokenizer, the part both engines and the learner share so that they hold a turn to
the same constraint.

xgrammar is imported lazily, here only. Token masks are xgrammar's bitmasks as numpy int32 arrays ([rows,
ceil(V / 32)], bit j of word i allows token 32·i + j); callers view them as tensors without a copy.

The engines and the learner build their `TokenMasks` from the same tokenizer, vocabulary size (the model's,
which may pad the tokenizer's) and stop tokens (the engine's end tokens, as vLLM overrides xgrammar's stop
tokens with a request's), so the allowed set at each position is the same on every side
(tests/rollout/test_guards.py).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import numpy as np

from marl.guards import FREE_CHARS, Guard


def _message(e: Exception) -> str:
    """xgrammar's error, its first line without the log prefix ('[hh:mm:ss] file.cc:123: ')."""
    return re.sub(r"^\[[^\]]*\]\s*\S+:\d+:\s*", "", str(e).strip().splitlines()[0])


def _xgr() -> Any:
    import xgrammar

    return xgrammar


def grammar_text(guard: Guard) -> str:
    """The guard's whole grammar as one EBNF text (xgrammar's): free text of at most `budget` characters,
    then the format. What vLLM's structured outputs are given (`grammar=`) and what every side compiles.
    Raises ValueError (xgrammar's message) when the format does not parse."""
    xgr = _xgr()
    try:
        if guard.kind == "choice":
            fmt = xgr.Grammar.from_ebnf("root ::= " + " | ".join(json.dumps(c) for c in guard.text))
        elif guard.kind == "regex":
            fmt = xgr.Grammar.from_regex(str(guard.text))
        elif guard.kind == "json_schema":
            fmt = xgr.Grammar.from_json_schema(str(guard.text))
        else:
            fmt = xgr.Grammar.from_ebnf(str(guard.text))
    except Exception as e:  # noqa: BLE001 - xgrammar raises RuntimeError/ValueError subclasses by kind
        raise ValueError(f"the {guard.kind} does not compile: {_message(e)}") from None
    if not guard.budget:
        return str(fmt)
    free = xgr.Grammar.from_ebnf(f"root ::= {FREE_CHARS}{{0,{guard.budget}}}")
    return str(xgr.Grammar.concat(free, fmt))


@functools.lru_cache(maxsize=64)
def _format_only(kind: str, text: str | tuple[str, ...]) -> Any:
    """The format alone, compiled for matching strings (no vocabulary)."""
    xgr = _xgr()
    return xgr.GrammarCompiler(xgr.TokenizerInfo([])).compile_grammar(grammar_text(Guard(kind, text)))


def check_guard(guard: Guard) -> str | None:
    """The compile error of the guard's grammar, or None (compiled with no vocabulary: quick)."""
    try:
        _format_only(guard.kind, guard.text)
    except ValueError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001 - a grammar that parses but does not compile
        return f"the {guard.kind} does not compile: {_message(e)}"
    return None


def at_budget(guard: Guard, text: str) -> bool:
    """Whether the turn's free text used the whole budget: `text` splits into `budget` free characters and a
    whole match of the format."""
    if not guard.budget or len(text) < guard.budget:
        return False
    matcher = _xgr().GrammarMatcher(_format_only(guard.kind, guard.text), terminate_without_stop_token=True)
    return bool(matcher.accept_string(text[guard.budget:]) and matcher.is_completed())


def merged_eos(generation_eos: int | list[int] | None, tokenizer_eos: int | None) -> list[int]:
    """The end tokens a turn stops on: the generation config's, then the tokenizer's if it is not among
    them. Both engines stop on these and the learner's replay ends a guard's grammar on them (TokenMasks),
    so all three read them through this one rule (each reads the generation config where it loads models:
    marl imports no model library)."""
    ids = list(generation_eos) if isinstance(generation_eos, list) else (
        [generation_eos] if generation_eos is not None else [])
    if tokenizer_eos is not None and tokenizer_eos not in ids:
        ids.append(tokenizer_eos)
    return ids


class TokenMasks:
    """The guards' grammars compiled for one tokenizer: `vocab_size` (the model's logits width) and
    `stop_ids` (the end tokens a turn may stop on, allowed where the grammar is complete)."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: list[int]):
        xgr = _xgr()
        self.vocab_size, self.stop_ids = vocab_size, list(stop_ids)
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids)
        self._compiler = xgr.GrammarCompiler(info, cache_enabled=True)
        self.words = (vocab_size + 31) // 32

    def matcher(self, text: str) -> Any:
        """A fresh matcher of the grammar `text` (compiled once per text; xgrammar caches it)."""
        xgr = _xgr()
        return xgr.GrammarMatcher(self._compiler.compile_grammar(text), override_stop_tokens=self.stop_ids)

    def empty(self, rows: int) -> np.ndarray:
        """rows all-allowing bitmask rows [rows, words] int32."""
        return np.full((rows, self.words), -1, dtype=np.int32)

    def fill(self, matcher: Any, out: np.ndarray, row: int) -> None:
        """out[row] = the tokens `matcher` allows next (all of them once it has terminated)."""
        if matcher.is_terminated():
            out[row] = -1
        else:
            matcher.fill_next_token_bitmask(out, row)

    def replay(self, text: str, tokens: list[int]) -> np.ndarray:
        """The mask before each of `tokens` (a guarded turn's response): [len(tokens), words] int32. Raises
        ValueError at the first token the grammar does not allow (a turn that was not sampled under it)."""
        matcher, out = self.matcher(text), self.empty(len(tokens))
        for i, token in enumerate(tokens):
            self.fill(matcher, out, i)
            if not matcher.accept_token(token):
                raise ValueError(f"token {token} at response position {i} is not allowed by the role's guard")
        return out


def unpack(bits: np.ndarray, vocab_size: int) -> np.ndarray:
    """bits [rows, words] int32 -> allowed [rows, vocab_size] bool."""
    flat = np.unpackbits(np.ascontiguousarray(bits).view(np.uint8), axis=-1, bitorder="little")
    return flat[:, :vocab_size].astype(bool)
