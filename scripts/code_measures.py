"""The structure's measures, per package: `python scripts/code_measures.py [--root DIR]`.

Files and lines per package, returns and parameters annotated `Any`, the function-size distribution, code
lines over 110 characters, and the import circles among the project's modules (strongly connected components
of the module-level import graph, imports under `if TYPE_CHECKING:` included, since they bind modules to each
other in the reader's head as much as at run time). Read-only; prints a Markdown table and the circles.
"""

from __future__ import annotations

import argparse
import ast
import statistics
from pathlib import Path

PACKAGES = ("cluster", "marl", "rollout", "learners", "jobs")
WIDTH = 110


def _mentions_any(node: ast.expr | None) -> bool:
    return node is not None and any(isinstance(n, ast.Name) and n.id == "Any" or
                                    isinstance(n, ast.Attribute) and n.attr == "Any" for n in ast.walk(node))


def _module(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.Module, module: str, is_package: bool) -> set[str]:
    """The project modules `tree` imports (absolute and relative, `from a import b` counted as a.b or a)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def measure(root: Path) -> tuple[list[list[str]], list[list[str]]]:
    rows, sizes_all, graph = [], [], {}
    totals = [0, 0, 0, 0, 0]
    for package in PACKAGES:
        files = sorted((root / package).rglob("*.py"))
        lines = long = any_returns = any_params = 0
        sizes: list[int] = []
        for path in files:
            text = path.read_text()
            lines += len(text.splitlines())
            long += sum(len(line) > WIDTH for line in text.splitlines())
            tree = ast.parse(text)
            module = _module(root, path)
            graph[module] = _imports(tree, module, path.name == "__init__.py")
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    sizes.append((node.end_lineno or node.lineno) - node.lineno + 1)
                    any_returns += _mentions_any(node.returns)
                    args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                            *(a for a in (node.args.vararg, node.args.kwarg) if a)]
                    any_params += sum(_mentions_any(a.annotation) for a in args)
        sizes_all += sizes
        q = statistics.quantiles(sizes, n=10) if len(sizes) > 1 else [0] * 9
        rows.append([package, str(len(files)), str(lines), str(any_returns), str(any_params), str(long),
                     f"{statistics.median(sizes):g} / {q[8]:g} / {max(sizes)}" if sizes else "–"])
        for i, v in enumerate((len(files), lines, any_returns, any_params, long)):
            totals[i] += v
    q = statistics.quantiles(sizes_all, n=10)
    sizes_cell = f"{statistics.median(sizes_all):g} / {q[8]:g} / {max(sizes_all)}"
    rows.append(["**all**", *map(str, totals), sizes_cell])
    known = set(graph)
    edges = {m: {i for i in imps if i in known and i != m} for m, imps in graph.items()}
    return rows, _circles(edges)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("."))
    args = parser.parse_args()
    rows, circles = measure(args.root)
    head = ["package", "files", "lines", "returns naming Any", "parameters naming Any", f"lines > {WIDTH}",
            "function lines median / p90 / max"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print(f"\nimport circles ({len(circles)}):")
    for c in circles:
        print("  " + " <-> ".join(c))


if __name__ == "__main__":
    main()
