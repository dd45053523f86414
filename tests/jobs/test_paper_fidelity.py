"""docs/paper_fidelity.md cannot drift from the paper matrix: every table row with a config key and a value is
checked against the resolved config of every (task, workflow, sharing) cell it names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from jobs.sweep import setup_of, trial_config
from jobs.sweep_spec import cells, flatten, load_sweep

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs/paper_fidelity.md"
PAPER = ROOT / "jobs/configs/sweeps/paper_matrix.yaml"


def table_rows() -> list[dict[str, str]]:
    """The settings table's rows as {column: text}, backticks removed from key and value, `\\|` unescaped."""
    lines = [ln for ln in DOC.read_text().splitlines() if ln.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        parts = [c.strip().replace("\0", "|") for c in line.replace("\\|", "\0").strip("|").split("|")]
        rows.append(dict(zip(header, parts, strict=True)))
    return rows


def checked_rows() -> list[dict[str, str]]:
    return [r for r in table_rows() if r["key"] and r["value"]]


def selected(selector: str, task: str, workflow: str) -> bool:
    if selector == "all":
        return True
    want_task, want_workflows = selector.split("·")
    return want_task == task and (want_workflows == "all" or workflow in want_workflows.split("|"))


@pytest.fixture(scope="module")
def configs():
    """One resolved config per (task, workflow, sharing): the table's values do not vary with model or seed."""
    spec = load_sweep(str(PAPER))
    out, seen = [], set()
    for cell in cells(spec):
        values = flatten(cell)
        key = (values["data.task"], values["marl.workflow"], values["marl.sharing"])
        if key not in seen:
            seen.add(key)
            out.append((key, trial_config(setup_of(spec), {"grid": cell}, "fidelity")))
    assert len(out) == 2 * (1 + 3 * 2)  # single_agent runs once per task, shared only
    return out


def test_table_is_parsed():
    rows = checked_rows()
    assert len(rows) >= 40
    assert {"algo.ppo_mini_batch_size", "algo.loss_agg", "model.chat_template_kwargs", "rollout.lora_serving",
            "algo.group_by", "learner.optim.schedule_unit"} <= {r["key"].strip("`") for r in rows}


@pytest.mark.parametrize("row", checked_rows(), ids=lambda r: f"{r['cells']}:{r['key'].strip('`')}")
def test_row_matches_every_cell_it_names(row, configs):
    key, want = row["key"].strip("`"), yaml.safe_load(row["value"].strip("`"))
    hits = 0
    for (task, workflow, _), cfg in configs:
        if not selected(row["cells"], task, workflow):
            continue
        got = OmegaConf.select(cfg, key)
        got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        assert got == want, f"{key} in {task}·{workflow}: config {got!r}, table {want!r}"
        hits += 1
    assert hits, f"row {row['setting']!r} names no cell: {row['cells']}"


def test_every_cell_selector_is_well_formed():
    for row in table_rows():
        assert re.fullmatch(r"all|(math|code)·(all|[a-z_]+(\|[a-z_]+)*)", row["cells"]), row
