"""Merged serving with adapter-only syncs (sync.lora_delta): the adapter travels, each engine merges it into
its own base weights, and what it serves is bit for bit the learner's merge, checked by fingerprint; an engine
whose base differs is caught; only the layers whose adapter changed are rewritten."""

from __future__ import annotations

import pytest
import torch

from cluster.transport import SyncError
from jobs.config import load_config
from jobs.driver.handles import build_handles
from jobs.models.resolve import resolve_model
from jobs.plan.layout import run_layout
from learners.state.weights import merge_layer
from marl.tasks import get_family
from rollout.lora import BaseWeights, merge_into, stack_of
from rollout.vllm.repack import _adjacent

ROLES = ["generator", "aggregator"]
LORA = ("model.lora.enabled=true", "model.lora.rank=8", "model.lora.alpha=16")


def _system(tmp_path, *overrides: str):
    cfg = load_config("jobs/configs/tiny.yaml", [
        f"out_dir={tmp_path}", "marl.workflow=voting", "marl.sharing=isolated", "rollout.engines_per_role=0",
        "learner.ranks=0", "rollout.torch_threads=1", *LORA, *overrides])
    return build_handles(run_layout(cfg), resolve_model(cfg.model.path), get_family("digit"))


def _move_adapter(learner, seed: int, only: str | None = None) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, module in learner.model.named_modules():
            if hasattr(module, "lora_B") and (only is None or name.endswith(only)):
                w = module.lora_B["default"].weight
                w.copy_(torch.randn(w.shape, generator=g) * 0.05)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engines_serve_the_learners_merge_from_the_adapter_alone(tmp_path, dtype):
    emulated = "model.allow_emulated_bf16=true"  # bf16 numerics on any CPU (jobs/config/precision.py)
    handles = _system(tmp_path, f"model.dtype={dtype}", emulated)
    full = _system(tmp_path / "full", f"model.dtype={dtype}", emulated, "sync.lora_delta=false")
    try:
        learner = handles.learners["generator"].group._members[0]
        engine = handles.engines["generator"].group._members[0]
        _move_adapter(learner, 0)
        out = handles.sync(1)
        assert out["sync/verified"] == 2.0
        merged = learner.get_weights()
        served = engine.model.state_dict()
        assert all(torch.equal(served[k], v) for k, v in merged.items())  # bit for bit the learner's merge
        _move_adapter(full.learners["generator"].group._members[0], 0)
        full_bytes = full.sync(1)["sync/bytes"]
        # adapters, not the merged model (tiny: rank 8 is a large share)
        assert out["sync/bytes"] < full_bytes / 2
    finally:
        handles.shutdown()
        full.shutdown()


def test_an_engine_with_other_base_weights_is_caught(tmp_path):
    handles = _system(tmp_path)
    try:
        learner = handles.learners["aggregator"].group._members[0]
        engine = handles.engines["aggregator"].group._members[0]
        handles.sync(1)
        _move_adapter(learner, 1)
        engine._base.base["model.layers.0.self_attn.q_proj.weight"] += 1.0  # its copy of the base went bad
        with pytest.raises(SyncError, match="aggregator"):
            handles.sync(2)
    finally:
        handles.shutdown()


def test_only_layers_whose_adapter_changed_are_merged_again(tmp_path):
    handles = _system(tmp_path)
    try:
        learner = handles.learners["generator"].group._members[0]
        _move_adapter(learner, 2)
        base = BaseWeights(learner.model_path, torch.float32)
        payload = learner.get_lora_delta()
        first = base.merged_layers(payload.adapter, changed_only=True)
        assert len(first) == sum(1 for k in payload.adapter.tensors if "lora_A" in k)
        _move_adapter(learner, 3, only="layers.0.self_attn.q_proj")
        again = base.merged_layers(learner.get_lora_delta().adapter, changed_only=True)
        assert list(again) == ["model.layers.0.self_attn.q_proj.weight"]
    finally:
        handles.shutdown()


@pytest.mark.parametrize("scale", [2.0, 0.5, 1.7, 16 / 12])
def test_a_merge_into_a_reused_buffer_rounds_as_the_learners_merge(scale):
    """The engine's merge (fused addmm for power-of-two scales, else the learner's steps in place) is bit for
    bit learners.state.weights.merge_layer's, whose fingerprint the engine must reproduce."""
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(192, 576, generator=g) * 0.02
    b, a = torch.randn(192, 16, generator=g) * 0.01, torch.randn(16, 576, generator=g) * 0.01
    out = torch.empty(192, 576)
    assert merge_into(out, w0, b, a, scale) is out
    assert torch.equal(out, merge_layer(w0, (b @ a) * scale, torch.float32)[0])


@pytest.mark.parametrize("column_major", [False, True])
def test_row_blocks_of_one_buffer_load_as_one_view_whatever_its_layout(column_major):
    """rollout.vllm.repack._adjacent: parts back to back along rows of one buffer, stored
    row-major or column-major (BaseWeights' merge buffers), are one view of it; out of order, with
    a gap or of another buffer: None."""
    whole = (
        torch.arange(7 * 3, dtype=torch.float32).view(3, 7).T
        if column_major
        else torch.arange(21.0).view(7, 3)
    )
    parts = list(whole.split([4, 1, 2]))
    view = _adjacent(parts)
    assert view is not None and view.data_ptr() == whole.data_ptr() and torch.equal(view, whole)
    assert _adjacent(parts[::-1]) is None and _adjacent([parts[0], parts[2]]) is None
    assert _adjacent([parts[0], parts[1].clone()]) is None


def test_a_fused_stacks_parts_merge_into_row_blocks_of_one_buffer_that_loads_as_one_view(tmp_path):
    """The engine's merge buffers of q, k, v (stacked into vLLM's qkv_proj) are row blocks of one
    tensor, in stacking order: the in-place load takes them as one view
    (rollout.vllm.repack._adjacent), nothing concatenated."""
    handles = _system(tmp_path)
    try:
        learner = handles.learners["generator"].group._members[0]
        _move_adapter(learner, 4)
        stacks = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
        base = BaseWeights(learner.model_path, torch.float32, stacks)
        merged = base.merged_layers(learner.get_lora_delta().adapter, changed_only=True)
        names = stack_of("model.layers.1.self_attn.k_proj.weight", stacks)
        assert names == [f"model.layers.1.self_attn.{p}_proj.weight" for p in "qkv"]
        view = _adjacent([merged[n] for n in names])
        assert view is not None and view.data_ptr() == merged[names[0]].data_ptr()
        assert torch.equal(view, torch.cat([merged[n] for n in names]))
        assert _adjacent([merged[n] for n in reversed(names)]) is None  # not in stacking order: concatenated
        assert stack_of("model.layers.1.mlp.down_proj.weight", stacks) == [
            "model.layers.1.mlp.down_proj.weight"
        ]
    finally:
        handles.shutdown()


def test_the_merge_runs_on_the_engines_device(tmp_path):
    """BaseWeights(device=...): base, buffers and merge on the engine's device (a GPU engine merges there, not
    in host fp32 buffers). On this CPU: device="cpu" gives the default's result bit for bit, and "meta" (no
    data, shapes only) shows every tensor of the merge follows the device asked for."""
    handles = _system(tmp_path)
    try:
        learner = handles.learners["generator"].group._members[0]
        _move_adapter(learner, 5)
        adapter = learner.get_lora_delta().adapter
        host = BaseWeights(learner.model_path, torch.float32).merged_layers(adapter, changed_only=False)
        on_cpu = BaseWeights(learner.model_path, torch.float32, device="cpu").merged_layers(adapter, False)
        assert host.keys() == on_cpu.keys() and all(torch.equal(host[k], on_cpu[k]) for k in host)
        meta = BaseWeights(learner.model_path, torch.float32, device="meta")
        merged = meta.merged_layers(adapter, changed_only=False)
        assert merged.keys() == host.keys() and {t.device.type for t in merged.values()} == {"meta"}
        assert {t.device.type for t in meta.base.values()} == {"meta"}
        assert meta.merged_layers(adapter, changed_only=True) == {}  # the change check compares host copies
    finally:
        handles.shutdown()


def test_the_sent_side_sketch_is_taken_on_the_models_device(monkeypatch):
    """rollout.vllm.readback.expected_sketches moves each sent tensor to the served model's device before
    sketching it (an engine on a GPU sketches there), and gives the host's sketch bit for bit on this CPU."""
    from rollout.vllm import readback

    model = torch.nn.Linear(4, 6)
    sent = {"weight": torch.randn(6, 4), "bias": torch.randn(6)}
    plain = {n: readback.checked_sketch(n, t, torch.float32) for n, t in sent.items()}
    got = readback.expected_sketches(model, sent)
    assert all(got[n][0] == tuple(sent[n].shape) and torch.equal(got[n][1], plain[n]) for n in sent)
    seen = []
    monkeypatch.setattr(readback, "checked_sketch", lambda name, t, dtype: seen.append(t.device.type))
    readback.expected_sketches(model.to("meta"), sent)
    assert seen == ["meta", "meta"]
