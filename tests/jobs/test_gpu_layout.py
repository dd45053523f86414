"""rollout.layout=colocated (the paper's hybrid engine): its refusals at load, one placement bundle per GPU
holding engine i and rank i of every learner group, the plan by phase, and whole runs on CPU that train
exactly the weights of the separate layout while the engines sleep and the learners offload every step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cluster.bundles import layout
from jobs.config import ConfigError, load_config
from jobs.plan.layout import run_layout
from jobs.plan.planner import FIT_FRACTION, make_plan
from jobs.plan.report import format_plan
from jobs.telemetry.tracking import read_metrics
from jobs.train import train
from learners.compute.memory import GIB

TINY = "jobs/configs/tiny.yaml"
RAY_CPUS = 2  # the shape of tests/jobs/test_resume.py's cluster: one shared `ray_cluster` start
LORA = ["model.lora.enabled=true", "model.lora.rank=4", "model.dtype=float32"]
MULTI = [*LORA, "rollout.lora_serving=multi"]
COLOCATED = "rollout.layout=colocated"
QWEN4B = "builtin:qwen3-4b-shape?vocab=151936"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([COLOCATED], "rollout.layout=colocated needs one engine group serving every role"),
        ([*MULTI, COLOCATED, "learner.ranks=2"],
         "learner.ranks=2: rollout.layout=colocated puts learner rank i on engine i's GPU"),
        ([*MULTI, COLOCATED, "rollout.one_step_off_policy=true", "algo.old_logprobs=rollout"],
         "rollout.one_step_off_policy needs rollout.layout=separate"),
        ([*MULTI, COLOCATED, "sync.transport=nccl"], "sync.transport=nccl cannot run under rollout.layout"),
        ([*MULTI, "sync.transport=ipc"], "sync.transport=ipc hands CUDA memory to a process on the same GPU"),
        ([*MULTI, COLOCATED, "sync.transport=ipc"], "sync.transport=ipc needs rollout.backend=vllm engines"),
        # (learner.backend=deepspeed: rank_num_gpus > 0 needs a backend that trains on GPUs, a section rule
        # config load checks before the transport)
        ([*MULTI, COLOCATED, "sync.transport=ipc", "rollout.backend=vllm", "rollout.engine_num_gpus=0.5",
          "learner.rank_num_gpus=0.5", "learner.lora_colocate=true", "learner.backend=deepspeed"],
         # the layout's rules pass (the IPC sender exists: cluster.weight_transfer.broadcast_ipc); this
         # machine's lack of CUDA is what refuses it
         "config: sync.transport=ipc needs CUDA; use object_store on this machine"),
        ([*MULTI, COLOCATED, "sync.transport=ipc", "rollout.backend=vllm", "rollout.engine_num_gpus=0.5",
          "learner.rank_num_gpus=0.5", "learner.backend=deepspeed", "learner.deepspeed.zero_stage=3",
          "rollout.engines_per_role=2", "learner.ranks=2"],
         "sync.transport=ipc with learner.deepspeed.zero_stage=3 and 2 learner ranks"),
        ([*MULTI, COLOCATED, "rollout.backend=vllm"], "needs rollout.engine_num_gpus > 0"),
        ([*MULTI, COLOCATED, "learner.backend=deepspeed", "learner.deepspeed.offload_optimizer=true"],
         "learner.deepspeed.offload_optimizer: under rollout.layout=colocated"),
        ([*MULTI, COLOCATED, "rollout.engine_num_gpus=0.5"], "both must be > 0"),
        ([*MULTI, COLOCATED, "rollout.engine_num_gpus=0.6", "learner.rank_num_gpus=0.3",
          "learner.lora_colocate=true",
          "learner.backend=deepspeed"],
         "= 0.9: under rollout.layout=colocated one GPU holds engine i and rank i of each group, so they "
         "must add up to 1"),
    ],
)
def test_refusals_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, overrides)
    assert message in str(e.value)


def test_engine_i_and_every_groups_rank_i_share_bundle_i():
    cfg = load_config(TINY, [*MULTI, COLOCATED, "rollout.engines_per_role=2", "learner.ranks=2",
                             "rollout.engine_num_cpus=1", "learner.rank_num_cpus=2"])
    plan = layout(run_layout(cfg).demands)
    assert plan.bundles == [{"CPU": 5.0}, {"CPU": 5.0}]  # one engine + two policies' ranks each
    assert len({tuple(idx) for idx in plan.indices.values()}) == 1  # every group: bundles 0 and 1
    engine = next(name for name in plan.requests if "engine" in name)
    assert plan.requests[engine] == [{"CPU": 1.0}, {"CPU": 1.0}]  # each member asks for its own share
    separate = layout(run_layout(load_config(TINY, [*MULTI, "rollout.engines_per_role=2",
                                                    "learner.ranks=2"])).demands)
    assert len(separate.bundles) == 6


def _paper(sharing: str, *overrides: str):
    return load_config("jobs/configs/sweeps/paper_base.yaml", [
        f"model.path={QWEN4B}", "marl.workflow=voting", f"marl.sharing={sharing}", *overrides])


def test_the_plan_is_the_larger_phase_per_gpu_and_both_phases_are_printed():
    """A 4B isolated voting cell on two 80 GB GPUs: GPU i holds engine i and the colocated learner's rank i;
    its planned bytes are the larger of the rollout phase (the engine's share + the learner's weights and
    runtime) and the update phase (the learner's peak + the sleeping engine's reserve)."""
    cfg = _paper("isolated", "learner.lora_colocate=true")
    plan = make_plan(run_layout(cfg))
    assert cfg.rollout.layout == "colocated" and len(plan.gpus) == 2 and plan.phases is not None
    for gpu, phase, used in zip(plan.gpus, plan.phases, plan.gpu_bytes(), strict=True):
        engine = next(m.engine for m in gpu if m.engine is not None)
        learner = next(m for m in gpu if m.learner is not None)
        resident = learner.learner.weights + learner.learner.runtime
        assert phase.rollout == pytest.approx(engine.share + resident)
        assert phase.update == pytest.approx(learner.peak + engine.reserve)
        assert used == max(phase.rollout, phase.update) < FIT_FRACTION * 80 * GIB
    text = format_plan(cfg, plan)
    assert "rollout " in text and "update " in text and "phase switches" in text and "fits" in text
    # Resident side by side, the same members would not fit one GPU: the phases are what makes it fit.
    assert sum(m.peak for m in plan.gpus[0]) > FIT_FRACTION * 80 * GIB


def _run(out: Path, *overrides: str) -> None:
    train(load_config(TINY, [f"out_dir={out}", "data.train_size=8", "rollout.prompts_per_step=4",
                             "rollout.samples_per_prompt=4", "data.eval_size=4", "ray.num_cpus=2",
                             "rollout.engines_per_role=0", "learner.ranks=0", "checkpoint.every=2", "steps=2",
                             *LORA, *overrides]))


def _weights(out: Path) -> dict[str, dict[str, torch.Tensor]]:
    folder = out / "tiny" / "checkpoints" / "step_2" / "policies"
    return {p.name: torch.load(p / "model.pt")["weights"] for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("cell", [
    # the quickstart's shape: one LoRA policy, one engine group serving it merged
    ("marl.workflow=single_agent", "marl.sharing=shared"),
    # isolated voting: both policies' adapters on one multi-LoRA engine group
    ("marl.workflow=voting", "marl.sharing=isolated", "rollout.lora_serving=multi"),
], ids=["quickstart", "voting_isolated"])
def test_a_colocated_run_trains_the_separate_layouts_weights_exactly(ray_cluster, tmp_path, cell):
    _run(tmp_path / "separate", *cell)
    _run(tmp_path / "colocated", *cell, COLOCATED)
    a, b = _weights(tmp_path / "separate"), _weights(tmp_path / "colocated")
    assert a.keys() == b.keys() and all(a[p].keys() == b[p].keys() for p in a)
    assert all(torch.equal(a[p][k], b[p][k]) for p in a for k in a[p])  # bit-identical
    steps = [r for r in read_metrics(tmp_path / "colocated" / "tiny") if "time/step_s" in r]
    assert len(steps) == 2
    for n, r in enumerate(steps, start=1):
        sleeps = [v for k, v in r.items() if k.startswith("colocate/sleep/sleeps/")]
        wakes = [v for k, v in r.items() if k.startswith("colocate/wake_kv_cache/wakes/")]
        assert sleeps == wakes == [n]  # one engine group: one sleep and one full wake per step
        assert all(r[k] > 0 for k in r if k.startswith("colocate/sleep/freed_bytes/"))
        for pid in a:
            assert r[f"reload/calls/{pid}"] == n and r[f"offload/calls/{pid}"] == n + 1  # + before step 0
            assert r[f"offload/bytes/{pid}"] > 0  # AdamW's moments and step counters
    separate = [r for r in read_metrics(tmp_path / "separate" / "tiny") if "time/step_s" in r]
    assert not any(k.startswith(("colocate/", "offload/", "reload/")) for r in separate for k in r)


def test_the_paper_cells_are_planned_in_both_layouts_side_by_side():
    """Qwen3-4B's longest cell: colocated it takes two whole GPUs and its fullest GPU holds the larger phase;
    the fractional layout holds everything resident on 1.5 GPUs; both fit only with checkpointing, and the
    table shows both rows."""
    from jobs.plan.cells import cell_plan, markdown

    colocated, fractional = (cell_plan("4B", "eval_opt isolated", layout)
                             for layout in ("colocated", "fractional"))
    assert (colocated.gpus, fractional.gpus) == (2, 1.5)
    assert colocated.rollout_gib is not None and colocated.update_gib is not None
    assert colocated.peak_gib == max(colocated.rollout_gib, colocated.update_gib) <= FIT_FRACTION * 80
    assert fractional.rollout_gib is None
    for p in (colocated, fractional):
        assert p.fits and p.needs_checkpointing and p.peak_off_gib > 80
    assert colocated.step_s < fractional.step_s  # two engines roll out where one did
    table = markdown([colocated, fractional]).splitlines()
    assert len(table) == 4 and "| Qwen3-4B | eval_opt isolated | colocated | 2 |" in table[2]


def test_the_ipc_sender_the_colocated_sync_calls_exists():
    from cluster import weight_transfer
    from jobs.config.gpu_layout import IPC_SENDER, ipc_available

    assert ipc_available() and getattr(weight_transfer, IPC_SENDER) is weight_transfer.broadcast_ipc
