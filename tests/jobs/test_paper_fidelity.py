"""docs/paper_fidelity.md is what jobs.pages.fidelity renders from docs/paper_fidelity.yaml and the paper
matrix's resolved configs: every row cites its source, a computed status follows the configs, and a row
without a config key says why."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from jobs.pages import fidelity
from jobs.pages.fidelity import Row, load_rows, matrix_configs, render, row_problem, status


@pytest.fixture(scope="module")
def configs():
    return matrix_configs()


@pytest.fixture(scope="module")
def rows():
    return load_rows()


def test_matrix_resolves_one_config_per_task_workflow_sharing(configs):
    assert len(configs) == 2 * (1 + 3 * 2)  # single_agent runs once per task, shared only


def test_page_is_the_rendered_table(rows, configs):
    assert fidelity.PAGE.read_text() == render(rows, configs), "run `python -m jobs.pages.fidelity --write`"


def test_every_row_cites_its_source_and_a_keyless_row_says_why(rows):
    assert len(rows) >= 50
    for row in rows:
        assert row.tag and row.section.startswith("§"), row
        assert row.config is not None or row.keys or row.no_key.strip(), row
    assert {"algo.ppo_mini_batch_size", "learner.optim.schedule_unit", "data.sandbox.memory_mb",
            "data.eval_full"} <= {k for r in rows for k in (r.config or {})}


def test_every_key_the_table_names_is_a_config_key(rows, configs):
    cfg = next(iter(configs.values()))
    for row in rows:
        for key in [*(row.config or {}), *row.keys]:
            assert OmegaConf.select(cfg, key, default=MISSING_KEY) is not MISSING_KEY, f"{row.what}: {key}"


MISSING_KEY = object()
BASE = Row(what="steps", paper="500", tag="[R]", section="§3", cells="all", notes="", config={"steps": 500})


@pytest.mark.parametrize("change, problem", [
    ({"tag": "R"}, "source"),
    ({"section": "3"}, "source"),
    ({"cells": "math"}, "cells"),
    ({"judged": "same"}, "computed row"),
    ({"config": None, "judged": "same"}, "either keys or a no_key"),
    ({"config": None, "judged": "same", "no_key": "  "}, "either keys or a no_key"),
    ({"config": None, "judged": "similar", "no_key": "why"}, "judged"),
])
def test_malformed_rows_are_refused(change, problem):
    assert row_problem(BASE) is None
    assert problem in (row_problem(dataclasses.replace(BASE, **change)) or "")


def test_status_is_computed_from_every_named_cell(configs):
    assert status(BASE, configs) == "✅"
    assert status(dataclasses.replace(BASE, config={"steps": 499}), configs) == "✘"
    assert status(dataclasses.replace(BASE, config={"no.such.key": 1}), configs) == "✘"
    # math eval_opt has 3 rounds, code eval_opt 2: one value cannot hold for both.
    rounds = dataclasses.replace(BASE, cells="math·eval_opt", config={"marl.max_rounds": 3})
    assert status(rounds, configs) == "✅"
    assert status(dataclasses.replace(rounds, cells="code·all"), configs) == "✘"
    with pytest.raises(ValueError, match="names no cell"):
        status(dataclasses.replace(rounds, cells="code·debate"), configs)
    assert status(dataclasses.replace(BASE, config=None, judged="close", keys=("steps",)), configs) == "≈"
