"""PPO mini-batches on the tiny model: a hand-written reference of the two-step update (old
log-probs from before the first step), clipping that engages from the second mini-batch on, the
whole-batch plan as today's single step, optimizer-step counts under isolated voting, the schedule
unit, and the rollout log-probs as old."""

import copy
import dataclasses

import pytest
import torch

from jobs.config import load_config
from jobs.models.resolve import resolve_model
from learners.batch import TrainBatch
from learners.learner import Learner
from learners.update.losses import local_normalizer, ppo_clip_loss, token_logprobs
from learners.update.ppo_plan import UpdatePlan
from tests.builders import learner_spec, rows_batch
from tests.learners.test_learner import BASE, ROWS, max_abs_diff
from tests.learners.test_learner_group import make_group, weights

LR = 1e-2  # large, so that one optimizer step moves the log-probs the second mini-batch is clipped against


@pytest.fixture
def make_learner():
    path = resolve_model("builtin:tiny")

    def make(*overrides: str) -> Learner:
        cfg = load_config("jobs/configs/tiny.yaml", [*BASE, *overrides])
        return Learner(
            learner_spec(cfg, path)
        )

    return make


@pytest.fixture
def learner(make_learner):
    # One micro-batch per mini-batch, so the reference's single backward sums gradients in the same order.
    return make_learner(f"learner.optim.lr={LR}")


def plan_of(batch: TrainBatch, steps: list[list[int]]) -> UpdatePlan:
    mask = batch.loss_mask[:, 1:]
    return UpdatePlan(steps, [local_normalizer(mask[s], "token_mean") for s in steps])


def reference_update(model: torch.nn.Module, batch: TrainBatch, steps: list[list[int]], lr: float) -> None:
    """The update written out: old log-probs of every row from the weights before any step,
    then one AdamW step (clip 1.0, cosine at step 0 = lr) per mini-batch on the clipped PPO
    loss over that mini-batch's tokens."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999), weight_decay=0.0)
    with torch.no_grad():
        old = token_logprobs(
            model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1],
            batch.input_ids[:, 1:],
        )
    for rows in steps:
        rows = batch.longest_first(rows)  # the learner's row order, so float sums run in the same order
        mb = batch.select(rows)
        width = mb.input_ids.shape[1]
        lp = token_logprobs(model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits[:, :-1],
                            mb.input_ids[:, 1:])
        mask = mb.loss_mask[:, 1:]
        loss, _ = ppo_clip_loss(lp, old[rows, :width - 1], mb.advantages, mask, normalizer=float(mask.sum()))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()


@pytest.mark.parametrize("steps", [[[0, 1, 2, 3, 4, 5]], [[4, 0, 2], [1, 5, 3]]], ids=["whole", "two"])
def test_update_matches_the_written_out_reference(learner, steps):
    batch = rows_batch(ROWS)
    reference = copy.deepcopy(learner.model)
    m = learner.update(batch, plan_of(batch, steps))
    reference_update(reference, batch, steps, LR)
    got = {k: v for k, v in learner.model.state_dict().items()}
    assert max_abs_diff(got, reference.state_dict()) < 1e-6
    assert m.step.optimizer_steps == len(steps) and learner.step == 1


def test_second_mini_batch_is_clipped_against_the_old_policy(learner, make_learner):
    batch = rows_batch(ROWS)
    m = learner.update(batch, plan_of(batch, [[0, 1, 2], [3, 4, 5]]))
    assert m.sums.clip_frac > 0  # ratio ≠ 1 in the second step: the clip bounds act
    whole = make_learner(f"learner.optim.lr={LR}", "learner.micro_batch_size=2")
    assert whole.update(batch, plan_of(batch, [list(range(6))])).sums.clip_frac == 0.0
    assert m.step.last_grad_norm != m.step.grad_norm  # the step's mean and last differ over two steps


def test_rollout_logprobs_as_old(make_learner):
    batch = rows_batch(ROWS)  # engine logprobs of 0 (probability 1): every ratio is far below 1
    rollout = make_learner("algo.old_logprobs=rollout")
    m = rollout.update(batch, plan_of(batch, [list(range(6))]))
    negative = sum(int(batch.loss_mask[i, 1:].sum()) for i, r in enumerate(ROWS) if r[2] < 0)
    assert m.sums.clip_frac == negative  # ratio < 0.8 with A < 0 is clipped; with A > 0 it never is


@pytest.mark.parametrize("unit,expected", [("step", 1), ("optimizer_step", 3)])
def test_schedule_unit(make_learner, unit, expected):
    learner = make_learner(f"learner.optim.schedule_unit={unit}", "learner.optim.warmup_steps=4")
    batch = rows_batch(ROWS)
    m = learner.update(batch, plan_of(batch, [[0, 1], [2, 3], [4, 5]]))
    assert learner.scheduler.last_epoch == expected
    # warmup 4: step 0 gets 1/4 of the lr; per optimizer step the three steps get 1/4, 2/4, 3/4.
    lrs = [1e-3 / 4] * 3 if unit == "step" else [1e-3 / 4, 2e-3 / 4, 3e-3 / 4]
    assert m.step.lr == pytest.approx(sum(lrs) / 3) and m.step.last_lr == pytest.approx(lrs[-1])


def test_mini_batch_size_of_the_whole_batch_is_todays_update():
    batch = rows_batch(ROWS)
    whole, zero = make_group("algo.ppo_mini_batch_size=6"), make_group("algo.ppo_mini_batch_size=0")
    m_whole, m_zero = whole.update(batch), zero.update(batch)
    assert max_abs_diff(weights(whole), weights(zero)) < 1e-6
    assert m_whole == pytest.approx(m_zero, rel=1e-6, abs=1e-9) and m_zero["optim/steps/p"] == 1.0


def voting_batch(role: str, slots: int, per_slot: int) -> TrainBatch:
    """An isolated policy's rows: `slots` parallel agents of `role`, `per_slot`
    rows each, mixed advantages."""
    rows = [
        ([10 + i % 5, 11], [20 + i % 7, 21], 1.0 if i % 2 else -1.0, role) for i in range(slots * per_slot)
    ]
    batch = rows_batch(rows)
    return dataclasses.replace(batch, agents=[f"{role}{i // per_slot}" for i in range(len(rows))])


@pytest.mark.parametrize("norm,gen_steps", [(False, 3), (True, 1)])
def test_isolated_voting_generator_takes_three_times_the_steps(norm, gen_steps):
    # 4 prompts x samples -> 4 rows per agent; mini-batch = one agent's rows (the
    # paper: 64 x 8 = 512 samples).
    extra = ["algo.ppo_mini_batch_size=4", f"algo.parallel_agent_norm={str(norm).lower()}"]
    generator, aggregator = make_group(*extra), make_group(*extra)
    m_gen = generator.update(voting_batch("generator", 3, 4))
    m_agg = aggregator.update(voting_batch("aggregator", 1, 4))
    assert m_gen["optim/steps/p"] == gen_steps and m_agg["optim/steps/p"] == 1


def test_update_call_schedule_of_the_second_of_three_policies():
    # One shared schedule driven by three policies' update calls: this policy (called second) updates at
    # positions 1, 4, ...; warmup 4 from 0 (verl's): lr/4 at position 1, then the full lr at position 4.
    cfg = load_config("jobs/configs/tiny.yaml", [*BASE, "learner.optim.schedule_unit=update_call",
                                                 "learner.optim.warmup_steps=4",
                                                 "learner.optim.warmup_start_zero=true"])
    learner = Learner(learner_spec(cfg, resolve_model("builtin:tiny"), num_policies=3, policy_index=1))
    batch = rows_batch(ROWS)
    lrs = [learner.update(batch, plan_of(batch, [[0, 1], [2, 3, 4, 5]])).step.lr for _ in range(2)]
    assert lrs == pytest.approx([1e-3 / 4, 1e-3])  # both optimizer steps of a call share its position
    assert learner.scheduler.last_epoch == 2  # one tick per update call


def test_verl_fixed_chunks_and_nominal_normaliser_reach_the_update():
    # 6 rows, M = 4, in order: verl's chunks [0..3] and [4, 5], each loss over 4
    # nominal rows (seq_mean_token_mean).
    # No gradient clipping: a clipped step would hide the normaliser's scale.
    verl = ["algo.ppo_mini_batch_size=4", "algo.minibatch_shuffle=false", "algo.loss_agg=seq_mean_token_mean",
            "learner.optim.grad_clip=0.0", "algo.minibatch_chunks=fixed", "algo.loss_normalizer=nominal"]
    batch = rows_batch(ROWS)
    group = make_group(*verl)
    m = group.update(batch)
    cfg = load_config("jobs/configs/tiny.yaml", [*BASE, *verl])
    learner = Learner(
        learner_spec(cfg, resolve_model("builtin:tiny"), temperature=0.7)
    )
    learner.update(batch, UpdatePlan([[0, 1, 2, 3], [4, 5]], [4.0, 4.0], sorted(set(batch.roles))))
    assert m["optim/steps/p"] == 2.0
    assert max_abs_diff(weights(group), {k: v for k, v in learner.model.state_dict().items()}) < 1e-6
    actual = make_group(*verl[:-1])  # the same chunks, the second one's loss over its own 2 rows
    actual.update(batch)
    assert max_abs_diff(weights(actual), weights(group)) > 1e-6
