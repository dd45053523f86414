"""Colocated LoRA policies (learners/colocated_group.py): the same batches through R separate
LearnerGroups and through one colocated group (one base, R adapters) give the same losses, metrics, adapters
and served weights, and a checkpoint written by either layout restores the other; on the torch backend and on
DeepSpeed ZeRO-2 (one engine per policy over the shared module, in-process on a one-rank gloo group here; two
ranks in tests/learners/test_colocated_ranks.py)."""

import pytest
import torch

from jobs.config import load_config
from jobs.models.resolve import resolve_model
from learners.colocated_group import colocated_groups
from learners.group import LearnerGroup
from learners.member import LearnerMember, LearnerSpec
from tests.builders import learner_spec, rows_batch
from tests.learners.test_learner_group import BASE, ROWS, TIMEOUT
from tests.process_group import leave_process_group

POLICIES = ("generator", "evaluator")
TOL = 1e-5
DEEPSPEED = ("learner.backend=deepspeed", "learner.deepspeed.zero_stage=2")
BACKENDS = {"torch": (), "deepspeed": DEEPSPEED}


def specs(*overrides: str) -> list[LearnerSpec]:
    cfg = load_config("jobs/configs/tiny.yaml", [*BASE, "model.lora.enabled=true", "model.lora.rank=4",
                                                 "learner.micro_batch_size=2", "algo.ppo_mini_batch_size=2",
                                                 *overrides])
    path = resolve_model("builtin:tiny")
    return [learner_spec(cfg, path, policy_id=pid, temperature=0.7, num_policies=len(POLICIES),
                         policy_index=i) for i, pid in enumerate(POLICIES)]


def batch_of(pid: str, step: int):
    """Each policy's own rows (different advantages per policy and step, so the adapters move apart)."""
    sign = 1.0 if pid == "generator" else -1.0
    rows = [(p, r, a * sign * (step + 1), role) for p, r, a, role in ROWS]
    return rows_batch(rows)


def adapter(group: LearnerGroup) -> dict[str, torch.Tensor]:
    payload = group.group.submit_to([0], LearnerMember.get_adapter).result(TIMEOUT)[0]
    return {k: v.clone() for k, v in payload.tensors.items()}


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def train(groups: dict[str, LearnerGroup], steps: int) -> list[dict[str, float]]:
    return [{k: v for pid, g in groups.items() for k, v in g.update(batch_of(pid, s), s).items()}
            for s in range(steps)]


@pytest.fixture(scope="module", autouse=True)
def _own_process_group():
    """In-process DeepSpeed engines join a one-rank process group in this process; leave none behind."""
    yield
    leave_process_group()


# DeepSpeed's engine builds and imports make its case slow (~30 s on 2 cores): the slow tier's.
@pytest.fixture(scope="module", params=["torch", pytest.param("deepspeed", marks=pytest.mark.slow)])
def trained(request):
    overrides = BACKENDS[request.param]
    separate = {s.policy_id: LearnerGroup(s, "sep") for s in specs(*overrides)}
    colocated = colocated_groups(specs(*overrides), "colo", "colo:learner:colocated")
    metrics = (train(separate, 2), train(colocated, 2))
    yield separate, colocated, metrics, overrides
    for g in [*separate.values(), *colocated.values()]:
        g.shutdown()


def test_same_losses_metrics_and_adapters_as_separate_learners(trained):
    separate, colocated, (sep_metrics, colo_metrics), _ = trained
    for sep, colo in zip(sep_metrics, colo_metrics, strict=True):
        assert set(sep) == set(colo)
        # several optimizer steps each
        assert f"loss/{POLICIES[1]}" in sep and sep["optim/steps/generator"] >= 2
        for key in sep:
            assert colo[key] == pytest.approx(sep[key], abs=TOL, rel=TOL), key
    for pid in POLICIES:
        assert max_diff(adapter(separate[pid]), adapter(colocated[pid])) < TOL
    # The policies trained apart: their adapters differ (the bank bound each one's own).
    assert max_diff(adapter(colocated["generator"]), adapter(colocated["evaluator"])) > 1e-3
    served = [g.group.submit_to([0], LearnerMember.get_weights).result(TIMEOUT)[0] for g in
              (separate["evaluator"], colocated["evaluator"])]
    assert max_diff(*served) < TOL


def test_checkpoints_cross_layouts(trained, tmp_path):
    """A colocated policy's state is a separate learner's layout: it restores a separate group, and back."""
    separate, colocated, _, overrides = trained
    colocated["evaluator"].save(str(tmp_path / "evaluator"))
    assert (tmp_path / "evaluator" / "deepspeed").is_dir() == bool(overrides)  # the backend's own layout
    fresh = LearnerGroup(specs(*overrides)[1], "fresh")
    try:
        fresh.load(str(tmp_path / "evaluator"))
        assert max_diff(adapter(fresh), adapter(colocated["evaluator"])) == 0.0
        separate["generator"].save(str(tmp_path / "generator"))
        colocated["evaluator"].load(str(tmp_path / "generator"))  # any policy's state fits any adapter slot
        assert max_diff(adapter(colocated["evaluator"]), adapter(separate["generator"])) == 0.0
        # ... and the generator's own adapter was left as it was.
        assert max_diff(adapter(colocated["generator"]), adapter(separate["generator"])) < TOL
    finally:
        fresh.shutdown()
