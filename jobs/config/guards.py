"""The run's output guards (`marl.guards`, marl/guards.py) read from the config: checked at load (the role,
the spec, the grammar compiled, the role's response cap) and handed to the engines (as Sampling.role_guards,
each role's one EBNF text) and to the learners (TrainBatch.guards, the same texts)."""

from __future__ import annotations

from jobs.config.schema import TrainConfig
from marl.guard_grammar import check_guard, grammar_text
from marl.guards import Guard, cap_problem
from marl.workflows import workflow_guards, workflow_options


def run_guards(cfg: TrainConfig) -> dict[str, Guard]:
    """role -> Guard for every role `marl.guards` names. Raises ValueError naming marl.guards.<role>."""
    if not cfg.marl.guards:
        return {}
    opts = workflow_options(cfg.marl.workflow, cfg.marl, cfg.marl.options)
    return workflow_guards(cfg.marl.workflow, opts, cfg.marl.guards)


def guards_problem(cfg: TrainConfig) -> str | None:
    """What is wrong with `marl.guards` (the first problem, naming the key), or None."""
    try:
        guards = run_guards(cfg)
    except ValueError as e:
        return str(e)
    if guards and cfg.learner.logits_chunk_tokens <= 0:
        return "marl.guards needs learner.logits_chunk_tokens > 0 (the chunked head replays the masks)"
    caps = cfg.rollout.role_max_new_tokens
    for role, guard in guards.items():
        problem = check_guard(guard)
        if problem:
            return f"marl.guards.{role}: {problem}"
        problem = cap_problem(role, guard, int(caps.get(role, cfg.rollout.sampling.max_new_tokens)))
        if problem:
            return problem
    return None


def role_guards(cfg: TrainConfig) -> tuple[tuple[str, str], ...]:
    """(role, grammar text) pairs, sorted: Sampling.role_guards and TrainBatch.guards."""
    return tuple(sorted((role, grammar_text(g)) for role, g in run_guards(cfg).items()))
