"""The function-size tail: `python scripts/function_sizes.py [--root DIR] [--over 30] [--classes 5]`.

Over the packages (cluster, marl, rollout, learners, jobs; tests, benchmarks, examples and scripts are not
counted): the distribution of function lengths (median, p90, max, how many are over 30 and over 40 lines),
each function over `--over` lines by its qualified name, and the longest classes. A function's length is
its `def` line to its last line, its docstring included and its decorators not, the way
scripts/code_measures.py counts it, so the two agree. Read-only.
"""

from __future__ import annotations

import argparse
import ast
import statistics
from collections.abc import Iterator
from pathlib import Path

PACKAGES = ("cluster", "marl", "rollout", "learners", "jobs")


def _length(node: ast.AST) -> int:
    return (node.end_lineno or node.lineno) - node.lineno + 1  # type: ignore[attr-defined]


def _defs(node: ast.AST, prefix: str) -> Iterator[tuple[str, ast.AST]]:
    """(qualified name, node) of every function and class under `node`, nested ones included."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = f"{prefix}.{child.name}" if prefix else child.name
            yield name, child
            yield from _defs(child, name)
        else:
            yield from _defs(child, prefix)


def measure(root: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """([(lines, path:qualified name)] of every function, the same of every class)."""
    functions, classes = [], []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            where = path.relative_to(root).as_posix()
            for name, node in _defs(ast.parse(path.read_text()), ""):
                out = classes if isinstance(node, ast.ClassDef) else functions
                out.append((_length(node), f"{where}:{name}"))
    return functions, classes


def summary(sizes: list[int]) -> str:
    """The distribution line both this script and scripts/config_measures.py print."""
    p90 = statistics.quantiles(sizes, n=10)[8]
    return (f"median {statistics.median(sizes):g}, p90 {p90:g}, max {max(sizes)}, "
            f"> 30: {sum(s > 30 for s in sizes)}, > 40: {sum(s > 40 for s in sizes)} (of {len(sizes)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("."))
    parser.add_argument("--over", type=int, default=30, help="list the functions longer than this")
    parser.add_argument("--classes", type=int, default=5, help="list this many of the longest classes")
    args = parser.parse_args()
    functions, classes = measure(args.root)
    print(f"function lines over {', '.join(PACKAGES)}: {summary([n for n, _ in functions])}")
    print(f"\nfunctions over {args.over} lines:")
    for n, name in sorted(functions, key=lambda f: (-f[0], f[1])):
        if n > args.over:
            print(f"  {n:3d}  {name}")
    print("\nlongest classes:")
    for n, name in sorted(classes, key=lambda c: (-c[0], c[1]))[: args.classes]:
        print(f"  {n:3d}  {name}")


if __name__ == "__main__":
    main()
