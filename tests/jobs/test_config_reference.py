"""docs/config.md is what jobs.pages.config_reference renders from the schema and the config checks: every
key, its comment read from the schema's source, and what load checks of it."""

from __future__ import annotations

import textwrap

from omegaconf import OmegaConf

from jobs.config import loading
from jobs.config.field_rules import schema_rules
from jobs.config.schema import TrainConfig
from jobs.pages import config_reference
from jobs.pages.config_reference import field_comments, message_rules, page, schema_keys


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
    assert set(message_rules(open(loading.__file__).read())) <= keys


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


CHECKS = textwrap.dedent('''
    def check(cfg):
        if cfg.a.b < 0:
            raise ConfigError(f"config: a.b must be >= 0 (0 = {'auto' if x else 'off'}); got {cfg.a.b!r}")
        for key, module in (("t.one", "m1"), ("t.two", "m2")):
            raise ConfigError(f"config: {key}=true needs `{module}`")
        for key in cfg.choices:
            raise ConfigError(f"config: {key} must be one of them")
        raise ConfigError("config: x.y and x.z must be >= 0")
        raise ConfigError(f"config: m.n must be <= m.k = {cfg.m.k}; got {cfg.m.n}")
''')


def test_rules_are_read_from_the_messages_of_the_checks():
    assert message_rules(CHECKS) == {
        "a.b": ["a.b must be >= 0"],
        "t.one": ["t.one=true needs `m1`"], "t.two": ["t.two=true needs `m2`"],
        "x.y": ["x.y and x.z must be >= 0"], "x.z": ["x.y and x.z must be >= 0"],
        "m.n": ["m.n must be <= m.k"],
    }


def test_a_key_shows_its_type_default_checks_and_whether_a_policy_sets_it():
    text = page()
    assert "| `learner.optim.lr` | `float` | `2e-05` | > 0 | yes |" in text
    assert "| `data.train` | `str` | required |" in text
    assert "| `algo.group_by` | `list[str]` | `[task, agent]` |" in text
    assert "| `rollout.engine_resources` | `dict[str, float]` | `{}` |  | yes |" in text
    assert "one of `shared`, `isolated`, `custom`" in text
