"""`python -m jobs.pages.config_reference [--write]`: docs/config.md, the config reference, generated from
the schema.

Every key of `jobs/config/schema.py`'s `TrainConfig`, section by section: its type and default (from the
dataclasses), what config load checks of it (the choices and bounds its field carries, the rules its section
declares and those spanning sections, jobs/config/loading.py's CROSS_RULES, each as declared), whether a
policy may set it for itself (`jobs/config/policies.py`), and its comment in the source of the class that
declares it (learners/config.py, rollout/config.py, the schema, or for the `marl` section's inherited
workflow settings marl/workflows/options.py): the comment on the field's line and the block right above it
(dataclass fields carry no docstrings, so the source is read with `tokenize`). A field without a comment of
its own that directly follows a commented field, with no blank line between, points at the field whose
comment covers it. Without --write the command prints the page; tests/jobs/test_config_reference.py checks
the page equals it.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import io
import re
import sys
import tokenize
import typing
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from jobs.config import schema
from jobs.config.field_rules import enum_type, schema_rules, section_rule_texts
from jobs.config.loading import CROSS_RULES
from jobs.config.policies import per_policy_key

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs/config.md"
@dataclasses.dataclass(frozen=True)
class Key:
    key: str  # dotted path from the top of the config
    type: str
    default: Any
    comment: str


def field_comments(source: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(class name, field name) -> (the field's comment in `source`: the block above it, then its own line's;
    the field whose comment covers it: a commented field right above it, with no blank line between, whose
    comment names it, for a field without a comment of its own)."""
    lines = source.splitlines()
    on_line = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    comments: dict[tuple[str, str], tuple[str, str]] = {}
    for cls in (n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)):
        head, head_text, prev_end = "", "", -1
        for stmt in (s for s in cls.body if isinstance(s, ast.AnnAssign)):
            if not isinstance(stmt.target, ast.Name):
                continue
            name = stmt.target.id
            above = _block_above(lines, on_line, stmt.lineno)
            own = [
                on_line[n] for n in range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1) if n in on_line
            ]
            text = "; ".join(" ".join(part) for part in (above, own) if part)
            if above:
                head, head_text = name, text
            elif stmt.lineno != prev_end + 1:
                head = ""
            covered = not text and head and re.search(rf"\b{name}\b", head_text)
            comments[(cls.name, name)] = (text, head if covered else "")
            prev_end = stmt.end_lineno or stmt.lineno
    return comments


def _block_above(lines: list[str], on_line: dict[int, str], lineno: int) -> list[str]:
    """The whole-line comments directly above line `lineno` (1-based), top to bottom."""
    block: list[str] = []
    n = lineno - 1
    while n >= 1 and lines[n - 1].lstrip().startswith("#"):
        block.insert(0, on_line[n])
        n -= 1
    return block


def schema_keys(cls: type = schema.TrainConfig, prefix: str = "") -> Iterator[Key]:
    """Every leaf key under `cls`, in schema order (a nested section's keys where the section is declared)."""
    yield from _walk(cls, prefix)


@functools.cache
def _comments(path: str) -> dict[tuple[str, str], tuple[str, str]]:
    return field_comments(Path(path).read_text())


def _declared_by(cls: type, name: str) -> type:
    """The class of `cls`'s MRO that declares field `name` (a section may extend a class declared elsewhere,
    as MarlConfig extends marl/workflows/options.py's WorkflowSettings)."""
    return next(c for c in cls.__mro__ if name in vars(c).get("__annotations__", {}))


def _walk(cls: type, prefix: str) -> Iterator[Key]:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        factory = f.default_factory
        if dataclasses.is_dataclass(factory):
            yield from _walk(factory, f"{prefix}{f.name}.")  # type: ignore[arg-type]
            continue
        default = factory() if factory is not dataclasses.MISSING else f.default
        owner = _declared_by(cls, f.name)
        text, head = _comments(inspect.getfile(owner)).get((owner.__name__, f.name), ("", ""))
        # An Enum field is written as a string in YAML and overrides: its type shows as
        # `str`, its values as checks.
        kind = "str" if enum_type(hints[f.name]) else str(f.type).replace("|", "\\|")  # a table cell
        yield Key(f"{prefix}{f.name}", kind, default, text or (f"See `{prefix}{head}`." if head else ""))


def declared_rules() -> dict[str, list[str]]:
    """key -> the rules declared over it beyond its field's own: its section's (each section class's
    RULES) and those spanning sections (jobs/config/loading.py's CROSS_RULES), as they state them."""
    rules = section_rule_texts()
    for rule in CROSS_RULES:
        for key in rule.keys:
            rules.setdefault(key, []).append(rule.stated(""))
    return rules


def checks(key: str, rules: dict[str, list[str]]) -> list[str]:
    """What config load checks of `key`: the rules its schema field carries, then
    the rules of its other checks."""
    own = schema_rules().get(key)
    return (own.labels() if own else []) + rules.get(key, [])


def literal(value: Any) -> str:
    """A default as it is written in YAML."""
    if value is MISSING:
        return "required"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    if isinstance(value, dict):
        return "`{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}`"
    if isinstance(value, list):
        return "`[" + ", ".join(map(str, value)) + "]`"
    return f"`{value}`"


def cell(text: str) -> str:
    """Table-safe Markdown of a comment: one line, pipes escaped, and outside code spans `<` and `*` escaped
    (`<policy>` would be read as an HTML tag, `lora.*}, learner.{optim.*` as emphasis)."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):  # even parts lie outside code spans
        parts[i] = parts[i].replace("<", "&lt;").replace("*", "\\*")
    return "`".join(parts)


HEADER = """# Config reference

Every key of the one config schema (`jobs/config/schema.py`), section by section: its type, its default, what
config load checks of it (`jobs/config/loading.py`: a bad value is an error naming the key, exit code 2) and
the schema's own comment on it. *per policy*: the key may be set for one policy under `marl.policies.<policy>`
(see [per-policy settings](rollout_learners.md#per-policy-settings)). Keys are set in a YAML file (`--config`)
or as `key.path=value` overrides; `python -m jobs.train --config X --print-config` prints the resolved whole.
This page is generated by `python -m jobs.pages.config_reference --write`;
`tests/jobs/test_config_reference.py` fails when it differs from the schema.
"""


def render(keys: list[Key], rules: dict[str, list[str]]) -> str:
    """The whole page: a table per top-level section (top-level scalars first, as `run`)."""
    sections: dict[str, list[Key]] = defaultdict(list)
    for k in keys:
        sections[k.key.split(".")[0] if "." in k.key else "run"].append(k)
    lines = [HEADER, f"Keys: {len(keys)}, in {len(sections)} sections: "
             + ", ".join(f"[{name}](#{name})" for name in sections) + ".", ""]
    for name, members in sections.items():
        lines += [f"## {name}", "", "| key | type | default | checked at load | per policy | description |",
                  "|---|---|---|---|---|---|"]
        lines += [
            "| "
            + " | ".join(
                (
                    f"`{k.key}`",
                    f"`{k.type}`",
                    literal(k.default),
                    cell("; ".join(checks(k.key, rules))),
                    "yes" if per_policy(k.key) else "",
                    cell(k.comment),
                )
            )
            + " |"
            for k in members
        ]
        lines.append("")
    return "\n".join(lines)


def per_policy(key: str) -> bool:
    """May `marl.policies.<policy>` set `key` (a mapping key: its entries)?"""
    return per_policy_key(key) or per_policy_key(f"{key}.entry")


def page() -> str:
    return render(list(schema_keys()), declared_rules())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.pages.config_reference",
                                     description=__doc__.splitlines()[0])
    parser.add_argument(
        "--write", action="store_true", help=f"write {PAGE.relative_to(ROOT)} instead of printing"
    )
    args = parser.parse_args(argv)
    if args.write:
        PAGE.write_text(page())
    else:
        sys.stdout.write(page())
    return 0


if __name__ == "__main__":
    sys.exit(main())
