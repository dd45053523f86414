"""The config's structure measures: `python scripts/config_measures.py [--root DIR]`.

What it counts, the same way before and after a change (read-only; prints Markdown):
- lines of jobs/config/ and the five largest files of the packages;
- config fields restated as Protocols (annotated attributes of `*Section` Protocol classes) against the leaf
  keys of the schema (annotated fields of the config dataclasses, nested sections not counted);
- hand-written range checks: `if` tests in the config modules that compare a value with a number literal
  (bounds written as field metadata are not counted: they are data; declared rules that compare with a
  number are counted apart);
- the files an algorithm setting touches beyond its reader: for a recent one (`algo.log_ratio_clamp`), the
  files of the packages and docs that name it;
- imports that run up from a folder to one above it in the same package (`learners/update/x.py` importing
  `learners/choices.py`), per importing folder;
- the function-size distribution of the packages (median, p90, max, counts over 30 and over 40 lines).
"""

from __future__ import annotations

import argparse
import ast
from collections import Counter
from pathlib import Path

import function_sizes  # the sibling script: one way to count a function's lines
from function_sizes import summary

PACKAGES = ("cluster", "marl", "rollout", "learners", "jobs")
# The modules that declare or check config sections, before and after sections moved beside their readers.
CONFIG_MODULES = ("jobs/config/*.py", "learners/config.py", "learners/sections.py", "rollout/config.py",
                  "rollout/sections.py", "marl/workflows/options.py", "marl/field_rules.py")
SETTING = "log_ratio_clamp"


def _sources(root: Path) -> list[Path]:
    return sorted(p for package in PACKAGES for p in (root / package).rglob("*.py"))


def _config_files(root: Path) -> list[Path]:
    return sorted({p for pattern in CONFIG_MODULES for p in root.glob(pattern)})


def _is_protocol(node: ast.ClassDef) -> bool:
    return any(isinstance(b, ast.Name) and b.id == "Protocol" for b in node.bases)


def restated(root: Path) -> int:
    """Annotated attributes of `*Section` Protocol classes anywhere in the packages."""
    count = 0
    for path in _sources(root):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and _is_protocol(node) and node.name.endswith("Section"):
                count += sum(isinstance(s, ast.AnnAssign) for s in node.body)
    return count


def schema_leaves(root: Path) -> int:
    """The schema's leaf keys, from the loaded schema itself (so the count does not depend on where the
    sections are declared)."""
    import sys

    sys.path.insert(0, str(root))
    from jobs.config.field_rules import field_rules  # noqa: F401  (the schema imports cleanly)
    from jobs.pages.config_reference import schema_keys

    return len(list(schema_keys()))


def _numeric(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp):
        return _numeric(node.operand)
    if isinstance(node, ast.Tuple):
        return bool(node.elts) and all(_numeric(e) for e in node.elts)
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def range_checks(root: Path) -> dict[str, int]:
    """Per config module: `if` tests comparing a value with a number literal."""
    out: dict[str, int] = {}
    for path in _config_files(root):
        n = 0
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.If):
                n += any(isinstance(c, ast.Compare) and any(_numeric(e) for e in [c.left, *c.comparators])
                         for c in ast.walk(node.test))
        if n:
            out[str(path.relative_to(root))] = n
    return out


def declared_numeric_rules(root: Path) -> int:
    """Declared rules (`Rule(...)` calls) whose check compares a value with a number literal: range checks
    that are data, counted apart from the hand-written ones."""
    n = 0
    for path in _config_files(root):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Rule":
                n += any(isinstance(c, ast.Compare) and any(_numeric(e) for e in [c.left, *c.comparators])
                         for c in ast.walk(node))
    return n


def setting_files(root: Path) -> list[str]:
    paths = [*_sources(root), *sorted((root / "docs").glob("*.md"))]
    return [str(p.relative_to(root)) for p in paths if SETTING in p.read_text()]


def _module_folder(root: Path, path: Path) -> tuple[str, ...]:
    return path.relative_to(root).parent.parts


def _target_path(root: Path, module: str) -> Path | None:
    base = root / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def upward_imports(root: Path) -> Counter[str]:
    """Per importing folder: imports of a module in a folder above it in the same package."""
    out: Counter[str] = Counter()
    for path in _sources(root):
        here = _module_folder(root, path)
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
                continue
            names = [f"{node.module}.{a.name}" for a in node.names]
            targets = {t for t in (_target_path(root, n) for n in names) if t is not None}
            if not targets:
                target = _target_path(root, node.module)
                targets = {target} if target is not None else set()
            for target in targets:
                there = _module_folder(root, target)
                if target.name == "__init__.py":
                    there = there[:-1] if len(there) > 1 else there
                if there[:1] == here[:1] and len(there) < len(here) and here[: len(there)] == there:
                    out["/".join(here)] += 1
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("."))
    root = parser.parse_args().root.resolve()
    lines = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in _sources(root)}
    config_lines = sum(n for p, n in lines.items() if p.startswith("jobs/config/"))
    print(f"- lines of jobs/config/: {config_lines}")
    largest = sorted(lines.items(), key=lambda i: -i[1])[:5]
    print("- largest files: " + ", ".join(f"{p} {n}" for p, n in largest))
    print(f"- fields restated as Protocols: {restated(root)} of {schema_leaves(root)} schema keys")
    checks = range_checks(root)
    print(f"- hand-written range checks: {sum(checks.values())} ("
          + ", ".join(f"{p} {n}" for p, n in checks.items()) + ")")
    print(f"- declared rules comparing with a number: {declared_numeric_rules(root)}")
    files = setting_files(root)
    print(f"- files naming algo.{SETTING}: {len(files)} ({', '.join(files)})")
    up = upward_imports(root)
    print(f"- imports up to a folder above, per folder: {sum(up.values())} ("
          + ", ".join(f"{f} {n}" for f, n in sorted(up.items())) + ")")
    print(f"- function lines: {summary([n for n, _ in function_sizes.measure(root)[0]])}")


if __name__ == "__main__":
    main()
