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
# Ray's API (object refs, actors, its exceptions) stays in cluster/ and the jobs/ entry points.
RAY_ALLOWED = {"cluster", "jobs"}


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
