"""The workflows by name (the `marl.workflow` config key): the built-in ones, or the user's own module.

A workflow is a module with `ROLES`, `agents(opts)` and an async `run(task, client, family, opts,
sample_index) -> Episode`, and optionally `SLOT_ROLES` (see `slot_roles`), `OPTIONS`, the dataclass of
its own options (set as `marl.options.<name>`, read as `opts.own(OPTIONS)`; marl/workflows/options.py), and
`turn_shape(opts)`, its turns per role at the caps, which the planner reads (marl/workflows/turns.py).
Agent names are a role, or a role followed by a number (`generator0`). `marl.workflow` takes a built-in
name, a dotted module path (`my_pkg.debate`) or a file path (`examples/debate.py`); a module is imported and
checked on first use (at config load), so a missing attribute, a `run` that is not async or an agent of no
role fails there.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Protocol

from marl.guards import Guard, read_guards
from marl.plugins import PluginError, is_file_spec, load_module
from marl.prompts import PromptSetError, load_prompt_set
from marl.tasks.base import TaskFamily
from marl.types import Episode, PolicyClient, Task
from marl.workflows import eval_opt, orch_workers, single_agent, voting
from marl.workflows.common import PROMPT_SETS
from marl.workflows.options import WorkflowOptions, WorkflowSettings, own_options
from marl.workflows.prompt_check import PromptSpec, check_set, check_wording
from marl.workflows.turns import TurnShape, agents_shape


class Workflow(Protocol):
    """What a workflow module provides (modules satisfy this structurally)."""

    ROLES: tuple[str, ...]

    def agents(self, opts: WorkflowOptions) -> list[str]: ...

    async def run(
        self, task: Task, client: PolicyClient, family: TaskFamily, opts: WorkflowOptions, sample_index: int
    ) -> Episode: ...


WORKFLOWS: dict[str, Workflow] = {
    "single_agent": single_agent,
    "eval_opt": eval_opt,
    "voting": voting,
    "orch_workers": orch_workers,
}
_LOADED: dict[str, Workflow] = {}  # user modules by the spec that named them


def get_workflow(name: str) -> Workflow:
    """The built-in workflow `name`, or the module a dotted or file path names (imported and checked once).
    Raises ValueError starting with `marl.workflow` and naming the module and what is wrong with it."""
    if name in WORKFLOWS:
        return WORKFLOWS[name]
    if name not in _LOADED:
        try:
            module = load_module(name)
        except PluginError as e:
            raise ValueError(
                f"marl.workflow must be one of {', '.join(WORKFLOWS)}, a module path (my_pkg.debate) "
                f"or a file path (workflows/debate.py); got {name!r}: {e}"
            ) from None
        problem = workflow_problem(module)
        if problem:
            where = module.__file__ if is_file_spec(name) else module.__name__
            raise ValueError(f"marl.workflow={name}: {where} {problem}")
        _LOADED[name] = module  # checked structurally above
    return _LOADED[name]


def workflow_problem(module: ModuleType) -> str | None:
    """What keeps `module` from being a workflow (the first problem found), or None."""
    roles = getattr(module, "ROLES", None)
    if roles is None:
        return "has no ROLES (a tuple of role names)"
    if isinstance(roles, str) or not roles or not all(isinstance(r, str) and r for r in roles):
        return f"ROLES must be a non-empty tuple of role names; got {roles!r}"
    for attr in ("agents", "run"):
        if not callable(getattr(module, attr, None)):
            return f"has no function {attr}()"
    if not inspect.iscoroutinefunction(module.run):
        return "run() must be async (`async def run(task, client, family, opts, sample_index)`)"
    try:
        inspect.signature(module.run).bind(None, None, None, None, 0)
    except TypeError:
        return f"run{inspect.signature(module.run)} must take (task, client, family, opts, sample_index)"
    unknown = [r for r in getattr(module, "SLOT_ROLES", ()) if r not in roles]
    if unknown:
        return f"SLOT_ROLES names {unknown}, which are not in ROLES {tuple(roles)}"
    return _options_problem(module) or _agents_problem(module, roles) or _shape_problem(module, roles)


def _options_problem(module: ModuleType) -> str | None:
    """What is wrong with the module's OPTIONS, if it has one: a dataclass whose every field has a default."""
    cls = getattr(module, "OPTIONS", None)
    if cls is None:
        return None
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return f"OPTIONS must be a dataclass (its own options); got {cls!r}"
    try:
        cls()
    except Exception as e:  # noqa: BLE001 - whatever the user's code raises is reported, not propagated
        return f"OPTIONS() raised {type(e).__name__}: {e} (every option needs a default)"
    return None


def _agents_problem(module: ModuleType, roles: tuple[str, ...]) -> str | None:
    """What is wrong with the agents its default options give: agents() failing, or agents of no role."""
    try:
        agents = list(module.agents(WorkflowOptions()))
    except Exception as e:  # noqa: BLE001 - whatever the user's code raises is reported, not propagated
        return f"agents(WorkflowOptions()) raised {type(e).__name__}: {e}"
    strays = [a for a in agents if agent_role(a) not in roles]
    if strays:
        return f"agents() returns {strays}, whose roles are not in ROLES {tuple(roles)}"
    return None


def _shape_problem(module: ModuleType, roles: tuple[str, ...]) -> str | None:
    """What is wrong with the turn shape its default options give, if it declares one."""
    if not hasattr(module, "turn_shape"):
        return None
    try:
        shape = module.turn_shape(WorkflowOptions())
    except Exception as e:  # noqa: BLE001 - whatever the user's code raises is reported, not propagated
        return f"turn_shape(WorkflowOptions()) raised {type(e).__name__}: {e}"
    if not isinstance(shape, TurnShape):
        return f"turn_shape() must return a marl.workflows.turns.TurnShape; got {shape!r}"
    strays = [r for r in shape.per_role if r not in roles]
    return f"turn_shape() counts turns of {strays}, which are not in ROLES {tuple(roles)}" if strays else None


def turn_shape(name: str, opts: WorkflowOptions) -> TurnShape:
    """Workflow `name`'s turns per role at the caps and how many run one after another, as its module
    declares them (`turn_shape(opts)`); a module declaring none: each of its agents once, in turn."""
    module = get_workflow(name)
    if hasattr(module, "turn_shape"):
        shape: TurnShape = module.turn_shape(opts)
        return shape
    return agents_shape(module.agents(opts), agent_role)


def workflow_options(name: str, settings: WorkflowSettings, own: Mapping[str, Any] | None = None
                     ) -> WorkflowOptions:
    """What workflow `name` reads: the built-in `settings` (the config's `marl` section, or any
    WorkflowSettings) and its own options built from `own` (`marl.options`). Raises ValueError naming the
    `marl.*` key at fault."""
    shared = {f.name: getattr(settings, f.name) for f in dataclasses.fields(WorkflowSettings)}
    return WorkflowOptions(**shared, options=workflow_own_options(name, own or {}))


def workflow_own_options(name: str, values: Mapping[str, Any]) -> object:
    """Workflow `name`'s own options (its module's OPTIONS) built from `values`, None for a workflow with
    none. Raises ValueError naming `marl.options.<key>`."""
    return own_options(getattr(get_workflow(name), "OPTIONS", None), values, name)


def workflow_guards(name: str, opts: WorkflowOptions, values: Mapping[str, Any]) -> dict[str, Guard]:
    """The run's output guards (role -> Guard) from `values` (`marl.guards`), the built-in ones read from the
    workflow module's `guards(opts)` (declared beside its options; none when it has no such function). Raises
    ValueError naming `marl.guards.<role>`."""
    module = get_workflow(name)
    builtin = getattr(module, "guards", None)
    return read_guards(values, roles_of(name), lambda: builtin(opts) if builtin else {}, name)


def agent_role(agent: str) -> str:
    """The role an agent name is an instance of: `generator1` -> `generator`, `judge` -> `judge`."""
    return re.sub(r"\d+$", "", agent)


def roles_of(name: str) -> tuple[str, ...]:
    """The role names of workflow `name`, in the order its PolicyMap lists them."""
    return tuple(get_workflow(name).ROLES)


def slot_roles(name: str) -> tuple[str, ...]:
    """Roles of workflow `name` whose numbered instances are separate slots rather than one pool: each
    instance answers in its own position (voting's generator0..K-1), so the paper's GRPO grouping gives each
    instance its own group. Listed in the module's optional `SLOT_ROLES`; none by default."""
    return tuple(getattr(get_workflow(name), "SLOT_ROLES", ()))


def check_prompts(spec: str, workflow: str) -> None:
    """The prompt set `spec` (marl.prompts) checked against every built-in workflow it names and against the
    run's `workflow`: a user workflow with a PROMPT_SPEC needs wording in the set, or in its own PROMPT_FILE
    when the set does not name it. Raises ValueError starting with `marl.prompts=<spec>` and naming the file,
    workflow.kind.role and the problem."""
    try:
        prompt_set = load_prompt_set(spec)
        module = get_workflow(workflow)
        name = getattr(module, "NAME", workflow)
        builtin = (single_agent, eval_opt, voting, orch_workers)
        specs: dict[str, PromptSpec] = {m.NAME: m.PROMPT_SPEC for m in builtin}
        prompt_spec: PromptSpec | None = getattr(module, "PROMPT_SPEC", None)
        if prompt_spec is not None:
            specs[name] = prompt_spec
        check_set(prompt_set, specs)
        if prompt_spec is not None and name not in prompt_set.workflows:
            own = getattr(module, "PROMPT_FILE", None)
            if own is None:
                prompt_set.wording(name, "math")  # raises: the set has no wording for the run's workflow
            own_set = load_prompt_set(str(own))
            own_set.wording(name, "math")  # raises when the workflow's own file does not name it either
            check_set(own_set, {name: prompt_spec})
    except PromptSetError as e:
        raise ValueError(f"marl.prompts={spec}: {e}") from None


__all__ = ["PROMPT_SETS", "WORKFLOWS", "TurnShape", "Workflow", "WorkflowOptions", "WorkflowSettings",
           "agent_role", "check_prompts", "check_wording", "get_workflow", "roles_of", "slot_roles",
           "turn_shape",
           "workflow_options", "workflow_guards", "workflow_own_options", "workflow_problem"]
