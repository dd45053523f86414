"""learner.lora_colocate (jobs/config/colocation.py, learners/colocated_group.py): what the option
refuses, the one learner group it places, and a run through the driver that equals separate learners and
resumes across the option."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cluster.stop import StopRequested
from jobs.config import ConfigError, load_config
from jobs.models.resolve import resolve_model
from jobs.models.shape import shape_of
from jobs.plan.layout import run_layout
from jobs.plan.planner import make_plan
from jobs.train import train
from tests.jobs.test_resume import SHAPE, StopAfter, _final_weights, _per_step
from tests.process_group import leave_process_group

TINY = "jobs/configs/tiny.yaml"
LORA = ["model.lora.enabled=true", "model.lora.rank=4", "model.dtype=float32"]
COLOCATE = "learner.lora_colocate=true"
RAY_CPUS = 2  # the shape of tests/jobs/test_resume.py's cluster: one shared `ray_cluster` start for both


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            [COLOCATE],
            "learner.lora_colocate shares one base among LoRA adapters; set model.lora.enabled=true",
        ),
        (
            [*LORA, COLOCATE, "marl.sharing=shared"],
            "learner.lora_colocate needs marl.sharing=isolated; got shared",
        ),
        (
            [*LORA, COLOCATE, "learner.backend=deepspeed", "learner.deepspeed.zero_stage=3"],
            "learner.deepspeed.zero_stage=3 cannot hold learner.lora_colocate policies: ZeRO-3 partitions "
            "the shared base",
        ),
        (
            [*LORA, COLOCATE, "marl.policies.aggregator.model.lora.rank=8"],
            "marl.policies.aggregator.model.lora.rank: learner.lora_colocate policies share the base model",
        ),
        (
            [*LORA, COLOCATE, "marl.policies.generator.learner.ranks=2"],
            "marl.policies.generator.learner.ranks: ",
        ),
    ],
)
def test_refusals_name_the_key(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, overrides)
    assert message in str(e.value)


def test_deepspeed_zero2_is_accepted():
    cfg = load_config(TINY, [*LORA, COLOCATE, "learner.backend=deepspeed", "learner.deepspeed.zero_stage=2"])
    assert run_layout(cfg).colocated


def test_one_learner_group_is_placed_for_every_policy():
    cfg = load_config(
        TINY, [*LORA, COLOCATE, "learner.ranks=2", "marl.policies.aggregator.learner.optim.lr=5e-4"]
    )
    learners = {d.name: (d.n, dict(d.resources)) for d in run_layout(cfg).demands if ":learner:" in d.name}
    assert learners == {"tiny:learner:colocated": (2, {"CPU": 0.5, "GPU": 0.0})}


@pytest.mark.parametrize(
    ("backend", "weight_bytes", "optimizer_bytes"),
    [
        ((), 4.0, 8.0),  # torch: fp32 base; fp32 Adam m, v per adapter weight on each rank
        # ZeRO-2 on GPUs over 2 ranks: bf16 base whole on each rank; 12 bytes per adapter weight (fp32
        # master, m, v) partitioned over the ranks, as a separate learner's.
        (
            (
                "learner.backend=deepspeed",
                "learner.deepspeed.zero_stage=2",
                "learner.ranks=2",
                "learner.rank_num_gpus=1",
            ),
            2.0,
            12.0 / 2,
        ),
    ],
    ids=["torch", "deepspeed-zero2"],
)
def test_the_plan_holds_one_base_and_every_adapter(backend, weight_bytes, optimizer_bytes):
    """Hand-derived from the separate plan: the colocated rank holds the base once, the policies' adapter
    states summed, the largest policy's activations and logits."""
    def learners(*overrides: str):
        layout = run_layout(load_config(TINY, [*LORA, *backend, *overrides]))
        return [m.learner for m in make_plan(layout, memory=0).members if m.learner]

    (col, *other_ranks), parts = learners(COLOCATE), learners()
    assert len(parts) == 2 * (1 + len(other_ranks)) and all(r == col for r in other_ranks)
    parts = parts[::1 + len(other_ranks)]  # one rank of each policy
    shape = shape_of(resolve_model("builtin:tiny"))
    base = weight_bytes * shape.params()
    assert col.weights == pytest.approx(sum(p.weights for p in parts) - base)
    assert col.optimizer == pytest.approx(len(parts) * optimizer_bytes * shape.lora_params(4))
    assert col.optimizer == pytest.approx(sum(p.optimizer for p in parts)) and col.optimizer > 0
    assert col.activations == max(p.activations for p in parts)
    assert col.total() < sum(p.total() for p in parts)


def _cfg(out: Path, *overrides: str):
    return load_config(
        TINY, [f"out_dir={out}", *SHAPE, *LORA, "rollout.engines_per_role=0", "learner.ranks=0", *overrides]
    )


def _saved_weights(out: Path, steps: int) -> dict[str, dict[str, torch.Tensor]]:
    """Each policy's checkpointed weights at `steps`: the torch backend's files, or DeepSpeed's module states
    (the adapter alone: frozen parameters are left out)."""
    folder = out / "tiny" / "checkpoints" / f"step_{steps}" / "policies"
    if not (next(folder.iterdir()) / "deepspeed").is_dir():
        return _final_weights(out, steps)
    return {p.name: torch.load(p / "deepspeed" / "mp_rank_00_model_states.pt", weights_only=False)["module"]
            for p in sorted(folder.iterdir())}


def _assert_same(a: Path, b: Path, steps: int) -> None:
    wa, wb = _saved_weights(a, steps), _saved_weights(b, steps)
    assert (
        wa.keys() == wb.keys() == {"generator", "aggregator"}
        and wa["generator"].keys() == wb["generator"].keys()
    )
    for pid in wa:
        assert max((wa[pid][k] - wb[pid][k]).abs().max().item() for k in wa[pid]) < 1e-5, pid
    ma, mb = _per_step(a), _per_step(b)
    assert list(range(steps)) == sorted(mb) and set(mb) <= set(ma)
    for step in mb:
        assert mb[step] == pytest.approx(ma[step], abs=1e-5), step


@pytest.fixture
def _no_process_group_left():
    """In-process DeepSpeed learners join a one-rank process group in this process; leave none behind."""
    yield
    leave_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("backend", [(), ("learner.backend=deepspeed", "learner.deepspeed.zero_stage=2")],
                         ids=["torch", "deepspeed"])
def test_a_colocated_run_equals_separate_learners_and_resumes_without_the_option(
    ray_cluster, tmp_path, backend, _no_process_group_left
):
    """Isolated LoRA voting, 3 steps: separate learners in one go; colocated, stopped after 2
    steps (checkpoint every step), then resumed with the option off. Same rewards, losses, grad
    norms and adapters throughout."""
    separate = tmp_path / "separate"
    train(_cfg(separate, "steps=3", *backend))
    colocated = tmp_path / "colocated"
    with pytest.raises(StopRequested):
        train(_cfg(colocated, "steps=3", COLOCATE, *backend), callbacks=(StopAfter(2),))
    _assert_same(separate, colocated, 2)
    # resume=auto from the colocated run's step_2, on separate learners
    train(_cfg(colocated, "steps=3", *backend))
    _assert_same(separate, colocated, 3)
