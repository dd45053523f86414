"""Multi-LoRA serving on the tiny model: one engine holds the base model plus one adapter per policy; requests
are routed to an adapter by name; a LoRA-only sync replaces one policy's adapter, is verified by fingerprint
over the adapter tensors, and leaves every other policy's outputs alone. The same for the vLLM engine and
the HF stand-in."""

from __future__ import annotations

import functools

import pytest
import torch

from cluster.payloads import AdapterPayload
from jobs.models.resolve import resolve_model
from learners.config import LoraConfig
from learners.state.weights import adapter_payload, load_policy_model
from rollout.engine import Sampling
from rollout.hf_engine import HFEngine
from rollout.lora import adapter_fingerprint

RANK = 8
REQUESTS = [
    [{"role": "user", "content": "Write the digit 7."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12 + 30?"}],
]
GREEDY = Sampling(temperature=0.0, max_new_tokens=8)


@pytest.fixture(scope="module")
def tiny() -> str:
    return resolve_model("builtin:tiny")


def _adapter(tiny: str, policy_id: str, seed: int) -> AdapterPayload:
    """A LoRA adapter of the learner's shape with random (visibly non-zero) A and B, as a sync payload."""
    lora = LoraConfig(enabled=True, rank=RANK, alpha=16, dropout=0.0, target_modules="all-linear")
    model = load_policy_model(tiny, "float32", lora)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return adapter_payload(model, policy_id)


@pytest.fixture(scope="module")
def adapters(tiny) -> dict[str, AdapterPayload]:
    return {"a1": _adapter(tiny, "a", 1), "a2": _adapter(tiny, "a", 2), "b": _adapter(tiny, "b", 3)}


def _vllm(tiny: str):
    from rollout.vllm.engine import VLLMEngine

    return VLLMEngine(tiny, kv_cache_gb=0.25, max_loras=2, max_lora_rank=RANK)


@pytest.fixture(scope="module", params=["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def engine(request, tiny):
    return HFEngine(tiny) if request.param == "hf" else _vllm(tiny)


def _ids(engine, adapter: str | None) -> list[list[int]]:
    return [c.response_ids for c in engine.generate(REQUESTS, GREEDY, adapter)]


def test_adapters_of_two_policies_serve_different_outputs_through_one_engine(engine, adapters):
    base = _ids(engine, None)
    for payload, version in ((adapters["a1"], 1), (adapters["b"], 1)):
        report = engine.load_adapter(payload, version)
        assert report["fingerprint"] == adapter_fingerprint(payload)
        assert report["bytes"] == sum(t.numel() * t.element_size() for t in payload.tensors.values())
    a, b = _ids(engine, "a"), _ids(engine, "b")
    assert a != b and a != base and b != base
    assert _ids(engine, None) == base  # the base model is untouched
    out = engine.generate(REQUESTS, GREEDY, "a")
    assert {(c.policy_id, c.version) for c in out} == {("a", 1)}


def test_lora_only_sync_changes_its_policy_only_and_restores_exactly(engine, adapters):
    engine.load_adapter(adapters["a1"], 1)
    engine.load_adapter(adapters["b"], 1)
    a1, b = _ids(engine, "a"), _ids(engine, "b")
    a1_logprobs = [c.logprobs for c in engine.generate(REQUESTS, GREEDY, "a")]

    assert engine.load_adapter(adapters["a2"], 2)["fingerprint"] == adapter_fingerprint(adapters["a2"])
    assert _ids(engine, "a") != a1
    assert _ids(engine, "b") == b
    assert {c.version for c in engine.generate(REQUESTS, GREEDY, "a")} == {2}

    engine.load_adapter(adapters["a1"], 3)
    restored = engine.generate(REQUESTS, GREEDY, "a")
    assert [c.response_ids for c in restored] == a1
    assert [c.logprobs for c in restored] == a1_logprobs
    assert _ids(engine, "b") == b


def test_policy_without_an_adapter_is_served_by_the_base_model(engine):
    assert _ids(engine, "never-synced") == _ids(engine, None)


def _served(engine, policy_id: str, payload: AdapterPayload) -> float:
    """The engine's read-back of what it serves for `policy_id`, under the names of `payload`."""
    if isinstance(engine, HFEngine):
        from peft import get_peft_model_state_dict

        from cluster.fingerprint import fingerprint

        held = get_peft_model_state_dict(engine.model, adapter_name=policy_id)
        return fingerprint({k: held[k] for k in payload.tensors})
    from rollout.vllm.support import adapter_fingerprint_served

    lora_id = engine.adapters[policy_id][0].lora_int_id
    return engine.llm.collective_rpc(functools.partial(adapter_fingerprint_served, lora_id=lora_id,
                                                       payload=payload))[0]


def test_reported_fingerprint_is_read_back_from_the_served_adapter(engine, adapters):
    """Checked against another version's payload, the served adapter's fingerprint differs: a load that
    did not land cannot report the sender's value."""
    engine.load_adapter(adapters["a1"], 4)
    assert _served(engine, "a", adapters["a1"]) == adapter_fingerprint(adapters["a1"])
    assert _served(engine, "a", adapters["a2"]) != adapter_fingerprint(adapters["a2"])


def test_adapter_ranks_round_up_to_one_vllm_sizes_for():
    from rollout.vllm.engine import _lora_kwargs

    assert _lora_kwargs(0, 64) == {}
    assert _lora_kwargs(2, 4)["max_lora_rank"] == 8 and _lora_kwargs(2, 64)["max_lora_rank"] == 64
    assert _lora_kwargs(3, 300) == {
        "enable_lora": True,
        "max_loras": 3,
        "max_lora_rank": 320,
        "max_cpu_loras": 4,
    }
    with pytest.raises(ValueError, match="exceeds vLLM's largest LoRA rank"):
        _lora_kwargs(1, 1024)


def test_a_turn_the_base_model_served_for_a_missing_adapter_fails_the_step(engine, adapters):
    """An adapter never loaded: the engine serves its requests from the base model without an
    error (as vLLM does), but the completion says so, and the step's served check stops on it instead of
    training that policy on the base model's samples."""
    from jobs.driver.served import ServedError, check_served
    from marl.policy_map import PolicyMap
    from marl.types import Episode, Task, Turn
    from rollout.engine import BASE_MODEL

    engine.load_adapter(adapters["a1"], 5)
    served = {p: engine.generate(REQUESTS[:1], GREEDY, p)[0] for p in ("a", "never-loaded")}
    assert (served["a"].policy_id, served["a"].version) == ("a", 5)
    assert served["never-loaded"].policy_id == BASE_MODEL
    roles = {"a": "solver", "never-loaded": "critic"}
    turns = [Turn(role=roles[p], agent=roles[p], round=0, messages=[], completion=c)
             for p, c in served.items()]
    episode = Episode(task=Task("t", "q", "1"), sample_index=0, workflow="voting", turns=turns)
    policy_map = PolicyMap((("solver", "a"), ("critic", "never-loaded")))
    check_served([episode], policy_map, {"a": 5}, step=5)  # never-loaded untracked: nothing to check
    with pytest.raises(ServedError, match=r"role 'critic': expected policy 'never-loaded' at version 5, "
                                          r"served by '<base model>' at version 0 \(1 turns\)"):
        check_served([episode], policy_map, {"a": 5, "never-loaded": 5}, step=5)
    with pytest.raises(ServedError, match="expected policy 'a' at version 6, served by 'a' at version 5"):
        check_served([episode], policy_map, {"a": 6}, step=6)  # a stale adapter fails the same way
