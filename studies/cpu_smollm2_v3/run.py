"""Study 3's runner, resumable: `python -m studies.cpu_smollm2_v3.run gate` runs the viability gate, and
`python -m studies.cpu_smollm2_v3.run arms --answer-cap N --aggregator-cap M` the arms seed by seed (one sweep
per seed, its arms in the file's order: single-agent, voting shared, voting isolated).

Every sweep runs from the commit the tag `study-v3` names, on a clean tree, or not at all: the study's runs
must all record that one commit (collect.py refuses any other). Run it again after an interruption (a session
that ended, a machine that restarted): a seed whose sweep finished is skipped, an interrupted one resumes from
its trials' newest checkpoints, the rest start fresh. Each seed's sweep file is written, with the caps added to
it, beside the sweep's folder (`runs/sweeps/<name>.yaml`), so what ran can be read back.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

TAG = "study-v3"
GATE = "jobs/configs/sweeps/cpu_study_v3_gate.yaml"
ARMS = "jobs/configs/sweeps/cpu_study_v3.yaml"
SEEDS = (0, 1, 2, 3, 4)
STORAGE = Path("runs/sweeps")


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
        raise StudyError(f"HEAD is {head[:12]}, the study's commit ({TAG}) is {pinned[:12]}: run it from a worktree "
                         f"at the tag (git worktree add <dir> {TAG})")
    if _git("status", "--porcelain", "--untracked-files=no"):
        raise StudyError("the tree has uncommitted changes: the runs would not record the pinned commit")
    return pinned


def seed_sweep(seed: int, answer_cap: int, aggregator_cap: int) -> dict:
    """The arms' sweep file for one seed, the caps added: answering roles' cap for every trial, the aggregator's
    for the voting arms (a role cap names a role of the workflow)."""
    spec = OmegaConf.to_container(OmegaConf.load(ARMS))
    assert isinstance(spec, dict)
    spec["name"] = f"cpu_study_v3_s{seed}"
    spec["grid"]["seed"] = [seed]
    spec["overrides"].append(f"rollout.sampling.max_new_tokens={answer_cap}")
    spec.setdefault("where", []).append({"when": {"marl.workflow": ["voting"]},
                                         "set": {"rollout.role_max_new_tokens.aggregator": aggregator_cap}})
    return spec


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.cpu_smollm2_v3.run", description=__doc__.split("\n")[0])
    parser.add_argument("what", choices=["gate", "arms"])
    parser.add_argument("--answer-cap", type=int, help="arms: the answering roles' cap (the gate's rule)")
    parser.add_argument("--aggregator-cap", type=int, help="arms: voting's aggregator cap (the gate's rule)")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    parser.add_argument("--nice", type=int, default=10, help="the sweeps' niceness (the box is shared)")
    args = parser.parse_args(argv)
    try:
        commit = check_commit()
        print(f"[study] commit {commit}", flush=True)
        STORAGE.mkdir(parents=True, exist_ok=True)
        if args.what == "gate":
            run_sweep_file(Path(GATE), "cpu_study_v3_gate", args.nice)
            return 0
        if args.answer_cap is None or args.aggregator_cap is None:
            raise StudyError("arms need --answer-cap and --aggregator-cap (python -m studies.cpu_smollm2_v3.gate)")
        for seed in args.seeds:
            spec = seed_sweep(seed, args.answer_cap, args.aggregator_cap)
            path = STORAGE / f"{spec['name']}.yaml"
            OmegaConf.save(OmegaConf.create(spec), path)
            run_sweep_file(path, spec["name"], args.nice)
    except StudyError as e:
        print(f"[study] {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
