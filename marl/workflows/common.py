"""What every workflow shares: its options (WorkflowOptions, from marl/workflows/options.py), message
builders, one-turn calls and output parsers.

Parsers return None (or an empty list) when the output does not follow the format; each workflow
decides its fallback and records the parse failure on the Episode.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

from marl.prompts import BUILTIN_SETS, WorkflowWording, load_prompt_set
from marl.tasks.base import TaskFamily
from marl.tasks.math import last_boxed
from marl.types import Episode, Message, PolicyClient, Turn
from marl.workflows.options import WorkflowOptions as WorkflowOptions  # what every workflow reads

# The built-in prompt sets (marl/prompts/*.yaml); `marl.prompts` also takes a path to a user's file. default:
# this project's own wording; paper: the wording of "When Does Multi-Agent RL Improve LLM Workflows?" (arXiv
# 2605.24202), where it differs: eval_opt's wording and shared history, and code wordings on code tasks;
# fewshot: paper's, with two worked examples of the output format for each coordinating role.
PROMPT_SETS: tuple[str, ...] = BUILTIN_SETS


def wording(
    opts: WorkflowOptions, workflow: str, family: TaskFamily, own_file: str | None = None
) -> WorkflowWording:
    """The wording of `workflow` for the family's kind in the set `marl.prompts` names; a workflow the set
    does not name reads its own prompt file `own_file` (a user workflow's default wording), if it has one."""
    prompt_set = load_prompt_set(opts.prompts)
    if own_file is not None and workflow not in prompt_set.workflows:
        prompt_set = load_prompt_set(own_file)
    return prompt_set.wording(workflow, family.prompt_kind)


def system(content: str) -> Message:
    return {"role": "system", "content": content}


def user(content: str) -> Message:
    return {"role": "user", "content": content}


def assistant(content: str) -> Message:
    return {"role": "assistant", "content": content}


def with_instruction(text: str, instruction: str) -> str:
    """Append the family's answer-format instruction, if it has one."""
    return f"{text}\n\n{instruction}" if instruction else text


def asking(w: WorkflowWording, text: str, instruction: str) -> str:
    """A message that asks for an answer: the family's instruction appended, unless the set writes its own."""
    return with_instruction(text, instruction) if w.append_instruction else text


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
# '1. ...' or '1) ...' (markdown emphasis around the number allowed); '3.5 apples' is not an item.
_NUMBERED = re.compile(r"^[\s>*#_]*\d+[.)][*_]*(?:\s+|$)(.*)$")


def _items(text: str, header: re.Pattern[str]) -> list[str]:
    """Items introduced by lines matching `header` (its group 1 is the item's start).

    An item's text is its header line's remainder plus following lines up to a blank line or the
    next header; items with no text are dropped.
    """
    items: list[list[str]] = []
    open_ = False
    for line in text.splitlines():
        match = header.match(line)
        if match:
            items.append([match.group(1).strip()])
            open_ = True
        elif not line.strip():
            open_ = False
        elif open_:
            items[-1].append(line.strip())
    joined = (" ".join(part for part in s if part).strip() for s in items)
    return [s for s in joined if s]


def parse_plan(text: str) -> tuple[list[str], str]:
    """An orchestrator's strategies and the format they were read in, falling back as the paper's parser does:
    'STRATEGY k:' lines ('strategy'), else a numbered list of '1.' / '1)' lines ('numbered'), else every
    non-empty line ('lines'). Only a blank plan gives ([], 'none')."""
    for name, header in (("strategy", _STRATEGY), ("numbered", _NUMBERED)):
        found = _items(text, header)
        if found:
            return found, name
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines, "lines" if lines else "none"
