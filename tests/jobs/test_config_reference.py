"""docs/config.md is what jobs.pages.config_reference renders from the schema and the config checks: every
key, its comment read from the schema's source, and what load checks of it."""

from __future__ import annotations

import textwrap

import pytest
from omegaconf import OmegaConf

from jobs.config import ConfigError, load_config
from jobs.config.field_rules import schema_rules
from jobs.config.schema import TrainConfig
from jobs.pages import config_reference
from jobs.pages.config_reference import declared_rules, field_comments, page, schema_keys


def _leaves(tree: object, prefix: str = "") -> set[str]:
    if isinstance(tree, dict) and tree:
        return {leaf for k, v in tree.items() for leaf in _leaves(v, f"{prefix}{k}.")}
    return {prefix.rstrip(".")}


def test_page_is_the_rendered_reference():
    assert config_reference.PAGE.read_text() == page(), "run `python -m jobs.pages.config_reference --write`"


def test_every_schema_key_is_listed_once():
    keys = [k.key for k in schema_keys()]
    schema = OmegaConf.to_container(OmegaConf.structured(TrainConfig), throw_on_missing=False)
    assert len(keys) == len(set(keys)) and set(keys) == _leaves(schema)


def test_every_key_the_check_tables_name_is_listed():
    keys = {k.key for k in schema_keys()}
    assert set(schema_rules()) <= keys
    assert set(declared_rules()) <= keys


SCHEMA = textwrap.dedent('''
    @dataclass
    class Section:
        # The window and the drop, together: a block above
        drop: float = 0.1
        window: int = 2  # its own
        action: str = "warn"
        other: int = 0

        # above, past a blank line
        spaced: int = 1  # and on its line
        after: int = 2
''')


def test_a_comment_is_the_block_above_and_the_fields_own_line():
    comments = field_comments(SCHEMA)
    assert comments[("Section", "drop")] == ("The window and the drop, together: a block above", "")
    assert comments[("Section", "window")] == ("its own", "")
    assert comments[("Section", "spaced")] == ("above, past a blank line; and on its line", "")


def test_an_uncommented_field_points_only_at_a_comment_above_that_names_it():
    comments = field_comments(SCHEMA)
    assert comments[("Section", "action")] == ("", "")  # `drop`'s comment does not name it
    assert comments[("Section", "after")] == ("", "")
    schema = SCHEMA.replace("# The window and the drop", "# The window, the other and the drop")
    assert field_comments(schema)[("Section", "other")] == ("", "drop")


def test_rules_are_listed_as_declared_under_every_key_they_name():
    rules = declared_rules()
    # a section's own rule, at the section's place
    verl = "algo.minibatch_order=verl_balanced orders the rows for verl's in-order split; set " \
           "algo.minibatch_shuffle=false"
    assert verl in rules["algo.minibatch_order"] and verl in rules["algo.minibatch_shuffle"]
    assert "learner.deepspeed.offload_param needs learner.deepspeed.zero_stage=3" in rules[
        "learner.deepspeed.zero_stage"]
    # a rule spanning sections (jobs/config/loading.py's CROSS_RULES)
    assert any(r.startswith("cliff.action=rollback needs") for r in rules["checkpoint.every"])
    text = page()
    assert "| `rollout.sampling.top_p` | `float` | `1.0` | in (0, 1] |" in text
    assert "| `algo.clip_low` | `float` | `0.2` | in [0, 1) |" in text


def test_a_declared_rule_is_the_message_of_a_config_that_breaks_it():
    with pytest.raises(ConfigError) as e:
        load_config("jobs/configs/tiny.yaml", ["algo.minibatch_order=verl_balanced"])
    assert str(e.value) == "config: " + declared_rules()["algo.minibatch_order"][0]


def test_a_key_shows_its_type_default_checks_and_whether_a_policy_sets_it():
    text = page()
    assert "| `learner.optim.lr` | `float` | `2e-05` | > 0 | yes |" in text
    assert "| `data.train` | `str` | required |" in text
    assert "| `algo.group_by` | `list[str]` | `[task, agent]` |" in text
    assert "| `rollout.engine_resources` | `dict[str, float]` | `{}` |  | yes |" in text
    assert "one of `shared`, `isolated`, `custom`" in text
