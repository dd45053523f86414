"""Resume equivalence: N steps in one go and k steps + stop + resume for N - k steps end with the same
weights and the same per-step rewards and losses (fixed seeds, CPU)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from cluster.stop import StopRequested
from jobs.config import load_config
from jobs.driver import run_checkpoints as ckpt
from jobs.telemetry.tracking import read_metrics
from jobs.train import train

TINY = "jobs/configs/tiny.yaml"
ROOT = Path(__file__).resolve().parents[2]
# train_size is a multiple of prompts_per_step: an epoch ends every 2 steps, so a stop at step 2 sits exactly
# on an epoch boundary and the resumed run must start the next epoch's shuffle.
SHAPE = [
    "data.train_size=8",
    "rollout.prompts_per_step=4",
    "rollout.samples_per_prompt=4",
    "data.eval_size=4",
    "marl.workflow=voting",
    "marl.sharing=isolated",
    "checkpoint.every=1",
    "ray.num_cpus=2",
    # Equal to the bit: each batch's composition fixed by the workflow. Streamed requests draw the same
    # tokens whatever they are batched with, but the padding they share moves their logprobs by ~1e-7.
    "rollout.mode=lockstep",
]
COMPARED = ("reward/mean", "loss/generator", "loss/aggregator", "grad/norm/generator", "grad/norm/aggregator",
            "reward/mean/generator", "response_len/mean/generator")


# The runs ask for ray.num_cpus=2: the `ray_cluster` fixture (tests/conftest.py)
# starts a cluster of that size.
RAY_CPUS = 2


class StopAfter:
    """Raises a stop once step `k - 1` is done (k steps completed), as the SIGTERM handler would; records the
    checkpoint folder each step reported."""

    def __init__(self, k: int):
        self.k = k
        self.checkpoints: list = []

    def on_step(self, step, metrics, checkpoint):
        self.checkpoints.append(checkpoint)
        if step + 1 == self.k:
            raise StopRequested("test stop")


def _cfg(out: Path, *overrides: str):
    return load_config(TINY, [f"out_dir={out}", *SHAPE, *overrides])


def _final_weights(out: Path, steps: int) -> dict[str, dict[str, torch.Tensor]]:
    folder = out / "tiny" / "checkpoints" / f"step_{steps}" / "policies"
    return {p.name: torch.load(p / "model.pt")["weights"] for p in sorted(folder.iterdir())}


def _per_step(out: Path) -> dict[int, dict[str, float]]:
    return {
        r["step"]: {k: r[k] for k in COMPARED if k in r}
        for r in read_metrics(out / "tiny")
        if "reward/mean" in r
    }


def _assert_same_run(a: Path, b: Path, steps: int) -> None:
    wa, wb = _final_weights(a, steps), _final_weights(b, steps)
    assert wa.keys() == wb.keys()
    for pid in wa:
        diff = max((wa[pid][k] - wb[pid][k]).abs().max().item() for k in wa[pid])
        assert diff == 0.0, f"policy {pid}: max abs weight difference {diff}"
    ma, mb = _per_step(a), _per_step(b)
    assert sorted(ma) == sorted(mb) == list(range(steps))  # no duplicate and no missing step lines
    assert ma == mb


@pytest.mark.parametrize("k", [2, 1], ids=["stop-at-epoch-end", "stop-mid-epoch"])
def test_stop_and_resume_equals_an_uninterrupted_run(ray_cluster, tmp_path, k):
    steps = 4
    whole = tmp_path / "whole"
    train(_cfg(whole, f"steps={steps}", "rollout.engines_per_role=0", "learner.ranks=0"))
    parts = tmp_path / "parts"
    cfg = _cfg(parts, f"steps={steps}", "rollout.engines_per_role=0", "learner.ranks=0")
    stopper = StopAfter(k)
    with pytest.raises(StopRequested):
        train(cfg, callbacks=(stopper,))
    root = parts / "tiny" / "checkpoints"
    assert (root / "latest").read_text() == f"step_{k}"
    # the committed folder, each step
    assert stopper.checkpoints == [root / f"step_{s + 1}" for s in range(k)]
    summary = train(cfg)  # resume=auto
    _assert_same_run(whole, parts, steps)
    # The engines were re-synced to the restored weights before the first resumed rollout.
    versions = pq.read_table(parts / "tiny" / "rollouts" / f"step_{k:06d}.parquet")["version"].to_pylist()
    assert set(versions) == {k}
    assert summary["train/failures"] == 0.0


@pytest.mark.slow
def test_resume_through_ray_actors_and_sigterm(tmp_path):
    """The CLI as `ray job stop` meets it: SIGTERM mid-run, exit 143 saying why,
    then the same command resumes;
    learner and engines are Ray actors. The stop lands wherever the run is, so equality is checked against an
    uninterrupted run up to the steps both completed."""
    steps = 6
    common = [*SHAPE, f"steps={steps}", "rollout.engines_per_role=1", "learner.ranks=1"]
    cmd = [sys.executable, "-m", "jobs.train", "--config", TINY]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert subprocess.run([*cmd, f"out_dir={whole}", *common], cwd=ROOT, capture_output=True).returncode == 0
    stderr = tmp_path / "stderr.txt"  # a file, not a pipe: nobody reads it while the run writes
    with open(stderr, "w") as err:
        proc = subprocess.Popen([*cmd, f"out_dir={parts}", *common], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=err, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("step 2/"):
                break
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 143
    finally:
        proc.kill()
    assert "stopped by signal" in stderr.read_text()
    stopped_at = ckpt.read_progress(ckpt.newest(parts / "tiny" / "checkpoints")).step
    assert 2 <= stopped_at < steps
    out = subprocess.run([*cmd, f"out_dir={parts}", *common], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and f"resumed from {parts / 'tiny' / 'checkpoints'}" in out.stdout
    _assert_same_run(whole, parts, steps)
