"""`python -m jobs.pages.fidelity [--write]`: docs/paper_fidelity.md, generated from docs/paper_fidelity.yaml
and the paper matrix's resolved configs.

A row whose paper value is machine-readable (`config: {key: value}`) gets its status computed here: ✅ when
every cell it names resolves every key to the paper's value, ✘ otherwise. Other rows carry a judged status and
either the keys involved (`keys`) or the reason no key holds the setting (`no_key`). Without --write the
command prints the page; with it, it writes docs/paper_fidelity.md. tests/jobs/test_paper_fidelity.py checks
the page equals what this renders.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from jobs.config.schema import TrainConfig, as_node

ROOT = Path(__file__).resolve().parents[2]
ROWS = ROOT / "docs/paper_fidelity.yaml"
PAGE = ROOT / "docs/paper_fidelity.md"
MATRIX = ROOT / "jobs/configs/sweeps/paper_matrix.yaml"
STATUS = {"same": "✅", "close": "≈", "different": "✘"}
CELLS = re.compile(r"all|(math|code)·(all|[a-z_]+(\|[a-z_]+)*)")
TAG = re.compile(r"(\[[PRI]\])+")
SECTION = re.compile(r"§\d[a-e]?")
Cell = tuple[str, str, str]  # (task, workflow, sharing)


@dataclass(frozen=True)
class Row:
    what: str
    paper: str
    tag: str
    section: str
    cells: str
    notes: str
    config: dict[str, Any] | None = None  # key -> the paper's value: the status is computed
    keys: tuple[str, ...] = ()  # keys shown beside a judged status
    no_key: str = ""  # why no config key holds the setting
    judged: str = ""  # same | close | different, where the paper's value is not machine-readable


def load_rows(path: Path = ROWS) -> list[Row]:
    """The rows of the data file, each checked for a well-formed source, cell selector and status kind."""
    rows = []
    for raw in yaml.safe_load(path.read_text())["rows"]:
        row = Row(**{**raw, "keys": tuple(raw.get("keys", ())), "what": str(raw["what"])})
        problem = row_problem(row)
        if problem:
            raise ValueError(f"{path}: row {row.what!r}: {problem}")
        rows.append(row)
    return rows


def row_problem(row: Row) -> str | None:
    """Why a row is malformed, or None."""
    if not TAG.fullmatch(row.tag) or not SECTION.fullmatch(row.section):
        return f"source must be tags like [R] and a section like §3, got {row.tag!r} {row.section!r}"
    if not CELLS.fullmatch(row.cells):
        return f"cells must be all or <task>·<workflows>, got {row.cells!r}"
    if row.config is not None:
        return "a computed row (config) takes no judged status, keys or no_key" if (
            row.judged or row.keys or row.no_key) else None
    if row.judged not in STATUS:
        return f"a row without config needs judged: one of {', '.join(STATUS)}"
    if bool(row.keys) == bool(row.no_key.strip()):
        return "a judged row needs either keys or a no_key reason"
    return None


def selected(selector: str, task: str, workflow: str) -> bool:
    if selector == "all":
        return True
    want_task, want_workflows = selector.split("·")
    return want_task == task and (want_workflows == "all" or workflow in want_workflows.split("|"))


def matrix_configs(path: Path = MATRIX) -> dict[Cell, Any]:
    """One resolved config per (task, workflow, sharing) of the matrix: no row varies with model or seed."""
    from jobs.config.sweep_spec import cells, flatten, load_sweep
    from jobs.sweep import setup_of, trial_config  # Ray Tune is imported only to resolve the matrix

    spec = load_sweep(str(path))
    out: dict[Cell, Any] = {}
    for cell in cells(spec):
        values = flatten(cell)
        key = (values["data.task"], values["marl.workflow"], values["marl.sharing"])
        if key not in out:
            out[key] = trial_config(setup_of(spec), {"grid": cell}, "fidelity")
    return out


def resolved(cfg: TrainConfig, key: str) -> Any:
    """A key's value as plain data; None when the schema has no such key."""
    value = OmegaConf.select(as_node(cfg), key, default=None)
    if isinstance(value, Enum):  # a choice: its string, as the YAML holds it
        return value.value
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def named_values(row: Row, configs: dict[Cell, Any], key: str) -> list[Any]:
    """`key` in every cell the row names, in matrix order."""
    found = [
        resolved(cfg, key)
        for (task, workflow, _), cfg in configs.items()
        if selected(row.cells, task, workflow)
    ]
    if not found:
        raise ValueError(f"row {row.what!r} names no cell: {row.cells}")
    return found


def status(row: Row, configs: dict[Cell, Any]) -> str:
    """✅ / ≈ / ✘: computed for a config row, else the judged one."""
    if row.config is None:
        return STATUS[row.judged]
    same = all(v == want for key, want in row.config.items() for v in named_values(row, configs, key))
    return STATUS["same" if same else "different"]


def shown(value: Any) -> str:
    """A config value as the page writes it: YAML flow style
    (`{enable_thinking: false}`, `[paper]`, `2.0e-05`)."""
    if value is None:
        return "(no such key)"
    return yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()


def config_column(row: Row, configs: dict[Cell, Any]) -> str:
    """`key` = `value` per key as the named cells resolve it (every distinct value), or the no-key reason."""
    if row.no_key:
        return f"none: {row.no_key}"
    parts = []
    for key in row.config or row.keys:
        values = []
        for v in named_values(row, configs, key):
            if v not in values:
                values.append(v)
        parts.append(f"`{key}` = " + " / ".join(f"`{shown(v)}`" for v in values))
    return "<br>".join(parts)


def cell(text: str) -> str:
    """Table-safe text: one line, `|` escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def counts(rows: list[Row], statuses: list[str]) -> dict[str, int]:
    """How many rows have each status, and how many rest on an inference ([I] among their tags)."""
    tally = Counter(statuses)
    return {**{mark: tally[mark] for mark in STATUS.values()}, "[I]": sum("[I]" in r.tag for r in rows)}


HEADER = """# Paper fidelity: `paper_matrix.yaml` against the paper's training setup

The paper: "When Does Multi-Agent RL Improve LLM Workflows?" (arXiv 2605.24202). Each row's *source* gives its
tags and the section of the paper notes (`notes/paper.md`) it comes from: **[P]** the paper states it, **[R]**
the authors' code does it, **[I]** an inference, stated by neither (check it before relying on it). *config*
is the resolved value in every cell the row names (`all`, or `<task>·<workflow>`); *status* is ✅ the same, ≈
close, ✘ different. Where the paper's value is machine-readable the status is computed from the resolved
configs of `jobs/configs/sweeps/paper_matrix.yaml` (over `paper_base.yaml`); elsewhere it is judged, and a row
with no config key says why. This page is generated from `docs/paper_fidelity.yaml` by
`python -m jobs.pages.fidelity --write`; `tests/jobs/test_paper_fidelity.py` fails when they differ.
"""


def render(rows: list[Row], configs: dict[Cell, Any]) -> str:
    """The whole page."""
    statuses = [status(r, configs) for r in rows]
    tally = counts(rows, statuses)
    lines = [HEADER, f"Rows: {len(rows)}; ✅ {tally['✅']}, ≈ {tally['≈']}, ✘ {tally['✘']}; resting on [I]: "
             f"{tally['[I]']}.", "", "| setting | paper | source | cells | config | status | notes |",
             "|---|---|---|---|---|---|---|"]
    for row, mark in zip(rows, statuses, strict=True):
        fields = (
            row.what,
            row.paper,
            f"{row.tag} {row.section}",
            row.cells,
            config_column(row, configs),
            mark,
            row.notes,
        )
        lines.append("| " + " | ".join(cell(f) for f in fields) + " |")
    lines += ["", "## What differs", ""]
    lines += [f"- **{row.what}** ({mark}): the paper: {row.paper}; here: "
              f"{config_column(row, configs).replace('<br>', ', ')}"
              + (f"; {' '.join(row.notes.split())}" if row.notes else "")
              for row, mark in zip(rows, statuses, strict=True) if mark != STATUS["same"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.pages.fidelity",
                                     description=__doc__.splitlines()[0])
    parser.add_argument(
        "--write", action="store_true", help=f"write {PAGE.relative_to(ROOT)} instead of printing"
    )
    args = parser.parse_args(argv)
    page = render(load_rows(), matrix_configs())
    if args.write:
        PAGE.write_text(page)
    else:
        sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
