"""HFEngine on the built-in tiny model: completions, logprobs against a manual forward pass (single and
left-padded batches), determinism, and weight loading.

Measured on the tiny float32 model: the engine's logprobs match a fresh unpadded forward pass to ~5e-7,
also for rows of a left-padded batch; the tolerance below leaves two orders of magnitude of headroom.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from cluster.fingerprint import fingerprint
from jobs.models.resolve import resolve_model
from rollout.engine import Sampling
from rollout.hf_engine import HFEngine

LOGPROB_TOL = 1e-4

REQUESTS = [
    [{"role": "user", "content": "Write the digit 7."}],
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12 + 30? Answer now."}],
]


@pytest.fixture(scope="module")
def tiny() -> str:
    return resolve_model("builtin:tiny")


@pytest.fixture(scope="module")
def engine(tiny) -> HFEngine:
    return HFEngine(tiny, policy_id="pi")


def _manual_logprobs(
    model, prompt_ids: list[int], response_ids: list[int], temperature: float
) -> torch.Tensor:
    """log p(response token | prefix) from one unpadded forward pass, temperature-scaled unless greedy."""
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1:-1].float()
    if temperature:
        logits = logits / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response_ids)[:, None]).squeeze(-1)


def _max_logprob_error(engine: HFEngine, completion, temperature: float) -> float:
    manual = _manual_logprobs(engine.model, completion.prompt_ids, completion.response_ids, temperature)
    return (manual - torch.tensor(completion.logprobs)).abs().max().item()


def test_one_completion_per_request_with_chat_template_prompt_ids(engine, tiny):
    out = engine.generate(REQUESTS, Sampling(temperature=1.0, max_new_tokens=6, seed=1))
    tok = AutoTokenizer.from_pretrained(tiny)
    assert len(out) == len(REQUESTS)
    for messages, c in zip(REQUESTS, out, strict=True):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        expected = tok(text + "<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
        assert c.prompt_ids == expected
        assert len(c.response_ids) == len(c.logprobs) == 6
        assert c.finish_reason == "length"
        assert all(lp <= 0 for lp in c.logprobs)
        assert c.text == tok.decode(c.response_ids, skip_special_tokens=True)
        assert (c.version, c.policy_id) == (0, "pi")


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_logprobs_match_manual_forward_single_request(engine, temperature):
    [c] = engine.generate(REQUESTS[:1], Sampling(temperature=temperature, max_new_tokens=12, seed=3))
    assert _max_logprob_error(engine, c, temperature) < LOGPROB_TOL


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
def test_logprobs_match_manual_forward_in_left_padded_batch(engine, temperature):
    out = engine.generate(REQUESTS, Sampling(temperature=temperature, max_new_tokens=12, seed=4))
    assert len({len(c.prompt_ids) for c in out}) == len(REQUESTS), "prompts must differ in length"
    for c in out:
        assert _max_logprob_error(engine, c, temperature) < LOGPROB_TOL


def test_greedy_is_deterministic_argmax_and_independent_of_padding(engine):
    greedy = Sampling(temperature=0.0, max_new_tokens=10)
    batch = engine.generate(REQUESTS, greedy)
    again = engine.generate(REQUESTS, Sampling(temperature=0.0, max_new_tokens=10, seed=99))
    assert [c.response_ids for c in again] == [c.response_ids for c in batch]
    for messages, c in zip(REQUESTS, batch, strict=True):
        [alone] = engine.generate([messages], greedy)
        assert alone.response_ids == c.response_ids
        ids = torch.tensor([c.prompt_ids + c.response_ids])
        with torch.no_grad():
            logits = engine.model(ids).logits[0, len(c.prompt_ids) - 1:-1]
        assert logits.argmax(-1).tolist() == c.response_ids


def test_same_seed_same_samples_other_seed_other_samples(engine):
    def sample(seed: int) -> list[list[int]]:
        out = engine.generate(REQUESTS, Sampling(temperature=1.0, max_new_tokens=16, seed=seed))
        return [c.response_ids for c in out]

    first = sample(11)
    assert sample(11) == first
    assert sample(12) != first


def test_stops_at_eos_and_keeps_it_while_other_rows_run_to_length(engine):
    eos = engine.eos_ids[0]

    def force_eos_in_row_0(_module, _inputs, logits):
        logits = logits.clone()
        logits[0, -1, eos] += 1e4
        return logits

    handle = engine.model.get_output_embeddings().register_forward_hook(force_eos_in_row_0)
    try:
        stopped, running = engine.generate(REQUESTS[:2], Sampling(temperature=0.0, max_new_tokens=8))
    finally:
        handle.remove()
    assert (stopped.response_ids, stopped.finish_reason, stopped.text) == ([eos], "stop", "")
    assert len(stopped.logprobs) == 1 and stopped.logprobs[0] > -1e-3
    assert running.finish_reason == "length" and len(running.response_ids) == len(running.logprobs) == 8
    assert eos not in running.response_ids
    assert _max_logprob_error(engine, running, 0.0) < LOGPROB_TOL


def _clone(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in state.items()}


def test_load_weights_switches_model_and_restores_exactly(tiny):
    engine = HFEngine(tiny, policy_id="pi")
    greedy = Sampling(temperature=0.0, max_new_tokens=12)
    original_state = _clone(engine.model.state_dict())
    original = engine.generate(REQUESTS, greedy)

    other_state = _clone(
        AutoModelForCausalLM.from_pretrained(resolve_model("builtin:tiny?seed=1")).state_dict()
    )
    assert other_state.keys() == original_state.keys()
    # Random tiny models (tied embeddings) greedily echo the prompt's last token whatever their seed;
    # flipping the final norm's sign makes the other model's greedy text visibly different.
    other_state["model.norm.weight"].neg_()
    report = engine.load_weights(other_state, version=5)
    assert report == {"version": 5, "bytes": sum(t.numel() * t.element_size() for t in other_state.values()),
                      "fingerprint": fingerprint(other_state)}
    assert engine.weight_version() == 5
    switched = engine.generate(REQUESTS, greedy)
    assert [c.response_ids for c in switched] != [c.response_ids for c in original]
    assert {c.version for c in switched} == {5}

    engine.load_weights(original_state, version=6)
    restored = engine.generate(REQUESTS, greedy)
    assert [c.response_ids for c in restored] == [c.response_ids for c in original]
    assert [c.logprobs for c in restored] == [c.logprobs for c in original]
    assert {c.version for c in restored} == {6}


def test_unknown_weight_name_raises_key_error_and_loads_nothing(tiny):
    engine = HFEngine(tiny, policy_id="pi")
    greedy = Sampling(temperature=0.0, max_new_tokens=8)
    before = engine.generate(REQUESTS[:1], greedy)[0].response_ids
    name = next(iter(engine.model.state_dict()))
    weights = {name: torch.zeros_like(engine.model.state_dict()[name]), "no.such.weight": torch.zeros(1)}
    with pytest.raises(KeyError, match="no.such.weight"):
        engine.load_weights(weights, version=3)
    assert engine.weight_version() == 0
    assert engine.generate(REQUESTS[:1], greedy)[0].response_ids == before
