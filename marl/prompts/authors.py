"""The importer for the prompt files the paper's authors released (`examples/math_reasoning/prompt.json` and
`examples/deepcoder/prompt.json` of their repository), so a user who has them can run their exact wording:
    marl.prompts=path/to/prompt.json                                   (imported on the fly), or
    python -m marl.prompts.authors prompt.json [code.json] -o my.yaml  (a prompt-set file to read, edit)

Their layout: sections by workflow (`voting_prompts`, `evaluator_optimizer_prompts`,
`orchestrator_workers_prompts`, `single_agent_prompts`; prefixed `deepcoder_` in the code file), each mapping
a prompt name to {"template": a Python format string, "required_variables": [...], "description": ...}. Every
prompt is one user message (no system message); the answer-format instruction is part of the text, so the
imported set does not append the family's. A template with no required variables is used as written (their
code does not format it), so its braces are escaped here. Sections this project has no workflow for (the v2
and 3-agent variants) are left out. Mapping, per workflow:
- single_agent: `generator_initial` of `single_agent_prompts`; the math file has none, where `voting_prompts`'
  generator (the same wording) is used.
- voting: `generator`, `aggregator` ({solutions}: the responses, each under "--- Solution i ---").
- eval_opt, with the shared conversation their workflow keeps: `generator_initial`, `evaluator_critique`
  (every review), `generator_refinement`.
- orch_workers: `orchestrator_propose` ({max_subtasks} is marl.max_strategies), `worker_full_solve`,
  `orchestrator_compare` (the synthesizer; {solutions} as voting's, each with its strategy).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

from marl.prompts.model import PromptSetError
from marl.types import JsonRecord

# (their section without the `deepcoder_` prefix, their prompt name) for each (workflow, role, template).
MAPPING: dict[tuple[str, str, str], tuple[str, str]] = {
    ("single_agent", "solver", "user"): ("single_agent_prompts", "generator_initial"),
    ("voting", "generator", "user"): ("voting_prompts", "generator"),
    ("voting", "aggregator", "user"): ("voting_prompts", "aggregator"),
    ("eval_opt", "generator", "user"): ("evaluator_optimizer_prompts", "generator_initial"),
    ("eval_opt", "generator", "revise"): ("evaluator_optimizer_prompts", "generator_refinement"),
    ("eval_opt", "evaluator", "review"): ("evaluator_optimizer_prompts", "evaluator_critique"),
    ("eval_opt", "evaluator", "rereview"): ("evaluator_optimizer_prompts", "evaluator_critique"),
    ("orch_workers", "orchestrator", "user"): ("orchestrator_workers_prompts", "orchestrator_propose"),
    ("orch_workers", "worker", "user"): ("orchestrator_workers_prompts", "worker_full_solve"),
    ("orch_workers", "synthesizer", "user"): ("orchestrator_workers_prompts", "orchestrator_compare"),
}
FALLBACKS = {("single_agent_prompts", "generator_initial"): ("voting_prompts", "generator")}
# Their placeholders under this project's names; {solutions} gains the blank line our blocks are joined with.
RENAMES = {"{max_subtasks}": "{max_strategies}"}
PARTS = {("voting", "aggregator"): ("response", "--- Solution {i} ---\n{text}", "{responses}"),
         ("orch_workers", "synthesizer"): ("solution", "--- Solution {i} (strategy: {strategy}) ---\n{text}",
                                           "{solutions}")}


def import_authors_prompts(data: JsonRecord, where: str) -> JsonRecord:
    """A prompt-set mapping (as marl/prompts/*.yaml) from one or two of their files' contents (math, code)."""
    kind = "code" if any(k.startswith("deepcoder_") for k in data) else "math"
    sections = {k.removeprefix("deepcoder_"): v for k, v in data.items() if isinstance(v, dict)}
    workflows: JsonRecord = {}
    for (workflow, role, name), ref in MAPPING.items():
        text = _template(sections, ref, where) or _template(sections, FALLBACKS.get(ref, ref), where)
        if text is None:
            continue
        entry = workflows.setdefault(workflow, {kind: {}})[kind].setdefault(role, {"system": ""})
        part = PARTS.get((workflow, role))
        if part and name == "user":
            entry[part[0]] = part[1]
            text = text.replace("{solutions}", "\n\n" + part[2])
        entry[name] = text
    if not workflows:
        known = ", ".join(sorted({s for s, _ in MAPPING.values()}))
        raise PromptSetError(f"{where}: holds none of the paper's prompt sections ({known}, optionally "
                             "prefixed deepcoder_)")
    if "eval_opt" in workflows:
        workflows["eval_opt"]["settings"] = {"history": "shared"}  # their workflow shares one conversation
    return {"append_instruction": False, "workflows": _as_any(workflows, kind)}


def _template(sections: dict[str, Any], ref: tuple[str, str], where: str) -> str | None:
    section, name = ref
    item = sections.get(section, {}).get(name)
    if item is None:
        return None
    if not isinstance(item, dict) or not isinstance(item.get("template"), str):
        raise PromptSetError(f"{where}: {section}.{name} must hold a \"template\" string")
    text: str = item["template"]
    if not item.get("required_variables"):  # used unformatted by their code: braces are literal
        return text.replace("{", "{{").replace("}", "}}")
    for theirs, ours in RENAMES.items():
        text = text.replace(theirs, ours)
    return text


def _as_any(workflows: JsonRecord, kind: str) -> JsonRecord:
    """One file covers one task kind; its wording stands for both (`any`), as the user runs it on its kind."""
    return {w: {("any" if k == kind else k): v for k, v in body.items()} for w, body in workflows.items()}


def merge(math: JsonRecord, code: JsonRecord) -> JsonRecord:
    """The math file's wording for math tasks and the code file's for code tasks, in one set."""
    out: JsonRecord = {"append_instruction": False, "workflows": {}}
    for source, kind in ((math, "math"), (code, "code")):
        for workflow, body in source["workflows"].items():
            target = out["workflows"].setdefault(workflow, {})
            target.update({("settings" if k == "settings" else kind): v for k, v in body.items()})
    return out


class _BlockDumper(yaml.SafeDumper):  # type: ignore[misc]  # PyYAML ships no types
    """Multi-line text as YAML block scalars (`|-`), as the built-in sets are written."""


def _text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_BlockDumper.add_representer(str, _text)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m marl.prompts.authors", description=__doc__.split("\n\n")[0])
    p.add_argument("files", nargs="+", help="their math prompt.json, then optionally their code prompt.json")
    p.add_argument("-o", "--out", required=True, help="the prompt-set YAML to write")
    a = p.parse_args(argv)
    sets = [import_authors_prompts(json.loads(Path(f).read_text()), f) for f in a.files]
    result = merge(*sets) if len(sets) == 2 else sets[0]
    text = yaml.dump(result, Dumper=_BlockDumper, sort_keys=False, allow_unicode=True, width=110)
    Path(a.out).write_text(text)
    print(f"wrote {a.out}: marl.prompts={a.out}")


if __name__ == "__main__":
    main()
