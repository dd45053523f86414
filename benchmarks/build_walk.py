"""The build walk and the shape of jobs/, before (a git ref, checked out into a temporary folder) and after
(this tree), side by side: `python benchmarks/build_walk.py [--ref f4022bb]`.

The walk follows the config through system building: a profile hook records every call into the project's
modules (marl, rollout, learners, cluster, jobs) that receives the config (the run's, a policy's own, a
section of either) or the run layout holding it, while the tiny config (jobs/configs/tiny.yaml, in-process
groups, the HF stand-in) is built into its running system; what the run prepares beforehand (policy map or
layout, model folders) is done outside the walk, as the driver does. Consecutive calls within one module count
as one visit; `returns` counts the visits to a module the walk has already left once. `reader` is the same
walk over every call jobs/ code makes during the build, whatever its arguments (what a reader following the
build from the driver opens). Numbers are counts, not times: the box's load does not move them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run in the measured tree (its root is the working directory and on sys.path): builds the tiny system once
# under a profile hook and prints the two walks as JSON.
CHILD = r'''
import json, sys
from pathlib import Path
from omegaconf import DictConfig
ROOT = Path.cwd().resolve()
PKGS = ("marl", "rollout", "learners", "cluster", "jobs")
from jobs.config import load_config
from marl.tasks import get_family
OVERRIDES = ["rollout.engines_per_role=0", "learner.ranks=0", "out_dir=/tmp/walk"]
cfg = load_config("jobs/configs/tiny.yaml", OVERRIDES)
family = get_family("digit")
try:  # the layout of jobs/ by concern
    from jobs.driver.handles import build_handles as build
    from jobs.models.resolve import resolve_model
    from jobs.plan.layout import RunLayout, run_layout
    first, carriers = run_layout(cfg), (DictConfig, RunLayout)
except ImportError:  # the flat jobs/ (f4022bb)
    from jobs.models import resolve_model
    from jobs.policies import policy_map_of
    from jobs.system import build_system as build
    first, carriers = cfg, (DictConfig,)
path = resolve_model(cfg.model.path)
args = (first, path, family) if first is not cfg else (cfg, path, policy_map_of(cfg), family)

def module(frame):
    try:
        rel = Path(frame.f_code.co_filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    return ".".join(rel.with_suffix("").parts) if rel.parts[0] in PKGS else None

def carries(frame):
    code = frame.f_code
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    return any(isinstance(frame.f_locals.get(n), carriers) for n in names)

walks = {"config": [], "reader": []}
def hook(frame, event, arg):
    m = module(frame) if event == "call" else None
    if m is None:
        return
    if carries(frame):
        walks["config"].append(m)
    caller = module(frame.f_back) if frame.f_back is not None else None
    if caller is not None and caller.startswith("jobs"):
        walks["reader"].append(m)

sys.setprofile(hook)
handles = build(*args)
sys.setprofile(None)
handles.shutdown()
print(json.dumps(walks))
'''


@dataclass(frozen=True)
class Walk:
    modules: int  # distinct modules visited
    returns: int  # visits to a module the walk had already left
    visits: list[str]


def walk_of(calls: list[str]) -> Walk:
    """Distinct modules of a walk and how often it comes back to one it left
    (consecutive calls: one visit)."""
    visits = [m for i, m in enumerate(calls) if i == 0 or calls[i - 1] != m]
    seen: set[str] = set()
    returns = 0
    for m in visits:
        returns += m in seen
        seen.add(m)
    return Walk(len(seen), returns, visits)


def measure_walk(tree: Path) -> dict[str, Walk]:
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)},
                         capture_output=True, text=True, check=True, timeout=600)
    return {k: walk_of(v) for k, v in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def jobs_shape(tree: Path) -> dict[str, tuple[int, int]]:
    """jobs/ folder -> (Python modules, lines), the top level as `jobs/`."""
    out: dict[str, tuple[int, int]] = {}
    for path in sorted((tree / "jobs").rglob("*.py")):
        folder = str(path.parent.relative_to(tree)) + "/"
        n, lines = out.get(folder, (0, 0))
        out[folder] = (n + 1, lines + len(path.read_text().splitlines()))
    return out


def checkout(ref: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="f4022bb", help="the tree measured as `before`")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        before = checkout(args.ref, Path(d))
        shapes = {"before": jobs_shape(before), "after": jobs_shape(ROOT)}
        walks = {"before": measure_walk(before), "after": measure_walk(ROOT)}
    print(f"{'jobs/ folder':<18}{'before modules':>16}{'lines':>8}{'after modules':>16}{'lines':>8}")
    for folder in sorted(set(shapes["before"]) | set(shapes["after"])):
        b, a = shapes["before"].get(folder, (0, 0)), shapes["after"].get(folder, (0, 0))
        print(f"{folder:<18}{b[0]:>16}{b[1]:>8}{a[0]:>16}{a[1]:>8}")
    total = {k: tuple(map(sum, zip(*v.values(), strict=True))) for k, v in shapes.items()}
    print(
        f"{'total':<18}{total['before'][0]:>16}{total['before'][1]:>8}"
        f"{total['after'][0]:>16}{total['after'][1]:>8}"
    )
    print(f"\n{'build walk':<18}{'before modules':>16}{'returns':>8}{'after modules':>16}{'returns':>8}")
    for kind in ("config", "reader"):
        wb, wa = walks["before"][kind], walks["after"][kind]
        print(f"{kind:<18}{wb.modules:>16}{wb.returns:>8}{wa.modules:>16}{wa.returns:>8}")
    for when in ("before", "after"):
        print(f"\n{when}, the config's walk: {' > '.join(walks[when]['config'].visits)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
