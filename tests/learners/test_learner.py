"""The in-process Learner on the tiny model: direction of the update, one optimizer step per call,
gradient-accumulation equivalence, the loss mask, metrics, empty batches, KL, LoRA and export."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cluster.sketch import sketch, sketch_error
from jobs.config import load_config
from jobs.models.resolve import resolve_model
from learners.batch import TrainBatch, empty_batch
from learners.learner import Learner
from learners.rank_metrics import RankMetrics
from learners.schedule import lr_factor
from learners.state.weights import merge_for_serving, take_snapshot
from learners.update.losses import local_normalizer, token_logprobs
from learners.update.ppo_plan import UpdatePlan
from tests.builders import learner_spec, rows_batch

# Everything these tests rely on, pinned here so edits to tiny.yaml cannot change what they check.
BASE = [
    "learner.ranks=0", "learner.micro_batch_size=32", "learner.optim.lr=1e-3", "learner.optim.warmup_steps=0",
    "learner.optim.schedule=cosine", "learner.optim.weight_decay=0.0", "learner.optim.grad_clip=1.0",
    "algo.loss_agg=token_mean", "algo.kl_coef=0.0", "model.dtype=float32", "model.lora.enabled=false",
]
LORA = [
    "model.lora.enabled=true", "model.lora.rank=4", "model.lora.alpha=8", "model.lora.dropout=0.0",
    "model.lora.target_modules=all-linear",
]
LR = 1e-3


@pytest.fixture(scope="module")
def model_path():
    return resolve_model("builtin:tiny")


@pytest.fixture
def make_learner(model_path):
    def make(*overrides: str, total_steps: int = 10) -> Learner:
        cfg = load_config("jobs/configs/tiny.yaml", [*BASE, *overrides])
        return Learner(learner_spec(cfg, model_path, total_steps=total_steps))

    return make


# Six rows of different lengths (so micro-batches and padding differ), two roles, mixed advantages.
ROWS = [
    ([10, 11, 12], [20, 21, 22, 23], 1.0, "generator"),
    ([13, 14], [24, 25], -1.0, "evaluator"),
    ([15, 16, 17, 18], [26, 27, 28], 0.5, "generator"),
    ([30, 31], [40, 41, 42, 43, 44], -0.5, "evaluator"),
    ([32, 33, 34], [45], 2.0, "generator"),
    ([35], [46, 47, 48], -1.5, "generator"),
]


def update(learner: Learner, batch: TrainBatch) -> RankMetrics:
    return learner.update(batch, UpdatePlan.whole(len(batch), local_normalizer(batch.loss_mask[:, 1:],
                                                                                          "token_mean")))


@torch.no_grad()
def response_logprob(model: torch.nn.Module, batch: TrainBatch) -> torch.Tensor:
    """Σ over loss tokens of log π(token) per row → [B] (temperature 1, as the learners here use)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    lp = token_logprobs(logits.float(), batch.input_ids[:, 1:])
    return torch.where(batch.loss_mask[:, 1:], lp, torch.zeros_like(lp)).sum(-1)


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def grads(learner: Learner) -> list[torch.Tensor]:
    out = []
    for p in learner.params:  # left in place by `update` (after clipping)
        assert p.grad is not None
        out.append(p.grad.clone())
    return out


def test_positive_advantage_raises_and_negative_lowers_logprob(make_learner):
    learner = make_learner()
    batch = rows_batch(
        [([10, 11, 12], [20, 21, 22], 1.0, "generator"), ([50, 51], [60, 61, 62], -1.0, "evaluator")]
    )
    before = response_logprob(learner.model, batch)
    update(learner, batch)
    after = response_logprob(learner.model, batch)
    assert after[0] > before[0] + 1e-3
    assert after[1] < before[1] - 1e-3


def test_one_optimizer_step_per_update_whatever_the_micro_batches(make_learner):
    learner = make_learner("learner.micro_batch_size=1", "learner.optim.warmup_steps=4")
    batch = rows_batch(ROWS)  # six micro-batches of one row
    lrs = [update(learner, batch).step.lr for _ in range(2)]
    assert learner.step == 2
    assert learner.scheduler.last_epoch == 2
    assert {int(learner.optimizer.state[p]["step"]) for p in learner.params} == {2}
    # The schedule advanced once per call: lr at call k is LR · (k + 1) / 4, not a per-micro-batch pace.
    assert lrs == pytest.approx([LR * lr_factor(k, 4, 10, "cosine") for k in range(2)]) == [2.5e-4, 5e-4]


def test_micro_batch_size_does_not_change_the_update(make_learner):
    small, large = make_learner("learner.micro_batch_size=1"), make_learner("learner.micro_batch_size=8")
    initial = {k: v.clone() for k, v in small.get_weights().items()}
    batch = rows_batch(ROWS)
    m_small, m_large = update(small, batch), update(large, batch)
    w_small, w_large = small.get_weights(), large.get_weights()
    assert max_abs_diff(w_small, initial) > LR / 2  # Adam's first step moves weights by ~lr
    # Measured 8.6e-7: the gradients differ by ~1e-8 (summation order), which Adam's first step,
    # lr · g / (|g| + eps), magnifies for the smallest gradients.
    assert max_abs_diff(w_small, w_large) < 1e-5
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(grads(small), grads(large), strict=True))
    assert m_small.sums.loss == pytest.approx(m_large.sums.loss, rel=1e-5, abs=1e-7)
    assert m_small.step.grad_norm == pytest.approx(m_large.step.grad_norm, rel=1e-5)
    assert m_small.sums.tokens == m_large.sums.tokens == 18


def test_tokens_outside_the_loss_mask_do_not_change_the_gradient(make_learner):
    # A tail after the response is attended to but is not a loss token. The model is causal, so the
    # tail cannot change the logits of response tokens: only the mask decides whether it is trained.
    rows = [([10, 11, 12], [20, 21, 22], 1.0, "generator"), ([13, 14], [24, 25, 26], -1.0, "evaluator")]
    tails = ([70, 71, 72], [80, 81, 82])
    grads_per_tail = []
    for tail in tails:
        learner = make_learner()
        update(learner, rows_batch([(*r, tail) for r in rows]))
        grads_per_tail.append(grads(learner))
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(*grads_per_tail, strict=True))

    learner = make_learner()  # the same tail, now inside the loss mask: the gradient must change
    batch = rows_batch([(*r, tails[0]) for r in rows])
    batch.loss_mask[:, 3:] = batch.attention_mask[:, 3:]
    update(learner, batch)
    diff = max(float((a - b).abs().max()) for a, b in zip(grads(learner), grads_per_tail[0], strict=True))
    assert diff > 1e-4


def test_zero_advantage_rows_contribute_no_gradient(make_learner):
    trained = ([10, 11, 12], [20, 21, 22], 1.0, "generator")
    with_zero, alone = make_learner(), make_learner()
    both = rows_batch([trained, ([50, 51, 52, 53], [60, 61, 62, 63, 64], 0.0, "evaluator")])
    norm = local_normalizer(both.loss_mask[:, 1:], "token_mean")  # the same global normaliser for both
    with_zero.update(both, UpdatePlan.whole(2, norm))
    alone.update(rows_batch([trained]), UpdatePlan.whole(1, norm))
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(grads(with_zero), grads(alone), strict=True))
    assert max(float(g.abs().max()) for g in grads(alone)) > 1e-4


def test_per_role_metrics(make_learner):
    learner = make_learner()
    batch = rows_batch(ROWS)
    lp = token_logprobs(
        learner.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1].detach(),
        batch.input_ids[:, 1:],
    )
    batch.rollout_logprobs[:, 1:] = torch.where(batch.loss_mask[:, 1:], lp, 0.0)  # the engine agrees exactly
    m = update(learner, batch)
    assert m.sums.roles.tokens["generator"] == 4 + 3 + 1 + 3
    assert m.sums.roles.tokens["evaluator"] == 2 + 5
    assert m.sums.tokens == 18
    for role in ("generator", "evaluator"):
        assert m.sums.roles.logprob_diff[role] == pytest.approx(0.0, abs=1e-4)
        # A near-uniform random init: per-token entropy close to log(vocab size).
        mean_entropy = m.sums.roles.entropy[role] / m.sums.roles.tokens[role]
        assert 0.9 * torch.log(torch.tensor(104.0)) < mean_entropy <= torch.log(torch.tensor(104.0)) + 1e-4
    assert set(m.sums.roles.clip_frac) == {"generator", "evaluator"} and m.step.lr > 0
    assert not m.sums.roles.kl  # no KL term configured


def test_empty_batch_still_steps(make_learner):
    learner = make_learner()
    before = {k: v.clone() for k, v in learner.get_weights().items()}
    m = learner.update(empty_batch("p"), UpdatePlan.whole(0, 0.0))
    assert learner.step == 1 and learner.scheduler.last_epoch == 1
    assert {int(learner.optimizer.state[p]["step"]) for p in learner.params} == {1}
    assert m.sums.loss == 0.0 and m.sums.tokens == 0.0 and m.step.grad_norm == 0.0
    assert max_abs_diff(learner.get_weights(), before) == 0.0  # zero gradient, fresh Adam: no move


def test_kl_penalty_full_finetune(make_learner):
    learner = make_learner("algo.kl_coef=0.5")
    assert learner.reference is not None
    reference = {k: v.clone() for k, v in learner.reference.state_dict().items()}
    batch = rows_batch(ROWS[:2])
    first = update(learner, batch)
    # policy == reference before any step
    assert first.sums.roles.kl["generator"] == pytest.approx(0.0, abs=1e-6)
    # With zero advantages the only gradient left is the KL term pulling the moved policy back.
    batch.advantages.zero_()
    second = update(learner, batch)
    assert second.sums.roles.kl["generator"] > 1e-6 and second.sums.roles.kl["evaluator"] > 1e-6
    assert second.step.grad_norm > 1e-4
    assert second.sums.loss > 0  # k3 ≥ 0 and the PPO term is 0
    assert all(torch.equal(v, reference[k]) for k, v in learner.reference.state_dict().items())


def test_kl_penalty_lora_uses_the_base_as_reference(make_learner):
    learner = make_learner("algo.kl_coef=0.5", *LORA)
    assert learner.reference is None  # the adapter is switched off instead of holding a second copy
    batch = rows_batch(ROWS[:2])
    assert update(learner, batch).sums.roles.kl["generator"] == pytest.approx(0.0, abs=1e-6)
    batch.advantages.zero_()
    second = update(learner, batch)
    assert second.sums.roles.kl["generator"] > 1e-8 and second.step.grad_norm > 0


def test_lora_trains_only_adapters_and_exposes_base_names(make_learner, model_path):
    learner = make_learner(*LORA)
    trainable = [n for n, p in learner.model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    assert len(learner.params) == len(trainable)
    base = AutoModelForCausalLM.from_pretrained(model_path).state_dict()

    weights = learner.get_weights()
    assert set(weights) == set(base)
    assert max_abs_diff(weights, base) == 0.0  # lora_B starts at zero

    update(learner, rows_batch(ROWS))
    weights = learner.get_weights()
    q = "model.layers.0.self_attn.q_proj.weight"
    assert float((weights[q] - base[q]).abs().max()) > 1e-6
    for k in ("model.embed_tokens.weight", "model.norm.weight", "model.layers.0.input_layernorm.weight"):
        assert torch.equal(weights[k], base[k]), k  # not adapted, so not changed


def test_export_full_is_a_loadable_hf_folder(make_learner, tmp_path):
    learner = make_learner()
    update(learner, rows_batch(ROWS))
    out = learner.export(str(tmp_path / "full"))
    loaded = AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert max_abs_diff(loaded, learner.get_weights()) == 0.0
    assert AutoTokenizer.from_pretrained(out).pad_token == "<pad>"
    assert not (tmp_path / "full" / "adapter").exists()


def test_export_lora_writes_merged_model_and_adapter(make_learner, model_path, tmp_path):
    from peft import PeftModel

    learner = make_learner(*LORA)
    update(learner, rows_batch(ROWS))
    out = learner.export(str(tmp_path / "lora"))
    merged = learner.get_weights()
    assert max_abs_diff(AutoModelForCausalLM.from_pretrained(out).state_dict(), merged) == 0.0
    config = json.loads((tmp_path / "lora" / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (4, 8)
    # The adapter alone, put back on the untouched base, gives the same merged weights.
    base = AutoModelForCausalLM.from_pretrained(model_path)
    reloaded = PeftModel.from_pretrained(base, str(tmp_path / "lora" / "adapter"))
    assert max_abs_diff(merge_for_serving(reloaded)[0], merged) < 1e-6


def test_the_merged_sketch_is_the_served_merges_from_the_module_or_its_snapshot(make_learner, monkeypatch):
    learner = make_learner(*LORA)
    with torch.no_grad():
        for name, p in learner.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)
    merged = learner.get_weights()
    direct = learner.merged_sketch()
    assert learner.sync_metrics() == {}  # served in fp32: nothing merged, no rounding reported
    snapshot = take_snapshot(learner.model, "p")
    # a ZeRO-3 rank: its module holds a partition
    monkeypatch.setattr(learner.backend, "snapshot", lambda: snapshot)
    kept = learner.merged_sketch()
    assert list(direct) == list(kept) == list(merged)
    assert max(max(sketch_error(direct[n], sketch(n, w)), sketch_error(kept[n], sketch(n, w)))
               for n, w in merged.items()) < 1e-6
    assert "sync/merge_rounding/p" in learner.sync_metrics()


@pytest.mark.parametrize("overrides", [(), LORA], ids=["full", "lora"])
def test_gradient_checkpointing_leaves_the_update_bit_identical(make_learner, overrides):
    """Checkpointing recomputes each layer's forward in the backward pass with the same kernels on the same
    inputs: what it changes is memory and time, never a weight (a study relies on this to fit its box)."""
    batch = rows_batch(ROWS)
    learners = [make_learner(*overrides, f"learner.gradient_checkpointing={on}") for on in ("false", "true")]
    assert [learner.model.is_gradient_checkpointing for learner in learners] == [False, True]
    metrics = [update(learner, batch) for learner in learners]
    plain, checkpointed = (learner.get_weights() for learner in learners)
    assert plain.keys() == checkpointed.keys()
    assert all(torch.equal(plain[k], checkpointed[k]) for k in plain)
    assert metrics[0].step.grad_norm == metrics[1].step.grad_norm
