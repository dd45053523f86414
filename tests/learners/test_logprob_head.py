"""The chunked LM head (learners/compute/logprob_head.py) against full logits: log-probs, entropy and
gradients equal to 1e-5 in fp32 at several shapes (a chunk that does not divide the positions too),
through the custom backward (a plain head), the checkpointed module (any other head), tied embeddings,
LoRA, and the learner's passes."""

import dataclasses

import pytest
import torch

from jobs.config import load_config
from jobs.models.resolve import resolve_model
from learners.compute.logprob_head import head_logprobs
from learners.learner import Learner
from learners.rank_metrics import TokenSums
from learners.update.losses import entropy_from_logits, token_logprobs
from tests.builders import learner_spec, rows_batch
from tests.learners.test_learner import BASE, LORA, ROWS

TOL = dict(rtol=1e-5, atol=1e-5)


def _full(head, hidden, targets, temperature):
    logits = head(hidden).float() / temperature
    return token_logprobs(logits[None], targets[None])[0], entropy_from_logits(logits[None])[0]


@pytest.mark.parametrize("n,chunk,bias", [(7, 3, False), (12, 4, False), (5, 16, False), (9, 2, True)])
def test_head_logprobs_equal_full_logits_with_their_gradients(n, chunk, bias):
    torch.manual_seed(n)
    # a bias takes the checkpointed-module path, no bias the Function
    head = torch.nn.Linear(8, 50, bias=bias)
    hidden = torch.randn(n, 8, requires_grad=True)
    targets, weights = torch.randint(0, 50, (n,)), torch.randn(n)
    grads = []
    for chunked in (False, True):
        if chunked:
            lp, ent = head_logprobs(head, hidden, targets, temperature=0.7, chunk=chunk, entropy=True)
        else:
            lp, ent = _full(head, hidden, targets, 0.7)
        grads.append((lp, ent, *torch.autograd.grad((lp * weights).sum(), [hidden, *head.parameters()])))
    for full, chunked in zip(*grads, strict=True):
        torch.testing.assert_close(chunked, full, **TOL)


def test_head_logprobs_without_grad_or_entropy():
    head, hidden, targets = (
        torch.nn.Linear(8, 50, bias=False),
        torch.randn(10, 8),
        torch.randint(0, 50, (10,)),
    )
    with torch.no_grad():
        lp, ent = head_logprobs(head, hidden, targets, temperature=1.0, chunk=3, entropy=False)
    assert ent is None and lp.shape == (10,)
    torch.testing.assert_close(lp, _full(head, hidden, targets, 1.0)[0], **TOL)


def _learner(*overrides: str) -> Learner:
    cfg = load_config("jobs/configs/tiny.yaml", [*BASE, *overrides])
    return Learner(learner_spec(cfg, resolve_model("builtin:tiny")))


def _grads_and_metrics(learner, batch, temperature):
    learner.passes.temperature = temperature
    loss, sums = learner._micro_step(batch, float(batch.loss_mask.sum()))
    grads = torch.autograd.grad(loss, learner.params, allow_unused=True)
    return (
        loss,
        [torch.zeros_like(p) if g is None else g for p, g in zip(learner.params, grads, strict=True)],
        sums,
    )


@pytest.mark.parametrize("overrides", [(), LORA, (*LORA[:-1], "model.lora.target_modules=.*q_proj|lm_head")],
                         ids=["full-tied", "lora", "lora-head"])
def test_learner_loss_gradients_and_metrics_equal_the_unchunked_path(overrides):
    """builtin:tiny ties its head to the embedding: the head's gradient lands in that one Parameter."""
    batch = rows_batch(ROWS)
    batch = dataclasses.replace(batch, rollout_logprobs=-torch.rand(batch.input_ids.shape) * batch.loss_mask)
    results = []
    for chunk in (0, 5):  # 5 divides no row's window
        learner = _learner(*overrides, f"learner.logits_chunk_tokens={chunk}", "algo.kl_coef=0.1")
        results.append(_grads_and_metrics(learner, batch, temperature=0.7))
    (loss0, grads0, sums0), (loss1, grads1, sums1) = results
    torch.testing.assert_close(loss1, loss0, **TOL)
    for g1, g0 in zip(grads1, grads0, strict=True):
        torch.testing.assert_close(g1, g0, **TOL)
    flat0, flat1 = _flat(sums0), _flat(sums1)
    assert flat1.keys() == flat0.keys()
    for key in flat0:
        assert flat1[key] == pytest.approx(flat0[key], rel=1e-5, abs=1e-5), key


def _flat(sums: TokenSums) -> dict[str, float]:
    """Every sum of a micro-batch under one name (per-role ones as `<sum>/<role>`), those measured only."""
    out = {k: v for k, v in dataclasses.asdict(sums).items() if k != "roles" and v is not None}
    out.update({f"{name}/{role}": v for name, per_role in dataclasses.asdict(sums.roles).items()
                for role, v in per_role.items()})
    return out


def test_bf16_autocast_rounds_the_head_as_the_full_logits_do():
    torch.manual_seed(0)
    head, hidden = torch.nn.Linear(16, 40, bias=False), torch.randn(11, 16, requires_grad=True)
    targets = torch.randint(0, 40, (11,))
    out = []
    for chunked in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lp = (head_logprobs(head, hidden, targets, temperature=1.0, chunk=4, entropy=False)[0] if chunked
                  else _full(head, hidden, targets, 1.0)[0])
        out.append((lp, *torch.autograd.grad(lp.sum(), [hidden, head.weight])))
    for full, chunked in zip(*out, strict=True):
        torch.testing.assert_close(chunked, full, rtol=2e-2, atol=2e-2)
    assert not torch.equal(out[0][0], _full(head, hidden, targets, 1.0)[0])  # the head did run in bf16
