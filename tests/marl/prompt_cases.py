"""Every message each built-in workflow sends, under each built-in prompt set and task kind, from scripted
runs that reach every branch of the workflows' wording (eval_opt's first review, later reviews and revisions;
voting's numbered responses; orch_workers' plan, workers and synthesis). `data/prompt_messages.json` holds
these messages as the workflows wrote them before the wordings moved into prompt files;
test_marl_prompt_sets.py holds every later version byte-identical to it.

Regenerate (only when a wording is meant to change): python -m tests.marl.prompt_cases --write
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from marl.tasks import MathFamily
from marl.tasks.base import TaskFamily
from marl.tasks.code import CodeFamily
from marl.tasks.digit import DigitFamily
from marl.types import Task
from marl.workflows import get_workflow
from marl.workflows.common import WorkflowOptions

sys.path.insert(0, str(Path(__file__).parent))
from marl_scripted import ScriptedClient  # noqa: E402

FIXTURE = Path(__file__).parent / "data" / "prompt_messages.json"
SETS = ("default", "paper")
TASK = Task(task_id="t0", prompt="What is 6 * 7?", answer="42", meta={"style": "stdio", "cases": []})
FAMILIES: dict[str, TaskFamily] = {"math": MathFamily(), "code": CodeFamily(), "digit": DigitFamily()}
REPLIES: dict[str, dict[str, Any]] = {
    "single_agent": {"solver": "6 * 7 = 42. \\boxed{42}"},
    "voting": {"generator0": "It is 41.", "generator1": "It is \\boxed{42}.", "generator2": "43",
               "aggregator": "\\boxed{2}"},
    "eval_opt": {"generator": ["First try: 40.", "Second try: 41.", "Third try: \\boxed{42}."],
                 "evaluator": ["Wrong sum. \\boxed{Incorrect}", "Still wrong. \\boxed{Incorrect}",
                               "\\boxed{Correct}"]},
    "orch_workers": {"orchestrator": "STRATEGY 1: multiply directly.\nSTRATEGY 2: add 6 seven times.",
                     "worker0": "6 * 7 = 42", "worker1": "6+6+6+6+6+6+6 = 42", "synthesizer": "\\boxed{42}"},
}


def turns_of(workflow: str, prompts: str, family: TaskFamily) -> list[dict[str, Any]]:
    """Each turn's role, agent, round and messages, in the episode's order."""
    client = ScriptedClient(REPLIES[workflow])
    opts = WorkflowOptions(prompts=prompts)
    episode = asyncio.run(get_workflow(workflow).run(TASK, client, family, opts, 0))
    return [{"role": t.role, "agent": t.agent, "round": t.round, "messages": t.messages}
            for t in episode.turns]


def all_messages(sets: tuple[str, ...] = SETS) -> dict[str, list[dict[str, Any]]]:
    """'<workflow>/<set>/<family>' -> its turns, for every built-in workflow, set and family."""
    return {f"{w}/{s}/{f}": turns_of(w, s, family)
            for w in REPLIES for s in sets for f, family in FAMILIES.items()}


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.marl.prompt_cases --write")
    FIXTURE.write_text(json.dumps(all_messages(), indent=1, ensure_ascii=False, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}")
