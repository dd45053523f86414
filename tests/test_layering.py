"""The dependency direction and the vllm/deepspeed fences of ARCHITECTURE §3, checked on the source."""

from __future__ import annotations

import ast
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
# The only modules allowed to import these (lazily, inside an adapter).
FENCES = {"vllm": {"rollout/vllm_engine.py"}, "deepspeed": {"learners/deepspeed_backend.py"}}
MARL_FORBIDDEN = {"ray", "torch", "vllm", "deepspeed", "transformers"}
# Ray's API (object refs, actors, its exceptions) stays in cluster/ and the jobs/ entry points; benchmarks,
# tests and scripts are not layers. Every other top-level folder of Python code (a new one too) must not import it.
RAY_ALLOWED = {"cluster", "jobs"}
NOT_LAYERS = {"benchmarks", "tests", "scripts"}
# Inside jobs/: the entry points (jobs/*.py) may import every folder; below them each folder imports only these. The
# run (driver) assembles what config, models, plan and telemetry provide; the plan reads the config and the models'
# shapes; nothing below the entry points imports them.
JOBS_ALLOWED = {
    "jobs.models": {"jobs.models"},
    "jobs.config": {"jobs.config", "jobs.plan"},
    "jobs.plan": {"jobs.plan", "jobs.config", "jobs.models"},
    "jobs.telemetry": {"jobs.telemetry", "jobs.config"},
    "jobs.driver": {"jobs.driver", "jobs.config", "jobs.models", "jobs.plan", "jobs.telemetry"},
}
# The one config module that reads the planner: loading resolves learner.gradient_checkpointing=auto against the
# memory plan before the config is frozen. The rest of jobs/config is what the planner itself reads.
CONFIG_READS_PLAN = {"jobs/config/loading.py"}


def _modules(path: Path) -> set[str]:
    """Every module an import statement of `path` names, at any depth (lazy and TYPE_CHECKING imports too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)  # `from jobs import train` names jobs.train
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
            assert "ray" not in _imports(path), f"{path.relative_to(ROOT)} imports ray; only {RAY_ALLOWED} may"


def test_no_ray_outside_cluster_jobs_and_non_layers():
    folders = sorted(p.name for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".") and _sources(p.name))
    checked = [f for f in folders if f not in RAY_ALLOWED | NOT_LAYERS]
    assert {"marl", "rollout", "learners", "examples"} <= set(checked)
    for folder in checked:
        for path in _sources(folder):
            assert "ray" not in _imports(path), f"{path.relative_to(ROOT)} imports ray; only {RAY_ALLOWED} may"


def test_the_import_scan_sees_every_form_of_a_ray_import(tmp_path):
    forms = ["import ray", "import ray.util as u", "from ray import get", "from ray.exceptions import RayActorError",
             "def f():\n    import ray", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import ray"]
    for i, source in enumerate(forms):
        path = tmp_path / f"m{i}.py"
        path.write_text(source + "\n")
        assert "ray" in _imports(path), source
    (tmp_path / "clean.py").write_text("import rayon_like\nfrom .ray import x\nx = 'import ray'\n")
    assert "ray" not in _imports(tmp_path / "clean.py")


@pytest.mark.parametrize("folder", sorted(JOBS_ALLOWED))
def test_jobs_folders_point_one_way(folder):
    paths = _sources(folder.replace(".", "/"))
    assert paths, f"{folder} holds no modules"
    for path in paths:
        rel = str(path.relative_to(ROOT))
        reached = {_jobs_folder(m) for m in _modules(path) if m.startswith("jobs.") or m == "jobs"}
        allowed = JOBS_ALLOWED[folder] - ({"jobs.plan"} if folder == "jobs.config" and rel not in CONFIG_READS_PLAN
                                          else set())
        assert reached <= allowed, f"{rel} imports {sorted(reached - allowed)}; {folder} may import {sorted(allowed)}"


def test_jobs_holds_entry_points_and_folders_only():
    """Every module at jobs/'s top level is a command (`python -m jobs.<name>`); the rest lives in a folder."""
    entries = {p.stem for p in (ROOT / "jobs").glob("*.py")} - {"__init__"}
    for name in entries:
        source = (ROOT / "jobs" / f"{name}.py").read_text()
        assert 'if __name__ == "__main__":' in source, f"jobs/{name}.py is no entry point: move it into a folder"
    folders = {p.name for p in (ROOT / "jobs").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == {f.removeprefix("jobs.") for f in JOBS_ALLOWED}


def test_the_jobs_arrow_check_sees_entry_points_and_folders(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from jobs import train\nfrom jobs.driver.loop import attempt\nimport jobs.config.schema\n"
                    "def f():\n    from jobs.sweep import trial_config\n")
    assert {_jobs_folder(m) for m in _modules(path) if m.startswith("jobs")} == {"jobs", "jobs.driver", "jobs.config"}
