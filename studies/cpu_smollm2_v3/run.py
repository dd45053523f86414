"""Study 3's runner, resumable across machines: `python -m studies.cpu_smollm2_v3.run gate --export DIR` runs
the viability gate, and
`python -m studies.cpu_smollm2_v3.run arms --answer-cap N --aggregator-cap M --export DIR` the arms, one cell
(seed x arm) at a time, seed by seed with the arms interleaved (SA s0, SP s0, IP s0, SA s1, ...).

Every sweep runs from the commit the tag `study-v3` names, on a clean tree, or not at all: the study's runs
must all record that one commit (collect.py refuses any other). Each finished cell is exported at once,
slimmed by collect.py (metrics, config, held-out curve, evaluation turns), to `DIR/runs/<arm>/seed<s>/` (the
gate to `DIR/gate/`): DIR is the study's folder in a checkout of main, where the exports are committed. A cell
whose export is already there is skipped, so the study resumes on a new machine from what was committed; a
cell interrupted on the same machine resumes from its newest checkpoint. `--until HH:MM` (UTC) starts a cell
only when its estimated time fits before then, so a session's end does not cut a cell. Each cell's sweep file
is written beside its folder (`runs/sweeps/<name>.yaml`), so what ran can be read back.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from studies import cells as runner
from studies.cells import StudyError, fits, parse_until

__all__ = ["StudyError", "cell_sweep", "cells", "check_commit", "exported", "fits", "main", "parse_until"]

TAG = "study-v3"
GATE = "jobs/configs/sweeps/cpu_study_v3_gate.yaml"
ARMS = "jobs/configs/sweeps/cpu_study_v3.yaml"
SEEDS = (0, 1, 2, 3, 4)
# The README's budget per cell, in minutes on a quiet box: a cell starts under --until only if this (or the
# longest this invocation measured for its arm, when longer) fits.
ESTIMATE_MIN = {"sa": 15.0, "sp": 43.0, "ip": 40.0, "gate": 50.0}
ARM_KEYS = {("single_agent", "shared"): "sa", ("voting", "shared"): "sp", ("voting", "isolated"): "ip"}


def check_commit() -> str:
    """The pinned commit, when HEAD is it and the tree is clean; StudyError otherwise."""
    return runner.check_commit(TAG)


def cells(seeds: list[int]) -> list[tuple[int, dict]]:
    """(seed, arm) in the order they run: seed by seed, the arms in the sweep file's order."""
    arms = OmegaConf.to_container(OmegaConf.load(ARMS).grid.arm)
    assert isinstance(arms, list)
    return [(seed, arm) for seed in seeds for arm in arms]


def exported(export: Path, seed: int, arm: dict) -> bool:
    """Whether the cell's run is in the study's folder already (collect.py's runs/<arm>/seed<s>/)."""
    return runner.exported(export / "runs", seed, arm)


def arm_key(arm: dict) -> str:
    return ARM_KEYS[(arm["marl.workflow"], arm["marl.sharing"])]


def cell_sweep(seed: int, arm: dict, answer_cap: int, aggregator_cap: int) -> dict:
    """The sweep file of one cell, the caps added: the answering roles' cap for every arm, the aggregator's
    for the voting arms (a role cap names a role of the workflow)."""
    spec = OmegaConf.to_container(OmegaConf.load(ARMS))
    assert isinstance(spec, dict)
    spec["name"] = f"cpu_study_v3_s{seed}_{arm_key(arm)}"
    spec["grid"] = {"seed": [seed], "arm": [arm]}
    spec["overrides"].append(f"rollout.sampling.max_new_tokens={answer_cap}")
    if arm["marl.workflow"] == "voting":
        spec["overrides"].append(f"rollout.role_max_new_tokens.aggregator={aggregator_cap}")
    return spec


def _export(gate: bool):  # noqa: ANN202 - a runner.Export
    def export(storage: Path, root: Path, commit: str) -> list[str]:
        # imports pyarrow and the report: only when exporting
        from studies.cpu_smollm2_v3.collect import copy_runs

        return copy_runs(storage, root / ("gate" if gate else "runs"), gate, commit)

    return export


def _gate(args: argparse.Namespace) -> int:
    if args.export is not None and (args.export / "gate").is_dir():
        print("[study] the gate is exported already, skipped", flush=True)
        return 0
    if not fits(parse_until(args.until), ESTIMATE_MIN["gate"]):
        print(f"[study] the gate (~{ESTIMATE_MIN['gate']:.0f} min) does not fit before {args.until} UTC",
              flush=True)
        return 0
    try:
        commit = check_commit()
        print(f"[study] commit {commit}", flush=True)
        runner.STORAGE.mkdir(parents=True, exist_ok=True)
        runner.run_sweep_file(Path(GATE), "cpu_study_v3_gate", args.nice)
        if args.export is not None:
            names = _export(True)(runner.STORAGE / "cpu_study_v3_gate", args.export, commit)
            print(f"[study] cpu_study_v3_gate: exported {', '.join(names)} to {args.export}", flush=True)
    except StudyError as e:
        print(f"[study] {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m studies.cpu_smollm2_v3.run", description=__doc__.split("\n")[0]
    )
    parser.add_argument("what", choices=["gate", "arms"])
    parser.add_argument("--answer-cap", type=int, help="arms: the answering roles' cap (the gate's rule)")
    parser.add_argument("--aggregator-cap", type=int, help="arms: voting's aggregator cap (the gate's rule)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument(
        "--export", type=Path, help="the study's folder in a checkout of main (exports, skips)"
    )
    parser.add_argument("--until", help="HH:MM UTC: start no cell whose estimate ends later")
    parser.add_argument("--nice", type=int, default=10, help="the sweeps' niceness (the box is shared)")
    args = parser.parse_args(argv)
    if args.what == "gate":
        return _gate(args)
    if args.answer_cap is None or args.aggregator_cap is None:
        print("[study] arms need --answer-cap and --aggregator-cap (python -m studies.cpu_smollm2_v3.gate)",
              file=sys.stderr)
        return 2
    caps = (args.answer_cap, args.aggregator_cap)

    def sweep(seed: int, arm: dict[str, Any]) -> dict[str, Any]:
        # through the module attribute, so that checkpointed.py's replacement applies
        return sys.modules[__name__].cell_sweep(seed, arm, *caps)

    study = runner.Study(TAG, sweep, arm_key, ESTIMATE_MIN, _export(False), nice=args.nice)
    root = None if args.export is None else args.export / "runs"
    return runner.run_cells(study, cells(args.seeds), root, parse_until(args.until))


if __name__ == "__main__":
    sys.exit(main())
