"""LoRA adapters as sync payloads: what a learner ships in multi-LoRA serving and how engines receive it.

A payload is a cluster.payloads.AdapterPayload (learners.state.weights.adapter_payload): its
tensors under peft's saved names, packed into one buffer, and its adapter_config. Engines write it
as a peft adapter folder (what both vLLM and peft load) and report the fingerprint of the adapter
tensors they serve, under the same names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from cluster.fingerprint import fingerprint
from cluster.payloads import AdapterPayload, JsonConfig

if TYPE_CHECKING:  # annotations only: torch is imported where a merge runs
    import torch
    from torch import Tensor


def adapter_fingerprint(payload: AdapterPayload) -> float:
    """The sender's side of a LoRA-only sync check: cluster.fingerprint over the adapter tensors."""
    return fingerprint(payload.tensors)


def write_adapter(folder: str, payload: AdapterPayload) -> str:
    """A peft adapter folder (adapter_model.safetensors + adapter_config.json) holding `payload`."""
    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    # Clones: safetensors refuses tensors that share storage.
    save_file({k: v.detach().cpu().clone().contiguous() for k, v in payload.tensors.items()},
              os.path.join(folder, "adapter_model.safetensors"))
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(dict(payload.config), f)
    return folder


def lora_scaling(config: JsonConfig) -> float:
    """The factor vLLM folds into lora_B on load (alpha / r, or alpha / sqrt(r) with rsLoRA)."""
    rank, alpha = config["r"], config["lora_alpha"]
    return alpha / rank**0.5 if config.get("use_rslora") else alpha / rank


def module_of(peft_name: str) -> tuple[str, str]:
    """'base_model.model.model.layers.0.mlp.down_proj.lora_A.weight' ->
    ('model.layers.0.mlp.down_proj', 'A')."""
    body = peft_name.removeprefix("base_model.model.")
    module, kind, _ = body.rsplit(".", 2)
    return module, kind.removeprefix("lora_")


def merge_into(out: Tensor, w0: Tensor, b: Tensor, a: Tensor, scale: float) -> Tensor:
    """out [o, i] = W0 [o, i] + scale · B [o, r] @ A [r, i], all fp32, rounded as the learner's W0 +
    (B@A)·scale (learners.state.weights.merge_layer) bit for bit, into `out` (no allocation). One fused addmm
    when scale is a power of two (its scaling is then exact, so the single rounding of the sum is the same;
    measured bit-equal); else the learner's own steps in place: product, scaling, sum (addmm's fused scaling
    rounds differently there)."""
    import math

    import torch

    if scale > 0 and math.frexp(scale)[0] == 0.5:
        return torch.addmm(w0, b, a, alpha=scale, out=out)
    return torch.mm(b, a, out=out).mul_(scale).add_(w0)


def stack_of(weight: str, stacks: dict[str, list[str]]) -> list[str]:
    """The HF weights stacked with `weight` into one fused module, in stacking order ([weight] when none):
    'm.layers.0.self_attn.k_proj.weight' with {'qkv_proj': ['q_proj', 'k_proj', 'v_proj']} -> q, k, v's."""
    path, leaf = weight.rsplit(".", 1)
    prefix, _, part = path.rpartition(".")
    for parts in stacks.values():
        if part in parts:
            return [f"{prefix}.{p}.{leaf}" if prefix else f"{p}.{leaf}" for p in parts]
    return [weight]


class BaseWeights:
    """An engine's copy of the base model's weights, read once from the model folder in the serving dtype, and
    the merge of a LoRA adapter into them: what an engine serves when only adapters travel (merged serving).

    The merge is the learner's (learners.state.weights.merge_layer): W0 + scale·B@A summed in fp32 and
    rounded once to the serving dtype, so the engine's merged weights are bit for bit those the learner
    fingerprinted. Each layer merges into an fp32 buffer of its own, reused by every sync (`merge_into`);
    the parts of a fused stack (`stacks`: the model's packed_modules_mapping, e.g. qkv_proj -> q, k, v)
    into row blocks of one buffer, in stacking order, so that the engine loads the stack as one view
    instead of concatenating it. Base weights, buffers and the merge live on `device`: an engine on a GPU
    merges there, not in host fp32 buffers (about 3x the model's bytes of host memory per engine)."""

    def __init__(self, model_path: str, dtype: torch.dtype, stacks: dict[str, list[str]] | None = None,
                 device: torch.device | str = "cpu"):
        import glob

        import torch
        from safetensors.torch import load_file

        files = sorted(glob.glob(os.path.join(model_path, "*.safetensors")))
        if not files:
            raise FileNotFoundError(f"{model_path}: no *.safetensors files to hold the base weights of")
        self.dtype, self.device = dtype, torch.device(device)
        self.base = {k: v.to(self.device, dtype) for f in files for k, v in load_file(f).items()}
        with open(os.path.join(model_path, "config.json")) as f:
            tied = json.load(f).get("tie_word_embeddings", False)
        if tied and "lm_head.weight" not in self.base and "model.embed_tokens.weight" in self.base:
            self.base["lm_head.weight"] = self.base["model.embed_tokens.weight"]  # a tied head is not stored
        self._last: dict[str, tuple[Any, Any]] = {}  # layer weight name -> the (A, B) merged into it last
        self._buffers: dict[str, Any] = {}  # layer weight name -> its fp32 merge, overwritten by the next one
        self._stacks = stacks or {}
        self._torch = torch

    def merged_layers(self, adapter: AdapterPayload, changed_only: bool) -> dict[str, Tensor]:
        """{layer weight name: merged weight} for `adapter` (learners.state.weights.adapter_payload): the
        layers whose A or B changed since the last call, or all."""
        config = adapter.config
        if config.get("fan_in_fan_out") or config.get("use_dora"):
            raise ValueError("adapter-delta sync merges plain LoRA linears only (no fan_in_fan_out, no DoRA)")
        scale = lora_scaling(config)
        pairs: dict[str, dict[str, Any]] = {}
        for name, tensor in adapter.tensors.items():
            module, kind = module_of(name)
            pairs.setdefault(f"{module}.weight", {})[kind] = tensor
        out = {}
        for weight, ab in pairs.items():
            a, b = ab["A"], ab["B"]
            last = self._last.get(weight)
            if (
                changed_only
                and last is not None
                and self._torch.equal(last[0], a)
                and self._torch.equal(last[1], b)
            ):
                continue
            if weight not in self._buffers:
                self._allocate(weight)
            b, a = b.to(self.device), a.to(self.device)  # the payload arrives in host memory
            merged = merge_into(self._buffers[weight], self.base[weight].float(), b.float(), a.float(), scale)
            out[weight] = merged if self.dtype == self._torch.float32 else merged.to(self.dtype)
            self._last[weight] = (ab["A"].clone(), ab["B"].clone())  # as they arrived: compared with the next
        return out

    def _allocate(self, weight: str) -> None:
        """The fp32 merge buffer of `weight`: its own, or one for the whole stack
        it is a part of, split by rows.
        Stored column-major ([cols, Σ rows] in memory, the parts' rows still back to back along dim 0), and
        the parts' base weights with it: vLLM's CPU GEMM packs W.t() ([cols, rows]), and oneDNN's reorder
        takes it ~1.4x faster from contiguous memory than from a transposed view (SmolLM2-135M's 210 linears
        0.12 -> 0.09 s, the merge into them as fast, bit for bit the same values)."""
        group = stack_of(weight, self._stacks)
        if not all(n in self.base and self.base[n].shape[1:] == self.base[weight].shape[1:] for n in group):
            group = [weight]
        rows = [self.base[n].shape[0] for n in group]
        whole = self._torch.empty(*self.base[weight].shape[1:], sum(rows), dtype=self._torch.float32,
                                  device=self.device).T
        self._buffers.update(zip(group, whole.split(rows), strict=True))
        for n in group:  # addmm first copies W0 into its output: the same layout makes that a plain copy
            self.base[n] = self.base[n].T.contiguous().T

    def full(self, names: list[str], merged: Mapping[str, Tensor]) -> dict[str, Tensor]:
        """Every weight in `names`: the merged layers, and the base for the rest."""
        missing = [n for n in names if n not in merged and n not in self.base]
        if missing:
            raise KeyError(f"base weights have no {missing[:3]}")
        return {n: merged[n] if n in merged else self.base[n] for n in names}
