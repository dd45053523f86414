"""What every workflow shares: WorkflowOptions, message builders, one-turn calls and output parsers.

Parsers return None (or an empty list) when the output does not follow the format; each workflow
decides its fallback and records the parse failure on the Episode.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from dataclasses import dataclass

from marl.tasks.base import TaskFamily
from marl.tasks.math import last_boxed
from marl.types import Episode, Message, PolicyClient, Turn


@dataclass(frozen=True)
class WorkflowOptions:
    """Workflow shape knobs (the `marl.*` config keys)."""

    num_generators: int = 3  # voting: K parallel generators
    max_rounds: int = 3  # eval_opt: at most R generator turns
    max_strategies: int = 3  # orch_workers: more strategies than this ends the episode

    def __post_init__(self) -> None:
        for name in ("num_generators", "max_rounds", "max_strategies"):
            if getattr(self, name) < 1:
                raise ValueError(f"marl.{name} must be >= 1, got {getattr(self, name)}")


def system(content: str) -> Message:
    return {"role": "system", "content": content}


def user(content: str) -> Message:
    return {"role": "user", "content": content}


def assistant(content: str) -> Message:
    return {"role": "assistant", "content": content}


def with_instruction(text: str, instruction: str) -> str:
    """Append the family's answer-format instruction, if it has one."""
    return f"{text}\n\n{instruction}" if instruction else text


async def ask(client: PolicyClient, role: str, agent: str, round_: int, messages: list[Message]) -> Turn:
    """One turn. The Turn keeps its own copy of `messages`, so later history edits don't rewrite it."""
    snapshot = [dict(m) for m in messages]
    completion = await client.complete(role, agent, snapshot)
    return Turn(role=role, agent=agent, round=round_, messages=snapshot, completion=completion)


async def ask_all(
    client: PolicyClient, role: str, agents: Sequence[str], prompts: Sequence[list[Message]]
) -> list[Turn]:
    """Parallel turns of one role (round 0), returned in agent order whatever order they finish in."""
    calls = (ask(client, role, a, 0, p) for a, p in zip(agents, prompts, strict=True))
    return list(await asyncio.gather(*calls))


def set_final_answer(episode: Episode, family: TaskFamily, turn: Turn) -> None:
    """The episode's final answer is the family's reading of `turn`; its role is recorded (score_info
    'answer_role') so task metrics such as code timeouts can be reported per role."""
    episode.final_answer = family.extract_answer(turn.text)
    episode.score_info["answer_role"] = turn.role


def parse_verdict(text: str) -> bool | None:
    """True for a last \\boxed{Correct}, False for \\boxed{Incorrect} (case-insensitive), else None."""
    boxed = last_boxed(text)
    if boxed is None:
        return None
    word = re.sub(r"\\text\{([^}]*)\}", r"\1", boxed).strip().strip(".").strip().lower()
    return {"correct": True, "incorrect": False}.get(word)


def parse_choice(text: str, k: int) -> int | None:
    """The 1-based index in the last \\boxed{} ('2', 'Response 2'), if it lies in 1..k."""
    boxed = last_boxed(text)
    if boxed is None:
        return None
    match = re.fullmatch(r"(?:response|solution)?\s*#?\s*(\d+)\s*\.?", boxed.strip(), re.IGNORECASE)
    if match and 1 <= int(match.group(1)) <= k:
        return int(match.group(1))
    return None


def first_number_in_range(text: str, k: int) -> int | None:
    """The first standalone integer in `text` that lies in 1..k (so '12' never reads as 1)."""
    for match in re.finditer(r"(?<!\d)\d+(?!\d)", text):
        if 1 <= int(match.group()) <= k:
            return int(match.group())
    return None


_STRATEGY = re.compile(r"^[\s>*#_\-]*strategy\s*#?\s*\d+\s*[*_]*\s*[:.)\-]\s*[*_]*\s*(.*)$", re.IGNORECASE)


def parse_strategies(text: str) -> list[str]:
    """Strategies written as 'STRATEGY k: ...' lines (any case, markdown emphasis allowed).

    A strategy's text is its header line's remainder plus following lines up to a blank line
    or the next header; headers with no text are dropped.
    """
    strategies: list[list[str]] = []
    open_ = False
    for line in text.splitlines():
        match = _STRATEGY.match(line)
        if match:
            strategies.append([match.group(1).strip()])
            open_ = True
        elif not line.strip():
            open_ = False
        elif open_:
            strategies[-1].append(line.strip())
    joined = (" ".join(part for part in s if part).strip() for s in strategies)
    return [s for s in joined if s]
