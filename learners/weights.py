"""Model construction and weight views shared by the learner backends: load, wrap with LoRA, export."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()  # one bar per weight load floods the driver log through Ray
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_policy_model(model_path: str, dtype: str, lora: Any) -> torch.nn.Module:
    """The HF model at `model_path`, wrapped with a LoRA adapter on all linear layers when enabled."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES[dtype])
    if not lora.enabled:
        return model
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
        target_modules=lora.target_modules, task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


@torch.no_grad()
def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full weights under the base model's HF names; LoRA deltas are added without mutating the model."""
    if not is_lora(model):
        return {k: v.detach() for k, v in model.state_dict().items()}
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    out: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            adapter = module.active_adapters[0]
            weight = module.get_base_layer().weight
            out[f"{name}.weight"] = weight + module.get_delta_weight(adapter).to(weight.dtype)
    for key, value in base.state_dict().items():
        if "lora_" not in key:
            out.setdefault(key.replace(".base_layer.", "."), value.detach())
    return out


@torch.no_grad()
def adapter_payload(model: torch.nn.Module, policy_id: str) -> dict[str, Any]:
    """What a LoRA-only sync ships: the adapter's tensors under peft's saved names (as in
    adapter_model.safetensors) and its config as a plain dict (as in adapter_config.json)."""
    from peft import get_peft_model_state_dict

    tensors = {k: v.detach().to("cpu", copy=True) for k, v in get_peft_model_state_dict(model).items()}
    config = model.peft_config["default"].to_dict()
    # Sets (target_modules) and enums are not JSON; engines write this dict as adapter_config.json.
    config = {k: sorted(v) if isinstance(v, set) else getattr(v, "value", v) for k, v in config.items()}
    return {"policy_id": policy_id, "tensors": tensors, "config": config}


def export_hf(model: torch.nn.Module, model_path: str, dtype: str, out_dir: str) -> None:
    """Write a plain HF folder (merged weights) and, for LoRA, the adapter beside it in `adapter/`."""
    plain = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES[dtype])
    plain.load_state_dict(merged_state_dict(model), strict=False)
    plain.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(out_dir)
    if is_lora(model):
        model.save_pretrained(f"{out_dir}/adapter")
