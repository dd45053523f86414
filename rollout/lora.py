"""LoRA adapters as sync payloads: what a learner ships in multi-LoRA serving and how engines receive it.

A payload is {"policy_id": str, "tensors": {peft saved name: tensor}, "config": adapter_config dict}
(learners.weights.adapter_payload). Engines write it as a peft adapter folder (what both vLLM and peft
load) and report the fingerprint of the adapter tensors they serve, under the same names.
"""

from __future__ import annotations

import json
import os
from typing import Any

from cluster.fingerprint import fingerprint


def adapter_fingerprint(payload: dict[str, Any]) -> float:
    """The sender's side of a LoRA-only sync check: cluster.fingerprint over the adapter tensors."""
    return fingerprint(payload["tensors"])


def adapter_bytes(payload: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in payload["tensors"].values())


def write_adapter(folder: str, payload: dict[str, Any]) -> str:
    """A peft adapter folder (adapter_model.safetensors + adapter_config.json) holding `payload`."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    # Clones: safetensors refuses tensors that share storage.
    save_file({k: v.detach().cpu().clone().contiguous() for k, v in payload["tensors"].items()},
              os.path.join(folder, "adapter_model.safetensors"))
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(payload["config"], f)
    return folder


def lora_scaling(config: dict[str, Any]) -> float:
    """The factor vLLM folds into lora_B on load (alpha / r, or alpha / sqrt(r) with rsLoRA)."""
    rank, alpha = config["r"], config["lora_alpha"]
    return alpha / rank**0.5 if config.get("use_rslora") else alpha / rank


def module_of(peft_name: str) -> tuple[str, str]:
    """'base_model.model.model.layers.0.mlp.down_proj.lora_A.weight' -> ('model.layers.0.mlp.down_proj', 'A')."""
    body = peft_name.removeprefix("base_model.model.")
    module, kind, _ = body.rsplit(".", 2)
    return module, kind.removeprefix("lora_")
