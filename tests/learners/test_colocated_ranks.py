"""Colocated LoRA policies on two DeepSpeed ZeRO-2 ranks (Ray actors, gloo), one engine per policy over
the shared module: the same batches as separate in-process torch learners give the same losses, metrics
and adapters, the ranks stay identical, and a colocated policy's checkpoint (each rank's optimizer
partition) resumes a separate two-rank group to the same next update, and that group's resumes a colocated
policy, in another policy's slot.
(One DeepSpeed group beside the colocated one: separate two-rank learners would start four more actors.)"""

from __future__ import annotations

import pytest

from learners.colocated_group import colocated_groups
from learners.group import LearnerGroup
from tests.learners.test_colocated import DEEPSPEED, POLICIES, TOL, adapter, batch_of, max_diff, specs, train
from tests.learners.test_learner_group import weights

pytestmark = pytest.mark.slow
# One optimizer step per update: how two shards split a mini-batch of samples differs from one learner's split
# (with or without colocation), so only the whole batch compares across rank counts.
WHOLE = "algo.ppo_mini_batch_size=0"
TWO_RANKS = (*DEEPSPEED, "learner.ranks=2", WHOLE)


@pytest.fixture(scope="module")
def trained(ray_cluster):
    separate = {s.policy_id: LearnerGroup(s, "sep") for s in specs(WHOLE)}
    colocated = colocated_groups(specs(*TWO_RANKS), "colo", "colo:learner:colocated")
    metrics = (train(separate, 2), train(colocated, 2))
    yield separate, colocated, metrics
    for g in [*separate.values(), *colocated.values()]:
        g.shutdown()


def same_update(a: dict[str, float], b: dict[str, float]) -> None:
    # Padding is of the micro-batches each rank ran: two shards pad unlike one learner's whole batch.
    a, b = ({k: v for k, v in m.items() if not k.startswith("batch/padding_frac/")} for m in (a, b))
    assert set(a) == set(b)
    for key in a:
        assert b[key] == pytest.approx(a[key], abs=TOL, rel=TOL), key


def test_two_ranks_match_separate_learners(trained):
    separate, colocated, (sep_metrics, colo_metrics) = trained
    for sep, colo in zip(sep_metrics, colo_metrics, strict=True):
        assert "grad/role_norm/generator" in colo  # ZeRO-2 keeps per-role gradients
        same_update(sep, colo)
    for pid in POLICIES:
        assert max_diff(adapter(separate[pid]), adapter(colocated[pid])) < TOL
        assert max_diff(weights(colocated[pid], 1), weights(colocated[pid], 0)) == 0.0  # ranks stay identical
    assert max_diff(adapter(colocated["generator"]), adapter(colocated["evaluator"])) > 1e-3


def test_checkpoints_resume_across_layouts_on_two_ranks(trained, tmp_path):
    """Each rank's optimizer partition comes back: the resumed group's next update equals the original's."""
    _, colocated, _ = trained
    colocated["evaluator"].save(str(tmp_path / "colocated"))
    fresh = LearnerGroup(specs(*TWO_RANKS)[1], "fresh")
    try:
        fresh.load(str(tmp_path / "colocated"))  # option on -> off
        assert max_diff(adapter(fresh), adapter(colocated["evaluator"])) == 0.0
        batch = batch_of("evaluator", 2)
        same_update(colocated["evaluator"].update(batch, 2), fresh.update(batch, 2))
        assert max_diff(adapter(fresh), adapter(colocated["evaluator"])) < TOL
        fresh.save(str(tmp_path / "separate"))
        colocated["generator"].load(str(tmp_path / "separate"))  # off -> on, into another policy's slot
        assert max_diff(adapter(colocated["generator"]), adapter(fresh)) == 0.0
        batch = batch_of("generator", 3)
        m_sep, m_colo = fresh.update(batch, 3), colocated["generator"].update(batch, 3)
        for key in ("loss", "grad/norm", "lr"):
            assert m_colo[f"{key}/generator"] == pytest.approx(m_sep[f"{key}/evaluator"], abs=TOL, rel=TOL), (
                key
            )
        assert max_diff(adapter(colocated["generator"]), adapter(fresh)) < TOL
    finally:
        fresh.shutdown()
