"""The engine side of the NCCL transport: VLLMEngine builds vLLM's weight-transfer engine (the project's
CheckedNcclEngine, rollout/vllm/worker.py) in its worker, which receives a bucketed broadcast there bucket by
bucket through vLLM's own update lifecycle, and reports version and fingerprint like load_weights. On CPU the
channel runs over gloo (the same roles, the same bucket rule); the gpu test uses NCCL between two devices."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from cluster.group import Group, MemberOptions
from cluster.weight_transfer import broadcast_nccl, form_channel
from jobs.models.resolve import resolve_model
from rollout.engine import EngineMember, Sampling
from rollout.vllm.engine import VLLMEngine
from tests.cluster.test_weight_transfer import Sender

pytestmark = pytest.mark.vllm
REQUESTS = [[{"role": "user", "content": "Write the digit 7."}], [{"role": "user", "content": "hi"}]]
GREEDY = Sampling(temperature=0.0, max_new_tokens=8)


def _other_state() -> dict[str, torch.Tensor]:
    """Another random tiny model; the final norm's sign flipped so greedy outputs visibly change."""
    state = {k: v.detach().clone() for k, v in
             AutoModelForCausalLM.from_pretrained(resolve_model("builtin:tiny?seed=1")).state_dict().items()}
    state["model.norm.weight"].neg_()
    return state


def test_engine_receives_a_bucketed_broadcast_inside_its_worker_and_verifies_it():
    tiny = resolve_model("builtin:tiny")
    src = Group(Sender, 0, "run:learner:pi", per_member_kwargs=[{"weights": _other_state()}])
    dst = Group(VLLMEngine, 0, "run:engine:generator", args=(tiny,),
                per_member_kwargs=[{"kv_cache_gb": 0.25, "weight_channel": "nccl"}])
    try:
        before = dst.submit(EngineMember.generate, REQUESTS, GREEDY).result(120)[0]
        assert form_channel(src, [dst], 120.0, 4096, "gloo") == 2  # many buckets
        out = broadcast_nccl(src, [dst], 5, 120.0)
        assert out["verified"] == 1.0
        report = dst.submit(VLLMEngine.transfer_report).result(120)[0]
        # loaded as they came, not kept: vLLM's layerwise reload (this CPU's path) holds a layer's tensors
        # until the layer is whole, and one layer of the tiny model spans several 4 KiB buckets; never all
        assert report["buckets"] > 10 and report["held_peak"] <= report["buckets"] // 3
        assert report["errors"] and max(report["errors"].values()) < 1e-4
        after = dst.submit(EngineMember.generate, REQUESTS, GREEDY).result(120)[0]
        assert [c.response_ids for c in after] != [c.response_ids for c in before]
        assert {c.version for c in after} == {5}
    finally:
        src.shutdown()
        dst.shutdown()


@pytest.mark.gpu
def test_nccl_into_a_vllm_engine_on_another_gpu(ray_gpus):
    gpu = MemberOptions(num_cpus=1, num_gpus=1)
    state = {k: v.cuda() for k, v in _other_state().items()}
    src = Group(
        Sender, 1, "gpu:learner:pi", options=gpu, per_member_kwargs=[{"weights": state, "backend": "nccl"}]
    )
    dst = Group(
        VLLMEngine,
        1,
        "gpu:engine:generator",
        args=(resolve_model("builtin:tiny"),),
        options=gpu,
        per_member_kwargs=[{"kv_cache_gb": 0.0, "gpu_memory_utilization": 0.3, "weight_channel": "nccl"}],
    )
    try:
        form_channel(src, [dst], 300.0, 1 << 16, "nccl")
        assert broadcast_nccl(src, [dst], 1, 300.0)["verified"] == 1.0
    finally:
        src.shutdown()
        dst.shutdown()
