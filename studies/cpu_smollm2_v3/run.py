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
import datetime as dt
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

TAG = "study-v3"
GATE = "jobs/configs/sweeps/cpu_study_v3_gate.yaml"
ARMS = "jobs/configs/sweeps/cpu_study_v3.yaml"
SEEDS = (0, 1, 2, 3, 4)
STORAGE = Path("runs/sweeps")
# The README's budget per cell, in minutes on a quiet box: a cell starts under --until only if this (or the
# longest this invocation measured for its arm, when longer) fits.
ESTIMATE_MIN = {"sa": 15.0, "sp": 43.0, "ip": 40.0, "gate": 50.0}
ARM_KEYS = {("single_agent", "shared"): "sa", ("voting", "shared"): "sp", ("voting", "isolated"): "ip"}


class StudyError(RuntimeError):
    """The study cannot run from here (another commit, a dirty tree) or a sweep failed."""


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout.strip()


def check_commit() -> str:
    """The pinned commit, when HEAD is it and the tree is clean; StudyError otherwise."""
    try:
        pinned = _git("rev-parse", f"{TAG}^{{commit}}")
    except subprocess.CalledProcessError:
        raise StudyError(f"no tag {TAG}: the study runs only from its pinned commit") from None
    head = _git("rev-parse", "HEAD")
    if head != pinned:
        raise StudyError(
            f"HEAD is {head[:12]}, the study's commit ({TAG}) is {pinned[:12]}: run it from a worktree "
            f"at the tag (git worktree add <dir> {TAG})"
        )
    if _git("status", "--porcelain", "--untracked-files=no"):
        raise StudyError("the tree has uncommitted changes: the runs would not record the pinned commit")
    return pinned


def cells(seeds: list[int]) -> list[tuple[int, dict]]:
    """(seed, arm) in the order they run: seed by seed, the arms in the sweep file's order."""
    arms = OmegaConf.to_container(OmegaConf.load(ARMS).grid.arm)
    assert isinstance(arms, list)
    return [(seed, arm) for seed in seeds for arm in arms]


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


def exported(export: Path, seed: int, arm: dict) -> bool:
    """Whether the cell's run is already in the study's folder (collect.py's destination: <arm>/seed<s>/)."""
    return (
        export / "runs" / f"{arm['marl.workflow']}-{arm['marl.sharing']}" / f"seed{seed}" / "metrics.jsonl"
    ).is_file()


def fits(until: dt.datetime | None, minutes: float) -> bool:
    return until is None or dt.datetime.now(dt.UTC) + dt.timedelta(minutes=minutes) <= until


def run_sweep_file(path: Path, name: str, nice: int) -> None:
    """Run (or resume, or skip when finished) one sweep; StudyError when it does not finish."""
    done = STORAGE / f"{name}.done"
    if done.exists():
        print(f"[study] {name}: finished earlier, skipped", flush=True)
        return
    resume = (STORAGE / name).is_dir()
    cmd = ["nice", "-n", str(nice), sys.executable, "-m", "jobs.sweep", "--config", str(path),
           *(["--resume"] if resume else [])]
    print(f"[study] {name}: {'resuming' if resume else 'starting'}: {' '.join(cmd)}", flush=True)
    rc = subprocess.call(cmd)
    if rc != 0:
        raise StudyError(f"{name}: jobs.sweep exited {rc} (130: interrupted; run this again to resume)")
    done.write_text("finished\n")


def export_sweep(name: str, export: Path | None, commit: str, gate: bool) -> None:
    if export is None:
        return
    # imports pyarrow and the report: only when exporting
    from studies.cpu_smollm2_v3.collect import copy_runs

    names = copy_runs(STORAGE / name, export / ("gate" if gate else "runs"), gate, commit)
    print(f"[study] {name}: exported {', '.join(names)} to {export}", flush=True)


def parse_until(text: str | None) -> dt.datetime | None:
    """HH:MM UTC, today or (when already past) tomorrow."""
    if text is None:
        return None
    now = dt.datetime.now(dt.UTC)
    hour, minute = (int(x) for x in text.split(":"))
    until = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    return until if until > now else until + dt.timedelta(days=1)


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
    until = parse_until(args.until)
    try:
        commit = check_commit()
        print(f"[study] commit {commit}", flush=True)
        STORAGE.mkdir(parents=True, exist_ok=True)
        if args.what == "gate":
            if args.export is not None and (args.export / "gate").is_dir():
                print("[study] the gate is exported already, skipped", flush=True)
            elif fits(until, ESTIMATE_MIN["gate"]):
                run_sweep_file(Path(GATE), "cpu_study_v3_gate", args.nice)
                export_sweep("cpu_study_v3_gate", args.export, commit, gate=True)
            else:
                print(
                    f"[study] the gate (~{ESTIMATE_MIN['gate']:.0f} min) does not fit before {args.until} "
                    "UTC",
                    flush=True,
                )
            return 0
        if args.answer_cap is None or args.aggregator_cap is None:
            raise StudyError(
                "arms need --answer-cap and --aggregator-cap (python -m studies.cpu_smollm2_v3.gate)"
            )
        measured: dict[str, float] = {}
        for seed, arm in cells(args.seeds):
            key = arm_key(arm)
            if args.export is not None and exported(args.export, seed, arm):
                print(f"[study] seed {seed} {key}: exported already, skipped", flush=True)
                continue
            estimate = max(ESTIMATE_MIN[key], measured.get(key, 0.0))
            if not fits(until, estimate):
                print(f"[study] seed {seed} {key}: ~{estimate:.0f} min does not fit before {args.until} UTC; "
                      "stopping here (run again to go on)", flush=True)
                return 0
            spec = cell_sweep(seed, arm, args.answer_cap, args.aggregator_cap)
            path = STORAGE / f"{spec['name']}.yaml"
            OmegaConf.save(OmegaConf.create(spec), path)
            start = time.monotonic()
            run_sweep_file(path, spec["name"], args.nice)
            measured[key] = max(measured.get(key, 0.0), (time.monotonic() - start) / 60)
            export_sweep(spec["name"], args.export, commit, gate=False)
    except StudyError as e:
        print(f"[study] {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
