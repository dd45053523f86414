"""The vLLM worker extension (`LLM(worker_extension_cls=...)`) that receives weights over the NCCL channel
of cluster.nccl: the bytes land on the worker's own device and are reloaded there, so they never pass
through the engine's Python process. Reached through `LLM.collective_rpc("weight_channel_*", ...)`."""

from __future__ import annotations

import math
from typing import Any

import torch

from cluster.nccl import WeightChannel
from rollout.vllm_readback import served_terms
from rollout.vllm_support import probe_error, probe_name


class WeightChannelExtension:
    """Mixed into vLLM's Worker class, so `self` is the worker (model_runner, reload_weights)."""

    def weight_channel_join(self, host: str, port: int, rank: int, world_size: int, timeout_s: float) -> None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        self.weight_channel = WeightChannel(host, port, rank, world_size, timeout_s, backend)

    def weight_channel_receive(self, version: int, bucket_bytes: int) -> dict[str, Any]:
        """One broadcast in, reloaded in place; returns {"bytes", "fingerprint", "probe_error"} of what the
        model now serves (cluster.fingerprint terms, as VLLMEngine.load_weights reports them)."""
        weights = dict(self.weight_channel.receive(version, bucket_bytes))
        self.reload_weights(weights_iterator=list(weights.items()))
        model = self.model_runner.get_model()
        terms, _ = served_terms(model, weights)
        name = probe_name(weights)
        return {"bytes": sum(t.numel() * t.element_size() for t in weights.values()),
                "fingerprint": math.fsum(terms),
                "probe_error": probe_error(model, name, weights[name]) if name else 0.0}
