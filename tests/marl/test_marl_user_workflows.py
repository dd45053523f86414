"""Workflows from the user's own module: loaded by dotted or file path, checked against the Workflow protocol
(every problem names the module and what is wrong), and examples/debate.py run on a scripted client."""

from __future__ import annotations

import asyncio
import sys
import textwrap

import pytest
from marl_scripted import ScriptedClient

from marl.episode import run_episode
from marl.tasks import MathFamily
from marl.types import Task
from marl.workflows import WorkflowSettings, get_workflow, roles_of, slot_roles, workflow_options
from marl.workflows.common import WorkflowOptions

TASK = Task(task_id="t0", prompt="What is 6 * 7?", answer="42")
GOOD = """
from marl.types import Episode
ROLES = ("solver",)
def agents(opts):
    return ["solver"]
async def run(task, client, family, opts, sample_index):
    return Episode(task=task, sample_index=sample_index, workflow="mine")
"""


def _write(tmp_path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_file_and_dotted_paths_load_the_same_module():
    by_file, by_name = get_workflow("examples/debate.py"), get_workflow("examples.debate")
    assert by_file.ROLES == by_name.ROLES == ("debater", "judge")
    assert roles_of("examples/debate.py") == ("debater", "judge")
    assert slot_roles("examples.debate") == ("debater",)


def test_relative_file_path_is_found_on_sys_path(tmp_path, monkeypatch):
    """A Ray worker runs elsewhere than the job's working_dir, which is on its sys.path."""
    (tmp_path / "wf").mkdir()
    _write(tmp_path / "wf", "mine", GOOD)
    monkeypatch.chdir("/")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    assert get_workflow("wf/mine.py").ROLES == ("solver",)


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (GOOD.replace('ROLES = ("solver",)', ""), "has no ROLES"),
        (GOOD.replace('ROLES = ("solver",)', 'ROLES = "solver"'), "ROLES must be a non-empty tuple"),
        (GOOD.replace("def agents(opts):\n    return", "AGENTS ="), "has no function agents()"),
        (GOOD.replace("async def run", "def run"), "run() must be async"),
        (
            GOOD.replace("family, opts, sample_index", "family"),
            "must take (task, client, family, opts, sample_index)",
        ),
        (
            GOOD.replace('return ["solver"]', 'return ["solver", "critic0"]'),
            "['critic0'], whose roles are not in ROLES",
        ),
        (GOOD + 'SLOT_ROLES = ("critic",)\n', "SLOT_ROLES names ['critic']"),
        (
            GOOD.replace('return ["solver"]', "return 1 / 0"),
            "agents(WorkflowOptions()) raised ZeroDivisionError",
        ),
        ("import no_such_package\n", "raised while being imported: ModuleNotFoundError"),
    ],
)
def test_protocol_problems_name_the_module_and_the_problem(tmp_path, body, problem):
    path = _write(tmp_path, "broken", body)
    with pytest.raises(ValueError, match="marl.workflow") as e:
        get_workflow(path)
    assert problem in str(e.value) and "broken.py" in str(e.value)


def test_unknown_name_lists_the_choices():
    with pytest.raises(ValueError, match="single_agent, eval_opt, voting, orch_workers, a module path") as e:
        get_workflow("no_such_pkg.debate")
    assert "no_such_pkg" in str(e.value)


def _debate(judge: str, rounds: int = 2):
    client = ScriptedClient({"debater0": ["\\boxed{41}", "\\boxed{42}", "\\boxed{42}"],
                             "debater1": ["\\boxed{7}", "\\boxed{7}", "\\boxed{8}"], "judge": judge})
    opts = WorkflowOptions(max_rounds=rounds)
    return asyncio.run(run_episode("examples/debate.py", TASK, client, MathFamily(), opts, 0)), client


def test_debaters_read_each_other_and_revise_then_the_judge_picks():
    ep, client = _debate("Debater 1 is right: \\boxed{1}")
    assert ep.workflow == "examples/debate.py"  # as the config named it
    assert [(t.agent, t.round) for t in ep.turns] == [
        ("debater0", 0), ("debater1", 0), ("debater0", 1), ("debater1", 1), ("debater0", 2), ("debater1", 2),
        ("judge", 0)]
    # Round 2 of debater0: its own two answers, each followed by the other's answer of that round.
    seen = [m["content"] for m in ep.turns[4].messages]
    assert (
        seen[2] == "\\boxed{41}"
        and "\\boxed{7}" in seen[3]
        and seen[4] == "\\boxed{42}"
        and "\\boxed{7}" in seen[5]
    )
    assert (
        "\\boxed{42}" in ep.turns[6].messages[1]["content"]
        and "\\boxed{8}" in ep.turns[6].messages[1]["content"]
    )
    assert ep.final_answer == "42" and ep.reward == 1.0 and not ep.parse_failures
    assert len([c for c in client.calls if c.role == "debater"]) == 6


def test_unparsable_judge_falls_back_and_is_counted():
    ep, _ = _debate("the second one, 2", rounds=1)
    assert ep.parse_failures == {"judge": 1} and ep.final_answer == "7" and ep.reward == 0.0


OWN_OPTIONS = GOOD + """
from dataclasses import dataclass, field
from marl.field_rules import at_least

@dataclass(frozen=True)
class Options:
    judges: int = at_least(1, 1)
    style: str = field(default="short", metadata={"choices": ("short", "long")})
    temperature: float = 0.5

OPTIONS = Options
"""


def test_a_file_workflow_declares_its_own_options(tmp_path):
    path = _write(tmp_path, "judged", OWN_OPTIONS)
    cls = get_workflow(path).OPTIONS  # type: ignore[attr-defined]
    defaults = workflow_options(path, WorkflowSettings())
    assert defaults.own(cls) == cls() and defaults.options == cls()
    opts = workflow_options(
        path, WorkflowSettings(max_rounds=2), {"judges": 3, "style": "long", "temperature": 1}
    )
    assert (opts.max_rounds, opts.own(cls)) == (2, cls(judges=3, style="long", temperature=1))


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        ({"judges": 0}, "marl.options.judges must be >= 1; got 0"),
        ({"style": "medium"}, "marl.options.style must be one of short, long; got 'medium'"),
        ({"judges": "two"}, "marl.options.judges must be an int; got 'two'"),
        ({"judges": True}, "marl.options.judges must be an int; got True"),
        ({"temperature": "hot"}, "marl.options.temperature must be a float; got 'hot'"),
        (
            {"jugdes": 2},
            "marl.options.jugdes: {path} has no option 'jugdes'; its options: judges, style, temperature",
        ),
    ],
)
def test_a_bad_own_option_names_its_key(tmp_path, values, problem):
    path = _write(tmp_path, "judged", OWN_OPTIONS)
    with pytest.raises(ValueError) as e:
        workflow_options(path, WorkflowSettings(), values)
    assert str(e.value) == problem.format(path=path)


def test_options_of_a_workflow_that_declares_none_are_refused(tmp_path):
    with pytest.raises(ValueError, match="marl.options.k: voting declares no options of its own"):
        workflow_options("voting", WorkflowSettings(), {"k": 2})
    assert workflow_options("voting", WorkflowSettings(num_generators=2)).options is None


@pytest.mark.parametrize(("body", "problem"), [
    (GOOD + "OPTIONS = {'judges': 1}\n", "OPTIONS must be a dataclass"),
    (GOOD + "from dataclasses import dataclass\n@dataclass\nclass O:\n    judges: int\nOPTIONS = O\n",
     "OPTIONS() raised TypeError"),
])
def test_options_that_are_no_dataclass_of_defaults_are_a_protocol_problem(tmp_path, body, problem):
    path = _write(tmp_path, "odd", body)
    with pytest.raises(ValueError, match="marl.workflow") as e:
        get_workflow(path)
    assert problem in str(e.value)


def test_debate_runs_as_many_debaters_as_its_option_says():
    replies = {"debater0": ["\\boxed{1}", "\\boxed{4}"], "debater1": ["\\boxed{2}", "\\boxed{5}"],
               "debater2": ["\\boxed{3}", "\\boxed{42}"], "judge": "Debater 3: \\boxed{3}"}
    client = ScriptedClient(replies)
    opts = workflow_options("examples/debate.py", WorkflowSettings(max_rounds=1), {"debaters": 3})
    assert get_workflow("examples/debate.py").agents(opts) == ["debater0", "debater1", "debater2", "judge"]
    ep = asyncio.run(run_episode("examples/debate.py", TASK, client, MathFamily(), opts, 0))
    assert [(t.agent, t.round) for t in ep.turns] == [
        ("debater0", 0), ("debater1", 0), ("debater2", 0), ("debater0", 1), ("debater1", 1), ("debater2", 1),
        ("judge", 0)]
    revise = ep.turns[4].messages[-1]["content"]  # debater1 reads debater0's and debater2's answers
    assert "\\boxed{1}" in revise and "\\boxed{3}" in revise and "\\boxed{2}" not in revise
    judged = ep.turns[6].messages[-1]["content"]
    assert "\\boxed{1}, \\boxed{2} or \\boxed{3}" in judged and "\\boxed{42}" in judged
    assert ep.final_answer == "42" and ep.reward == 1.0 and not ep.parse_failures
