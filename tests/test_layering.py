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


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


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
