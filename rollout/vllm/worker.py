"""The vLLM worker extension (`LLM(worker_extension_cls=...)`) that receives weights over the NCCL channel
of cluster.nccl: the bytes land on the worker's own device and are loaded there, so they never pass
through the engine's Python process. Reached through `LLM.collective_rpc("weight_channel_*", ...)`."""

from __future__ import annotations

from cluster.fingerprint import fingerprint
from cluster.nccl import WeightChannel
from cluster.packing import tensor_bytes
from cluster.transport import Report
from rollout.vllm.readback import served_errors
from rollout.vllm.repack import Kernels, load_in_place


class WeightChannelExtension:
    """Mixed into vLLM's Worker class, so `self` is the worker (model_runner, reload_weights)."""

    def weight_channel_join(self, host: str, port: int, rank: int, world_size: int, timeout_s: float,
                            backend: str) -> None:
        # The backend is the driver's decision for every end of the channel, never this device's guess.
        self.weight_channel = WeightChannel(host, port, rank, world_size, timeout_s, backend)

    def weight_channel_receive(self, version: int, bucket_bytes: int, kernels: Kernels | None) -> Report:
        """One broadcast in, loaded in place (`kernels`: rollout.vllm.repack's path, else vLLM's reload);
        returns {"bytes", "fingerprint" of the tensors received, "errors": the served tensors' sketch errors
        (rollout.vllm.readback.served_errors)}, for VLLMEngine.nccl_receive to check as load_weights does."""
        weights = dict(self.weight_channel.receive(version, bucket_bytes))
        model = self.model_runner.get_model()
        if kernels is None or not load_in_place(model, weights, kernels):
            self.reload_weights(weights_iterator=list(weights.items()))
        return {"bytes": tensor_bytes(weights),
                "fingerprint": fingerprint(weights), "errors": served_errors(model, weights)}
