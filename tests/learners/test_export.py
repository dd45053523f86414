"""learners.state.export: the served weights module by module equal the whole export (merge_for_serving) in
names, order-independent values and dtypes, plain and LoRA; the layout matches what is yielded; each gather
holds one module (a stand-in for ZeRO-3's GatheredParameters counts what is gathered at once); only the
copying rank produces tensors, and every rank enters the same gathers."""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import AutoModelForCausalLM

from cluster.buckets import meta_of
from jobs.config import load_config
from jobs.models.resolve import resolve_model
from learners.state.export import serving_layout, serving_tensors, snapshot_by_module, whole
from learners.state.weights import load_policy_model, merge_for_serving, take_snapshot

LORA = ["model.lora.enabled=true", "model.lora.rank=4", "model.lora.alpha=8", "model.lora.dropout=0.0",
        "model.lora.target_modules=all-linear", "model.dtype=float32"]


@pytest.fixture(scope="module")
def models():
    model_path = resolve_model("builtin:tiny")
    plain = AutoModelForCausalLM.from_pretrained(model_path)
    torch.manual_seed(0)
    lora = load_policy_model(model_path, "float32", load_config("jobs/configs/tiny.yaml", LORA).model.lora)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)  # a nonzero update to merge
    return {"plain": plain, "lora": lora}


@pytest.mark.parametrize("kind", ["plain", "lora"])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_by_module_equals_the_whole_export(models, kind, dtype):
    model = models[kind]
    whole_export = merge_for_serving(model, dtype)[0]
    by_module = list(serving_tensors(model, dtype))
    assert sorted(n for n, _ in by_module) == sorted(whole_export)
    for name, tensor in by_module:
        assert tensor.dtype == whole_export[name].dtype and torch.equal(tensor, whole_export[name]), name
    assert serving_layout(model, dtype) == [meta_of(n, t) for n, t in by_module]


class CountingGather:
    """Stands in for deepspeed.zero.GatheredParameters: records the bytes each gather holds."""

    def __init__(self) -> None:
        self.held: list[int] = []

    def __call__(self, params):
        self.held.append(sum(p.numel() * p.element_size() for p in params))
        return contextlib.nullcontext()


def test_each_gather_holds_one_module_and_only_the_copying_rank_copies(models):
    model = models["plain"]
    gather = CountingGather()
    assert list(serving_tensors(model, None, gather, copies=False)) == []  # rank 1: gathers, yields nothing
    rank1 = list(gather.held)
    gather.held.clear()
    names = [n for n, _ in serving_tensors(model, None, gather, copies=True)]
    assert gather.held == rank1  # the same gathers in the same order on every rank: collectives line up
    whole_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    largest = max(sum(p.numel() * p.element_size() for p in m.parameters(recurse=False))
                  for m in model.modules())
    assert max(gather.held) == largest < whole_bytes / 4
    assert len(names) == len(merge_for_serving(model)[0])


def test_snapshot_by_module_equals_the_whole_snapshot(models):
    model = models["lora"]
    ours, theirs = snapshot_by_module(model, "p", whole, copies=True), take_snapshot(model, "p")
    assert ours is not None and ours.merged.keys() == theirs.merged.keys()
    assert all(torch.equal(ours.merged[n], theirs.merged[n]) for n in theirs.merged)
    assert ours.merge_rounding == pytest.approx(theirs.merge_rounding)
    assert ours.lora_state is not None and theirs.lora_state is not None
    assert all(torch.equal(ours.lora_state[k], v) for k, v in theirs.lora_state.items())
    assert snapshot_by_module(model, "p", whole, copies=False) is None
