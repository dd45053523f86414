"""Study 4's runner: `python -m studies.cpu_smollm2_v4.run pilot --export DIR` runs the pilot (seed 100, one
cell per arm, 40 steps), and `python -m studies.cpu_smollm2_v4.run arms --steps N --export DIR` the study's
cells, seeds 0-10, one cell (seed x arm) at a time.

The order: seed by seed; in each seed single-agent first, then the two orchestrator-workers arms, shared first
in even seeds and isolated first in odd ones, so that neither arm always runs on the busier side of a seed.
Every cell runs from the commit the tag `study-v4` names, on a clean tree, or not at all, and is exported at
once to `DIR/runs/<arm>/seed<s>/` (the pilot's to `DIR/pilot/`), slimmed as study 3's were (metrics, config,
held-out curve, evaluation turns); a cell already exported is skipped, so the study resumes on a new machine
from what was committed. `--until HH:MM` (UTC) starts a cell only when its estimate fits before then.
`--steps N` is the horizon the README's pilot rule gives; the evaluations come every N/4 steps (five of them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from studies import cells as runner

TAG = "study-v4"
ARMS = "jobs/configs/sweeps/cpu_study_v4.yaml"
SEEDS = tuple(range(11))
PILOT_SEED = 100
PILOT_STEPS = 40
# The README's budget per cell at 40 steps, in minutes on a quiet box (scaled by steps / 40 for the training
# part, about half of a cell); a cell starts under --until only if this, or the longest this invocation
# measured for its arm, fits.
ESTIMATE_MIN = {"sa": 15.0, "sp": 75.0, "ip": 75.0}
ARM_KEYS = {("single_agent", "shared"): "sa", ("orch_workers", "shared"): "sp",
            ("orch_workers", "isolated"): "ip"}


def arm_key(arm: dict[str, Any]) -> str:
    return ARM_KEYS[(arm["marl.workflow"], arm["marl.sharing"])]


def arms() -> list[dict[str, Any]]:
    listed = OmegaConf.to_container(OmegaConf.load(ARMS).grid.arm)
    assert isinstance(listed, list)
    return listed


def cells(seeds: list[int]) -> list[tuple[int, dict[str, Any]]]:
    """(seed, arm) in the order they run: single-agent, then the multi-agent arms, swapped in odd seeds."""
    sa, sp, ip = sorted(arms(), key=lambda a: "sa sp ip".split().index(arm_key(a)))
    return [(seed, arm) for seed in seeds for arm in ((sa, sp, ip) if seed % 2 == 0 else (sa, ip, sp))]


def cell_sweep(seed: int, arm: dict[str, Any], steps: int) -> dict[str, Any]:
    """The sweep file of one cell: its seed and arm, and the horizon with evaluations every steps/4."""
    if steps % 4:
        raise runner.StudyError(f"--steps {steps}: the evaluations come every steps/4, so a multiple of 4")
    loaded = OmegaConf.to_container(OmegaConf.load(ARMS))
    assert isinstance(loaded, dict)
    spec: dict[str, Any] = {str(k): v for k, v in loaded.items()}
    kind = "pilot" if seed == PILOT_SEED else "s"
    spec["name"] = f"cpu_study_v4_{kind}{seed if kind == 's' else ''}_{arm_key(arm)}_h{steps}"
    spec["grid"] = {"seed": [seed], "arm": [arm]}
    spec["overrides"] += [f"steps={steps}", f"eval_every={steps // 4}"]
    return spec


def export(storage: Path, root: Path, commit: str) -> list[str]:
    """Study 3's slim export (provenance checked against `commit`) into `root`/<arm>/seed<s>/."""
    # imports pyarrow and the report: only when exporting
    from studies.cpu_smollm2_v3.collect import copy_runs

    return copy_runs(storage, root, False, commit)


def estimates(steps: int) -> dict[str, float]:
    """ESTIMATE_MIN at `steps`: the training half scales with the horizon, the five evaluations do not."""
    return {k: v / 2 + v / 2 * steps / PILOT_STEPS for k, v in ESTIMATE_MIN.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m studies.cpu_smollm2_v4.run", description=__doc__.split("\n")[0]
    )
    parser.add_argument("what", choices=["pilot", "arms"])
    parser.add_argument("--steps", type=int, help="arms: the horizon the README's pilot rule gave")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--export", type=Path, help="the study's folder in a checkout of main")
    parser.add_argument("--until", help="HH:MM UTC: start no cell whose estimate ends later")
    parser.add_argument("--nice", type=int, default=10, help="the sweeps' niceness (the box is shared)")
    args = parser.parse_args(argv)
    if args.what == "pilot":
        steps, seeds, folder = PILOT_STEPS, [PILOT_SEED], "pilot"
    elif args.steps is None:
        print("[study] arms need --steps (the README's horizon, decided from the pilot)", file=sys.stderr)
        return 2
    elif PILOT_SEED in args.seeds:
        print(f"[study] seed {PILOT_SEED} is the pilot's, not a study seed", file=sys.stderr)
        return 2
    else:
        steps, seeds, folder = args.steps, args.seeds, "runs"

    def sweep(seed: int, arm: dict[str, Any]) -> dict[str, Any]:
        return cell_sweep(seed, arm, steps)

    study = runner.Study(TAG, sweep, arm_key, estimates(steps), export, nice=args.nice)
    root = None if args.export is None else args.export / folder
    return runner.run_cells(study, cells(seeds), root, runner.parse_until(args.until))


if __name__ == "__main__":
    sys.exit(main())
