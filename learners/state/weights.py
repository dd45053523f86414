"""Model construction and weight views shared by the learner backends: load, wrap with LoRA, export."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from cluster.packing import pack
from cluster.payloads import AdapterPayload
from cluster.sketch import low_rank_sketch, probes, sketch
from learners.config import LoraConfig
from marl.dtypes import DTYPES

hf_logging.disable_progress_bar()  # one bar per weight load floods the driver log through Ray
# A policy's trainable module: a transformers PreTrainedModel, or a peft PeftModel around one. Typed no
# further: their methods (gradient_checkpointing_enable, peft_config, ...) are not torch.nn.Module's.
PolicyModel = Any


def load_policy_model(model_path: str, dtype: str, lora: LoraConfig,
                      attention: str | None = None) -> PolicyModel:
    """The HF model at `model_path` (a transformers PreTrainedModel), wrapped with a LoRA adapter
    on all linear layers (a peft PeftModel) when enabled. `attention`: an attn_implementation, or
    None for the model's default."""
    kwargs = {"attn_implementation": attention} if attention else {}
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES[dtype], **kwargs)
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
def merge_for_serving(model: torch.nn.Module,
                      dtype: torch.dtype | None = None) -> tuple[dict[str, torch.Tensor], float | None]:
    """(full weights under the base model's HF names, LoRA deltas added without mutating the model;
    merge_rounding) in the dtype the engines serve: `dtype`, or each weight's own when None (a learner that
    holds model.dtype itself). Every LoRA layer's W0 + scale·B@A is computed in fp32 and rounded once to it;
    merge_rounding is the share of the LoRA update that rounding loses (`update_lost`), None without LoRA.
    Fp32 master weights served in bf16 are rounded once, here."""
    if not is_lora(model):
        return {k: _serving(v, dtype) for k, v in model.state_dict().items()}, None
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    out: dict[str, torch.Tensor] = {}
    norms: list[torch.Tensor] = []  # per layer [||E||², ||ΔW||²], read back once (one device sync)
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            weight = module.get_base_layer().weight
            merged, err, upd = merge_layer(weight, _lora_delta(module, module.active_adapters[0]),
                                           dtype or weight.dtype)
            out[f"{name}.weight"] = merged
            norms.append(torch.stack([err, upd]))
    for key, value in base.state_dict().items():
        if "lora_" not in key:
            out.setdefault(key.replace(".base_layer.", "."), _serving(value, dtype))
    error_sq, delta_sq = torch.stack(norms).sum(0).tolist() if norms else (0.0, 0.0)
    return out, update_lost(error_sq, delta_sq)


def _serving(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    tensor = tensor.detach()
    return tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor


def merge_layer(base: torch.Tensor, delta: torch.Tensor,
                dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's merge for serving. base W0 [out, in] (any float dtype), delta ΔW [out, in] (fp32).

    Returns (merged, ||E||², ||ΔW||²): merged = cast(W0 + ΔW) [out, in] in `dtype`, the sum taken in fp32 and
    rounded once; E = merged − W0 − ΔW in fp32, the part of the update the served weights miss (with fp32
    serving, only fp32's own rounding of the sum). The squared norms are fp64 scalars on base's device.
    """
    w0 = base.detach().float()
    merged = (w0 + delta).to(dtype)
    error = (merged.float() - w0).sub_(delta)
    # fp32 sums (pairwise, ~1e-7 relative: ample for a diagnostic ratio) run 3-4x faster than fp64 ones, which
    # convert every element: at 100M+ weights the fp64 sums took half of the learner's side of a LoRA sync.
    return merged, error.square_().sum().double(), delta.square().sum().double()


def update_lost(error_sq: float, delta_sq: float) -> float:
    """Relative update lost to rounding over all merged layers l: sqrt(Σ_l ||E_l||²) / sqrt(Σ_l ||ΔW_l||²),
    the Frobenius norm of every layer's error (`merge_layer`) taken together over that of the whole update.
    1.0: the engines serve the base (ΔW below the serving dtype's resolution of W0); ~0: the update arrives
    whole. 0.0 when there is no update yet (ΔW = 0, e.g. LoRA's B at initialisation)."""
    return (error_sq / delta_sq) ** 0.5 if delta_sq > 0 else 0.0


def _lora_delta(module: Any, adapter: str) -> torch.Tensor:
    """ΔW = scale·B@A of a LoRA linear layer in fp32, [out, in] like its base weight (peft's get_delta_weight
    returns it in the adapter's dtype). Other LoRA kinds (embedding, DoRA) go through peft, then to fp32."""
    from peft.tuners.lora import Linear

    if not isinstance(module, Linear) or module.use_dora.get(adapter, False):
        return module.get_delta_weight(adapter).float()
    a, b = module.lora_A[adapter].weight.float(), module.lora_B[adapter].weight.float()
    delta = (b @ a) * module.scaling[adapter]
    return delta.T if module.fan_in_fan_out else delta


class MergedSketch:
    """The probe sketch (cluster.sketch) of the weights a LoRA policy's engines serve merged, taken without
    merging: a LoRA'd layer's as sketch(W0) + scale·B@(A@P), every other weight's as is. The base is
    frozen, so its sketches are taken once and kept (per tensor, until that tensor is written to). Same
    names as `merge_for_serving`."""

    def __init__(self) -> None:
        # name -> ((data_ptr, _version), sketch)
        self._base: dict[str, tuple[tuple[int, int], torch.Tensor]] = {}

    @torch.no_grad()
    def __call__(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """{served name: [rows, k] fp32 sketch} of `model` (a peft model) merged, in fp32 (unrounded)."""
        from peft.tuners.lora import Linear, LoraLayer

        base = model.get_base_model()
        out: dict[str, torch.Tensor] = {}
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer):
                key, adapter = f"{name}.weight", module.active_adapters[0]
                w0 = module.get_base_layer().weight
                if (
                    isinstance(module, Linear)
                    and not module.fan_in_fan_out
                    and not module.use_dora.get(adapter)
                ):
                    a, b = module.lora_A[adapter].weight, module.lora_B[adapter].weight
                    out[key] = low_rank_sketch(self._sketch(key, w0), b, a, probes(key, a.shape[1]),
                                               module.scaling[adapter])
                else:  # other LoRA kinds: this layer merged, as merge_for_serving does
                    out[key] = sketch(key, w0.float() + _lora_delta(module, adapter))
        for key, value in base.state_dict().items():
            served = key.replace(".base_layer.", ".")
            if "lora_" not in key and served not in out:
                out[served] = self._sketch(served, value)
        return out

    def _sketch(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        # an in-place write bumps _version, a new tensor the pointer
        stamp = (tensor.data_ptr(), tensor._version)
        kept = self._base.get(name)
        if kept is None or kept[0] != stamp:
            kept = self._base[name] = (stamp, sketch(name, tensor))
        return kept[1]


@torch.no_grad()
def adapter_payload(model: torch.nn.Module, policy_id: str) -> AdapterPayload:
    """What a LoRA-only sync ships: the adapter's tensors under peft's saved names (as in
    adapter_model.safetensors), packed into one host buffer (cluster.packing: hundreds of small
    tensors cross Ray as one buffer and a manifest, not one pickle each), and its config as a plain
    dict (as in adapter_config.json)."""
    from peft import get_peft_model_state_dict

    tensors = pack(get_peft_model_state_dict(model))  # the one copy off the learner's (any device's) tensors
    config = model.peft_config["default"].to_dict()
    # Sets (target_modules) and enums are not JSON; engines write this dict as adapter_config.json.
    config = {k: sorted(v) if isinstance(v, set) else getattr(v, "value", v) for k, v in config.items()}
    return AdapterPayload(policy_id, tensors, config)


@dataclass(frozen=True)
class WeightSnapshot:
    """A module's weights gathered once and kept on the host (a ZeRO-3 rank 0 after each step, whose module
    holds a partition otherwise): the merged serving weights and their merge rounding (`merge_for_serving`);
    for LoRA the adapter payload (`adapter_payload`) and the adapter's own state dict."""

    merged: dict[str, torch.Tensor]
    merge_rounding: float | None
    adapter: AdapterPayload | None
    lora_state: dict[str, torch.Tensor] | None


@torch.no_grad()
def take_snapshot(model: torch.nn.Module, policy_id: str) -> WeightSnapshot:
    """Host copies of `model`'s weights as served (in each weight's own dtype), merged now."""
    lora = is_lora(model)
    merged, rounding = merge_for_serving(model)
    return WeightSnapshot(
        merged={k: v.detach().cpu().clone() for k, v in merged.items()}, merge_rounding=rounding,
        adapter=adapter_payload(model, policy_id) if lora else None,
        lora_state={k: v.detach().cpu().clone() for k, v in model.state_dict().items() if "lora_" in k}
        if lora else None,
    )


def serving_weights(model: torch.nn.Module, dtype: torch.dtype, snapshot: WeightSnapshot | None = None,
                    ) -> tuple[dict[str, torch.Tensor], float | None]:
    """(the weights engines serve, as host tensors under HF names; their merge rounding): `snapshot`'s when
    given (the module itself then holds a partition), else `model` merged for serving in `dtype`."""
    if snapshot is not None:
        return snapshot.merged, snapshot.merge_rounding
    merged, rounding = merge_for_serving(model, dtype)
    return {k: v.cpu() for k, v in merged.items()}, rounding


def serving_adapter(model: torch.nn.Module, policy_id: str, snapshot: WeightSnapshot | None = None
                    ) -> AdapterPayload:
    """The LoRA adapter payload (`adapter_payload`), from `snapshot` when it holds one."""
    if snapshot is not None and snapshot.adapter is not None:
        return snapshot.adapter
    return adapter_payload(model, policy_id)


def export_hf(model: torch.nn.Module, model_path: str, dtype: str, out_dir: str,
              snapshot: WeightSnapshot | None = None) -> None:
    """Write a plain HF folder (merged weights) and, for LoRA, the adapter beside it in `adapter/`; the
    weights come from `snapshot` when given (the module itself then holds a partition)."""
    plain = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES[dtype])
    merged = snapshot.merged if snapshot is not None else merge_for_serving(model, DTYPES[dtype])[0]
    plain.load_state_dict(merged, strict=False)
    plain.save_pretrained(out_dir)
    AutoTokenizer.from_pretrained(model_path).save_pretrained(out_dir)
    if is_lora(model):
        model.save_pretrained(
            f"{out_dir}/adapter", state_dict=snapshot.lora_state if snapshot is not None else None
        )
