"""The dependency direction and the vllm/deepspeed fences of ARCHITECTURE §3, checked on the source."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"marl", "rollout", "learners", "cluster", "jobs"}
ALLOWED = {
    "marl": {"marl"},
    "cluster": {"cluster"},
    "rollout": {"rollout", "marl", "cluster"},
    "learners": {"learners", "marl", "cluster"},
    "jobs": OURS,
}
# The only modules allowed to import these (lazily, inside an adapter). vLLM's weight-transfer engines have
# two sides: the worker's (rollout/vllm/worker.py, imported by vLLM itself inside its worker, so at top
# level) and the trainer's (cluster/weight_transfer.py, lazily, on the CUDA path only: the gloo path and the
# driver run without vllm).
FENCES = {"vllm": {"rollout/vllm/engine.py", "rollout/vllm/worker.py", "cluster/weight_transfer.py"},
          "deepspeed": {"learners/gradients/deepspeed_backend.py"}}
MARL_FORBIDDEN = {"ray", "torch", "vllm", "deepspeed", "transformers"}
# Ray's API (object refs, actors, its exceptions) stays in cluster/ and the jobs/ entry points;
# benchmarks, tests and scripts are not layers. Every other top-level folder of Python code (a new
# one too) must not import it.
RAY_ALLOWED = {"cluster", "jobs"}
NOT_LAYERS = {"benchmarks", "tests", "scripts"}
# Inside jobs/: the entry points (jobs/*.py) may import every folder; below them each folder imports only
# these. The run (driver) assembles what config, models, plan and telemetry provide; the plan reads the config
# and the models' shapes; nothing below the entry points imports them, except the site's computed pages
# (commands themselves, `python -m jobs.pages.<page>`), which read the config, the models, the plan and a
# sweep's trials as `jobs.sweep` resolves them.
JOBS_ALLOWED = {
    "jobs.models": {"jobs.models"},
    "jobs.config": {"jobs.config"},
    "jobs.plan": {"jobs.plan", "jobs.config", "jobs.models"},
    "jobs.telemetry": {"jobs.telemetry", "jobs.config"},
    "jobs.driver": {"jobs.driver", "jobs.config", "jobs.models", "jobs.plan", "jobs.telemetry"},
    "jobs.pages": {"jobs", "jobs.pages", "jobs.config", "jobs.models", "jobs.plan"},
}


def _modules(path: Path) -> set[str]:
    """Every module an import statement of `path` names, at any depth (lazy and TYPE_CHECKING imports too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            # `from jobs import train` names jobs.train
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _imports(path: Path) -> set[str]:
    return {name.split(".")[0] for name in _modules(path)}


def _jobs_folder(module: str) -> str:
    """`jobs.<folder>` for a module of a jobs/ folder, `jobs` for an entry point (jobs/*.py)."""
    parts = module.split(".")
    return f"jobs.{parts[1]}" if len(parts) > 1 and (ROOT / "jobs" / parts[1]).is_dir() else "jobs"


def _sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_dependencies_point_one_way(package):
    for path in _sources(package):
        ours = _imports(path) & OURS
        assert ours <= ALLOWED[package], f"{path.relative_to(ROOT)} imports {sorted(ours - ALLOWED[package])}"


@pytest.mark.parametrize("library", sorted(FENCES))
def test_heavy_backends_are_fenced(library):
    for package in OURS:
        for path in _sources(package):
            rel = str(path.relative_to(ROOT))
            if library in _imports(path):
                assert rel in FENCES[library], f"{rel} imports {library}; only {FENCES[library]} may"


def test_marl_is_pure_python():
    for path in _sources("marl"):
        bad = _imports(path) & MARL_FORBIDDEN
        assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"


def test_ray_stays_in_cluster_and_jobs():
    for package in OURS - RAY_ALLOWED:
        for path in _sources(package):
            assert "ray" not in _imports(path), (
                f"{path.relative_to(ROOT)} imports ray; only {RAY_ALLOWED} may"
            )


def test_no_ray_outside_cluster_jobs_and_non_layers():
    folders = sorted(
        p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".") and _sources(p.name)
    )
    checked = [f for f in folders if f not in RAY_ALLOWED | NOT_LAYERS]
    assert {"marl", "rollout", "learners", "examples"} <= set(checked)
    for folder in checked:
        for path in _sources(folder):
            assert "ray" not in _imports(path), (
                f"{path.relative_to(ROOT)} imports ray; only {RAY_ALLOWED} may"
            )


def test_the_import_scan_sees_every_form_of_a_ray_import(tmp_path):
    forms = [
        "import ray",
        "import ray.util as u",
        "from ray import get",
        "from ray.exceptions import RayActorError",
        "def f():\n    import ray",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import ray",
    ]
    for i, source in enumerate(forms):
        path = tmp_path / f"m{i}.py"
        path.write_text(source + "\n")
        assert "ray" in _imports(path), source
    (tmp_path / "clean.py").write_text("import rayon_like\nfrom .ray import x\nx = 'import ray'\n")
    assert "ray" not in _imports(tmp_path / "clean.py")


# Import circles among our modules. Every import counts, at module level or inside a function (a lazy import
# still ties the two modules together; it only postpones the failure), except under `if TYPE_CHECKING:`, which
# never runs. A circle listed here is known and must stay exactly as listed: breaking it fails the test until
# it is removed from the list, so the list never outlives the circle.
KNOWN_CYCLES: set[frozenset[str]] = set()


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of `modules` that `path` imports (`from a import b` is module a.b when that is one)."""
    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def walk(node: ast.AST) -> list[str]:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return [name for child in node.orelse for name in walk(child)]
        if isinstance(node, ast.Import):
            return [a.name for a in node.names]
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            return [f"{node.module}.{a.name}" for a in node.names]
        return [name for child in ast.iter_child_nodes(node) for name in walk(child)]

    found = {resolve(name) for name in walk(ast.parse(path.read_text(), filename=str(path)))}
    return {m for m in found if m is not None}


def import_cycles(root: Path, packages: set[str]) -> set[frozenset[str]]:
    """The sets of modules under `packages` that import each other in a circle (strongly connected components
    of the import graph with more than one module, or a module importing itself)."""
    paths = {_module_name(p, root): p for package in packages for p in sorted((root / package).rglob("*.py"))}
    graph = {m: _module_imports(p, set(paths)) for m, p in paths.items()}
    reach = {m: _reachable(graph, m) for m in graph}
    return {frozenset(n for n in reach[m] if m in reach[n]) | {m} for m in graph if m in reach[m]}


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(graph[m])
    return seen


def test_no_import_cycles_among_our_modules():
    cycles = import_cycles(ROOT, OURS)
    assert cycles - KNOWN_CYCLES == set(), f"import circles: {[sorted(c) for c in cycles - KNOWN_CYCLES]}"
    assert KNOWN_CYCLES - cycles == set(), (
        f"no longer circles, drop them from KNOWN_CYCLES: {KNOWN_CYCLES - cycles}"
    )


def test_the_cycle_scan_sees_lazy_imports_and_skips_type_checking(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from p import b\n")
    (pkg / "b.py").write_text("def f():\n    from p.c import g\n")
    (pkg / "c.py").write_text("import p.a\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import a\n")
    (pkg / "e.py").write_text("import p.d\n")
    assert import_cycles(tmp_path, {"p"}) == {frozenset({"p.a", "p.b", "p.c"})}
    (pkg / "d.py").write_text("from p import e\n")
    assert import_cycles(tmp_path, {"p"}) == {frozenset({"p.a", "p.b", "p.c"}), frozenset({"p.d", "p.e"})}


@pytest.mark.parametrize("folder", sorted(JOBS_ALLOWED))
def test_jobs_folders_point_one_way(folder):
    paths = _sources(folder.replace(".", "/"))
    assert paths, f"{folder} holds no modules"
    for path in paths:
        rel = str(path.relative_to(ROOT))
        reached = {_jobs_folder(m) for m in _modules(path) if m.startswith("jobs.") or m == "jobs"}
        allowed = JOBS_ALLOWED[folder]
        assert reached <= allowed, (
            f"{rel} imports {sorted(reached - allowed)}; {folder} may import {sorted(allowed)}"
        )


def test_jobs_holds_entry_points_and_folders_only():
    """Every module at jobs/'s top level is a command (`python -m jobs.<name>`);
    the rest lives in a folder."""
    entries = {p.stem for p in (ROOT / "jobs").glob("*.py")} - {"__init__"}
    for name in entries:
        source = (ROOT / "jobs" / f"{name}.py").read_text()
        assert 'if __name__ == "__main__":' in source, (
            f"jobs/{name}.py is no entry point: move it into a folder"
        )
    folders = {p.name for p in (ROOT / "jobs").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == {f.removeprefix("jobs.") for f in JOBS_ALLOWED}


def test_the_jobs_arrow_check_sees_entry_points_and_folders(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "from jobs import train\nfrom jobs.driver.loop import attempt\nimport jobs.config.schema\n"
        "def f():\n    from jobs.sweep import trial_config\n"
    )
    assert {_jobs_folder(m) for m in _modules(path) if m.startswith("jobs")} == {
        "jobs",
        "jobs.driver",
        "jobs.config",
    }


# Each module of ours imported first, in a fresh process: a circle through a package's __init__
# (importing jobs.config.x runs jobs/config/__init__.py first) passes the scan above but fails at
# import in whichever order a fresh Ray worker happens to import. The parent loads the heavy libraries
# once and forks a child per module.
FIRST_IMPORT = """
import importlib, os, sys
import omegaconf, ray, torch, transformers  # noqa: F401 - loaded once, shared by the forked children
failed = []
for name in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException as e:
            print(f"{name}: {type(e).__name__}: {e}", flush=True)
            os._exit(1)
        os._exit(0)
    if os.waitpid(pid, 0)[1] != 0:
        failed.append(name)
sys.exit(1 if failed else 0)
"""


@pytest.mark.slow  # one fork per module after loading torch and Ray: ~15-35 s on 2 cores
def test_every_module_imports_first_in_a_fresh_process():
    modules = sorted(_module_name(p, ROOT) for package in ("jobs", "learners", "rollout", "cluster", "marl")
                     for p in (ROOT / package).rglob("*.py"))
    done = subprocess.run(
        [sys.executable, "-c", FIRST_IMPORT, *modules],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


# A GPU machine that measures the learner (benchmarks/gpu_check.sh) may have torch and DeepSpeed but no Ray or
# vLLM: the learner, its DeepSpeed backend, the config, the planner, and the bucket and IPC sender code that
# benchmarks/gpu_questions.py runs there, must import there.
WITHOUT_RAY = """
import importlib, sys
for blocked in ("ray", "vllm"):
    sys.modules[blocked] = None  # any import of them now fails
for name in sys.argv[1:]:
    importlib.import_module(name)
"""


def test_the_learner_config_and_planner_import_without_ray_or_vllm():
    modules = ["jobs.config", "jobs.models.resolve", "jobs.plan.planner", "learners.learner",
               "learners.gradients.deepspeed_backend", "cluster.buckets", "cluster.weight_transfer",
               "benchmarks.gpu_questions"]
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_RAY, *modules],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
