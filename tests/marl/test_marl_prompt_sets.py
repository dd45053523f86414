"""Prompt sets as data: the built-in sets' messages, loading and validation of a set file, the importer."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from prompt_cases import FIXTURE, all_messages

from marl.prompts import load_prompt_set
from marl.prompts.authors import main as authors_main
from marl.workflows import check_prompts


def test_builtin_sets_send_the_recorded_messages_byte_for_byte():
    """default and paper send, in every built-in workflow and task kind, the messages recorded before the
    wordings moved from code into prompt files."""
    recorded = json.loads(FIXTURE.read_text())
    now = all_messages()
    assert sorted(now) == sorted(recorded)
    for case, turns in recorded.items():
        assert now[case] == turns, case


def _run(workflow: str, prompts: str, replies: dict, family=None, **opts):
    from marl_scripted import ScriptedClient

    from marl.tasks import MathFamily
    from marl.types import Task
    from marl.workflows import get_workflow
    from marl.workflows.common import WorkflowOptions

    task = Task(task_id="t0", prompt="What is 6 * 7?", answer="42")
    options = WorkflowOptions(prompts=prompts, **opts)
    client = ScriptedClient(replies)
    return asyncio.run(get_workflow(workflow).run(task, client, family or MathFamily(), options, 0))


def test_fewshot_gives_each_coordinating_role_two_worked_examples_with_varied_answers():
    paper, fewshot = load_prompt_set("paper"), load_prompt_set("fewshot")
    coordinating = {"voting": "aggregator", "eval_opt": "evaluator", "orch_workers": "orchestrator"}
    for kind in ("math", "code"):
        for workflow, kinds in fewshot.workflows.items():
            for role, entry in kinds[kind].roles.items():
                if coordinating.get(workflow) == role:
                    assert len(entry.examples) == 2, (workflow, kind, role)
                    assert len({answer for _, answer in entry.examples}) == 2  # not always the same reply
                else:  # answering roles keep paper's wording
                    assert entry == paper.workflows[workflow][kind].roles[role], (workflow, kind, role)
    choices = [a for _, a in fewshot.wording("voting", "math").role("aggregator").examples]
    assert choices == ["\\boxed{2}", "\\boxed{3}"]


def test_worked_examples_are_prior_turns_and_the_aggregator_is_asked_for_its_choice_alone():
    gens = {f"generator{i}": f"It is \\boxed{{{40 + i}}}." for i in range(3)}
    ep = _run("voting", "fewshot", {**gens, "aggregator": "\\boxed{3}"})
    agg = ep.turns[3].messages
    assert [m["role"] for m in agg] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert agg[2]["content"] == "\\boxed{2}" and agg[4]["content"] == "\\boxed{3}"
    assert agg[-1]["content"].endswith("--- Solution 3 ---\nIt is \\boxed{42}.\n\nWhich solution is correct? "
                                       "Reply with only \\boxed{1}, \\boxed{2} or \\boxed{3}.")
    assert ep.final_answer == "42" and ep.parse_failures == {}
    assert [m["role"] for m in ep.turns[0].messages] == ["system", "user"]  # generators: paper's, no examples
    two = _run("voting", "fewshot", {"generator0": "1", "generator1": "2", "aggregator": "\\boxed{2}"},
               num_generators=2)
    assert two.turns[2].messages[-1]["content"].endswith("Reply with only \\boxed{1} or \\boxed{2}.")


def test_eval_opt_fewshot_examples_precede_the_shared_conversation():
    ep = _run("eval_opt", "fewshot", {"generator": "\\boxed{42}", "evaluator": "\\boxed{Correct}"})
    ev = ep.turns[1].messages
    assert [m["role"] for m in ev] == ["system", *["user", "assistant"] * 3, "user"]
    assert ev[5]["content"].startswith("What is 6 * 7?") and ev[6]["content"] == "\\boxed{42}"


def _write(tmp_path, text: str, name: str = "my_prompts.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


VOTING_OK = """workflows:
  voting:
    any:
      generator: {system: Solve it., user: "{problem}"}
      aggregator: {system: Pick one., user: "{problem} {responses} {choices}", response: "#{i}: {text}"}
"""


def test_a_users_file_is_a_prompt_set(tmp_path):
    path = _write(tmp_path, VOTING_OK)
    check_prompts(path, "voting")
    ep = _run("voting", path, {"generator0": "a", "generator1": "b", "generator2": "c",
                               "aggregator": "\\boxed{1}"})
    asked = "What is 6 * 7? #1: a\n\n#2: b\n\n#3: c \\boxed{1}, \\boxed{2} or \\boxed{3}"
    assert ep.turns[3].messages == [{"role": "system", "content": "Pick one."},
                                    {"role": "user", "content": asked}]
    assert load_prompt_set(path).digest != load_prompt_set("default").digest


@pytest.mark.parametrize(("edit", "problem"), [
    (("      generator: {system: Solve it., user: \"{problem}\"}\n", ""),
     r"voting\.any: missing role 'generator'"),
    (("{problem} {responses}", "{problem} {answer}"), r"voting\.any\.aggregator\.user: unknown placeholder "
                                                        r"\{answer\}"),
    (("#{i}: {text}", "#{i: {text}"), r"voting\.any\.aggregator\.response: does not format"),
    (("#{i}: {text}", "#{i:d}: {text}"), r"voting\.any\.aggregator\.response: does not format"),
    ((", response: \"#{i}: {text}\"", ""), r"voting\.any\.aggregator: missing template 'response'"),
    (("      aggregator:", "      judge: {system: x, user: y}\n      aggregator:"),
     r"voting\.any\.judge: the workflow has no role 'judge'"),
    (("Solve it., user", "Solve it., users"), r"voting\.any\.generator: unknown template 'users'"),
    (("any:", "maths:"), r"voting: unknown keys \['maths'\]"),
])
def test_a_bad_file_is_a_config_error_naming_file_role_and_problem(tmp_path, edit, problem):
    from jobs.config import ConfigError, load_config

    path = _write(tmp_path, VOTING_OK.replace(*edit))
    where = re.escape(path)
    with pytest.raises(ConfigError, match=rf"config: marl\.prompts={where}: {where}: {problem}"):
        load_config("jobs/configs/tiny.yaml", [f"marl.prompts={path}", "marl.workflow=voting"])


def test_a_set_without_the_runs_workflow_is_refused(tmp_path):
    path = _write(tmp_path, VOTING_OK)
    with pytest.raises(ValueError, match=r"has no wording for workflow 'eval_opt' \(it has voting\)"):
        check_prompts(path, "eval_opt")


def test_the_authors_prompt_files_are_imported(tmp_path):
    """A fixture in the layout of the paper's released prompt.json (placeholder texts): single user messages,
    their own answer instructions, {max_subtasks} and {solutions} under this project's names."""
    fixture = str(FIXTURE.parent / "authors_prompt.json")
    for workflow in ("single_agent", "voting", "eval_opt", "orch_workers"):
        check_prompts(fixture, workflow)
    gens = {f"generator{i}": f"g{i}" for i in range(3)}
    vote = _run("voting", fixture, {**gens, "aggregator": "\\boxed{2}"})
    # no system message, and no second answer instruction: theirs is in the text
    asked = "FIXTURE voting generator. Box the answer as \\boxed{}.\n\nProblem: What is 6 * 7?"
    assert vote.turns[0].messages == [{"role": "user", "content": asked}]
    assert vote.turns[3].messages[0]["content"] == (
        "FIXTURE aggregator.\n\nProblem: What is 6 * 7?\n\nSolutions:\n\n--- Solution 1 ---\ng0\n\n"
        "--- Solution 2 ---\ng1\n\n--- Solution 3 ---\ng2\n\nAnswer \\boxed{N}.")
    verdicts = ["\\boxed{Incorrect}", "\\boxed{Correct}"]
    evo = _run("eval_opt", fixture, {"generator": ["x", "y"], "evaluator": verdicts})
    assert [m["content"] for m in evo.turns[3].messages][-3:] == [
        "FIXTURE refinement, answer in \\boxed{}.", "y",
        "FIXTURE review of the solution above: \\boxed{Correct} or \\boxed{Incorrect}."]  # shared history
    plan = _run("orch_workers", fixture, {"orchestrator": "STRATEGY 1: multiply", "worker0": "42",
                                          "synthesizer": "\\boxed{42}"})
    assert plan.turns[0].messages[0]["content"] == "FIXTURE plan at most 3 strategies for: What is 6 * 7?"
    out = tmp_path / "imported.yaml"
    authors_main([fixture, "-o", str(out)])
    assert load_prompt_set(str(out)).digest == load_prompt_set(fixture).digest


def test_a_user_workflow_reads_its_wording_from_the_set_or_its_own_file(tmp_path):
    from examples import debate

    check_prompts("default", "examples/debate.py")  # default has no debate section: debate.yaml is read
    own = load_prompt_set(debate.PROMPT_FILE).wording("debate", "math").role("judge")
    text = Path(debate.PROMPT_FILE).read_text().replace("You judge a debate", "You referee a debate")
    path = _write(tmp_path, text)
    check_prompts(path, "examples/debate.py")
    replies = {"debater0": "\\boxed{41}", "debater1": "\\boxed{42}", "judge": "\\boxed{2}"}
    ep = _run("examples/debate.py", path, replies, max_rounds=1)
    assert ep.turns[-1].messages[0]["content"] == own.system.replace("You judge", "You referee")
    bad = _write(tmp_path, text.replace("{other}", "{others}"), "bad.yaml")
    with pytest.raises(ValueError, match=r"debate\.any\.debater\.revise: unknown placeholder \{others\}"):
        check_prompts(bad, "examples/debate.py")
