"""Skipping empty optimizer steps (algo.skip_empty_optimizer_steps) and the step's policy movement
(update/policy_move) on the tiny model: a step with no live row leaves weights, AdamW state and an
optimizer-step schedule untouched where the plain update coasts on momentum; a live step is taken as before;
the group decides per mini-batch for every rank; the movement equals the mean |Δ log-prob| written out."""

import copy

import pytest
import torch

from learners.batch import TrainBatch
from learners.policy_move import abs_shift_sums
from learners.rank_metrics import merge_rank_metrics
from learners.update.empty_steps import empty_steps
from learners.update.losses import local_normalizer, token_logprobs
from learners.update.ppo_plan import UpdatePlan
from tests.builders import rows_batch
from tests.learners import test_minibatch_update
from tests.learners.test_learner import ROWS, max_abs_diff
from tests.learners.test_learner_group import make_group, weights

make_learner = test_minibatch_update.make_learner  # the fixture, shared

ZERO = [(p, r, 0.0, role) for p, r, _, role in ROWS]  # the same rows, no advantage anywhere


def test_empty_steps_by_hand():
    live = torch.tensor([False, True, False, False, False, True])
    rows = [[0, 1, 2], [4, 5]]  # rank 1 never received global row 3 (a dropped zero-advantage row)
    steps = [[[0], [1, 2], []], [[0], [], [1]]]  # rank r's indices into rows[r] of optimizer steps 0, 1, 2
    assert empty_steps(live, rows, steps) == [True, False, False]
    assert empty_steps(torch.zeros(6, dtype=torch.bool), rows, steps) == [True, True, True]


def test_abs_shift_sums_by_hand():
    after, before = torch.tensor([[0.0, -1.0, -2.0]]), torch.tensor([[5.0, -1.5, -1.0]])
    assert abs_shift_sums(after, before, torch.tensor([[0, 1, 1]])) == (1.5, 2.0)


def plan(batch: TrainBatch, steps: list[list[int]], skip: tuple[bool, ...] = ()) -> UpdatePlan:
    mask = batch.loss_mask[:, 1:]
    return UpdatePlan(steps, [local_normalizer(mask[s], "token_mean") for s in steps], skip=skip)


def state(learner) -> dict[str, torch.Tensor]:
    out = {f"w/{k}": v.detach().clone() for k, v in learner.model.state_dict().items()}
    for i, s in enumerate(learner.optimizer.state.values()):
        out.update({f"opt/{i}/{k}": torch.as_tensor(v).clone() for k, v in s.items()})
    return out


@pytest.mark.parametrize("skip", [False, True])
def test_a_zero_advantage_step_coasts_unless_skipped(make_learner, skip):
    learner = make_learner("learner.optim.lr=1e-2", "learner.optim.schedule_unit=optimizer_step")
    live, empty = rows_batch(ROWS), rows_batch(ZERO)
    whole = list(range(len(ROWS)))
    learner.update(live, plan(live, [whole]))  # AdamW now holds momentum
    before, sched = state(learner), learner.scheduler.last_epoch
    m = learner.update(empty, plan(empty, [whole], skip=(skip,)))
    moved = max_abs_diff({k: v for k, v in state(learner).items() if k.startswith("w/")},
                         {k: v for k, v in before.items() if k.startswith("w/")})
    if skip:
        assert max_abs_diff(state(learner), before) == 0.0 and learner.scheduler.last_epoch == sched
        assert m.step.skipped_steps == 1.0 and m.step.optimizer_steps == 0.0 and m.step.grad_norm == 0.0
        assert m.sums.move == 0.0 and learner.step == 2
    else:  # the zero gradient still moves the weights: the coasting the option removes
        assert moved > 1e-4 and learner.scheduler.last_epoch == sched + 1 and m.step.skipped_steps == 0.0


def test_only_the_empty_mini_batch_is_skipped(make_learner):
    rows = [ROWS[0], ROWS[1], ZERO[2], ZERO[3]]
    a, b = make_learner("learner.optim.lr=1e-2"), make_learner("learner.optim.lr=1e-2")
    batch = rows_batch(rows)
    ma = a.update(batch, plan(batch, [[0, 1], [2, 3]], skip=(False, True)))
    b.update(batch, plan(batch, [[0, 1]]))  # the live mini-batch alone
    assert max_abs_diff(a.model.state_dict(), b.model.state_dict()) == 0.0
    assert ma.step.optimizer_steps == 1.0 and ma.step.skipped_steps == 1.0


# An update without an optimizer step advances the per-step schedule on purpose: no torch order warning.
@pytest.mark.filterwarnings(r"error:Detected call of `lr_scheduler\.step\(\)`:UserWarning")
def test_group_skips_the_same_empty_mini_batches_on_every_rank():
    group = make_group("algo.skip_empty_optimizer_steps=true", "algo.ppo_mini_batch_size=2",
                       "algo.skip_zero_advantage=false")
    m = group.update(rows_batch([ZERO[0], ZERO[1], ZERO[2], ZERO[3]]))
    assert (
        m["update/skipped_steps/p"] == 2.0 and m["optim/steps/p"] == 0.0 and m["update/policy_move/p"] == 0.0
    )
    before = weights(group)
    m = group.update(rows_batch(ROWS[:4]))
    assert m["update/skipped_steps/p"] == 0.0 and m["optim/steps/p"] == 2.0
    assert max_abs_diff(weights(group), before) > 0.0 and m["update/policy_move/p"] > 0.0


@pytest.mark.parametrize("steps", [[[0, 1, 2, 3, 4, 5]], [[4, 0, 2], [1, 5, 3]]], ids=["whole", "two"])
@pytest.mark.parametrize("old", ["recompute", "rollout"])
def test_policy_move_is_the_mean_abs_logprob_shift(make_learner, steps, old):
    learner = make_learner("learner.optim.lr=1e-2", f"algo.old_logprobs={old}")
    batch = rows_batch(ROWS)
    model = copy.deepcopy(learner.model)
    m = learner.update(batch, plan(batch, steps))
    # Measured rows: all of them when recomputed; else those of the first step, the only ones seen unmoved.
    rows = sorted(r for s in steps for r in s) if old == "recompute" else sorted(steps[0])
    mb = batch.select(rows)

    def lp(module):
        with torch.no_grad():
            return token_logprobs(
                module(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1],
                mb.input_ids[:, 1:],
            )

    total, tokens = abs_shift_sums(lp(learner.model), lp(model), mb.loss_mask[:, 1:])
    assert m.sums.move_tokens == tokens and m.sums.move == pytest.approx(total, rel=1e-4)
    assert total / tokens > 1e-3  # lr 1e-2 moves them: the metric is not a constant zero


def test_policy_move_off(make_learner):
    learner = make_learner("learner.policy_move=false")
    batch = rows_batch(ROWS)
    assert learner.update(batch, plan(batch, [list(range(len(ROWS)))])).sums.move is None


def test_a_resumed_learner_continues_a_run_with_skipped_steps(make_learner, tmp_path):
    # The counters a skip leaves behind (the training step advanced, AdamW's step count and an optimizer-step
    # schedule not) are in the checkpoint: the resumed learner takes the same next step.
    first = make_learner("learner.optim.lr=1e-2", "learner.optim.schedule_unit=optimizer_step")
    live, empty = rows_batch(ROWS), rows_batch(ZERO)
    whole = list(range(len(ROWS)))
    first.update(live, plan(live, [whole]))
    first.update(empty, plan(empty, [whole], skip=(True,)))
    first.save_state(str(tmp_path))
    resumed = make_learner("learner.optim.lr=1e-2", "learner.optim.schedule_unit=optimizer_step")
    resumed.load_state(str(tmp_path))
    assert resumed.step == 2 and resumed.scheduler.last_epoch == first.scheduler.last_epoch == 1
    m_first, m_resumed = (x.update(live, plan(live, [whole])) for x in (first, resumed))
    assert merge_rank_metrics([m_resumed], "p") == pytest.approx(merge_rank_metrics([m_first], "p"), rel=1e-6)
    assert max_abs_diff(first.model.state_dict(), resumed.model.state_dict()) < 1e-7
