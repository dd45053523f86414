"""The transformers-generate stand-in engine: same interface (rollout.engine.EngineMember) as the vLLM adapter, for
CPU tests and laptops."""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Mapping

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from cluster.fingerprint import fingerprint
from marl.types import Completion, Message
from rollout.engine import Sampling
from rollout.lora import BaseWeights, adapter_bytes, write_adapter

hf_logging.disable_progress_bar()  # one bar per weight load floods the driver log through Ray
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFEngine:
    """Batched left-padded `generate` with per-token logprobs of the sampled tokens."""

    def __init__(self, model_path: str, dtype: str = "float32", torch_threads: int = 0,
                 policy_id: str = "", chat_template_kwargs: dict | None = None):
        if torch_threads:
            torch.set_num_threads(torch_threads)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.tokenizer.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=_DTYPES[dtype]).eval()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.eos_ids = _eos_ids(self.model, self.tokenizer)
        self.policy_id = policy_id
        self.chat_kwargs = dict(chat_template_kwargs or {})
        self.version = 0
        self.model_path = model_path
        self._base: BaseWeights | None = None  # adapter-delta sync: the base weights, read on first use
        self.adapter_versions: dict[str, int] = {}  # multi-LoRA serving: adapter (policy id) -> version

    def encode(self, messages: list[Message]) -> list[int]:
        out = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False, **self.chat_kwargs
        )
        return list(out["input_ids"] if isinstance(out, dict) else out)

    @torch.no_grad()
    def generate(self, requests: list[list[Message]], sampling: Sampling,
                 adapter: str | None = None) -> list[Completion]:
        """`adapter`: serve through that policy's LoRA adapter (the base model until one was loaded)."""
        with self._adapter_scope(adapter):
            return self._generate(requests, sampling, adapter)

    def _generate(self, requests: list[list[Message]], sampling: Sampling, adapter: str | None) -> list[Completion]:
        prompts = [self.encode(m) for m in requests]
        ids, mask = _left_pad(prompts, self.pad_id)
        greedy = sampling.temperature == 0
        torch.manual_seed(sampling.seed)
        out = self.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=sampling.max_new_tokens,
            do_sample=not greedy, temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p, top_k=None, pad_token_id=self.pad_id,
            eos_token_id=self.eos_ids, return_dict_in_generate=True, output_logits=True,
        )
        new = out.sequences[:, ids.shape[1]:]
        logits = torch.stack(out.logits, dim=1).float()  # [B, new, V], raw (before temperature)
        if not greedy:
            logits = logits / sampling.temperature
        lps = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        return [self._completion(p, row, lp, adapter) for p, row, lp in zip(prompts, new, lps, strict=True)]

    def _completion(self, prompt: list[int], row: torch.Tensor, lp: torch.Tensor, adapter: str | None) -> Completion:
        tokens = row.tolist()
        end = next((i + 1 for i, t in enumerate(tokens) if t in self.eos_ids), None)
        n = end if end is not None else len(tokens)
        return Completion(
            text=self.tokenizer.decode(tokens[:n], skip_special_tokens=True),
            prompt_ids=prompt, response_ids=tokens[:n], logprobs=lp[:n].tolist(),
            finish_reason="stop" if end is not None else "length",
            version=self.adapter_versions.get(adapter, 0) if adapter else self.version,
            policy_id=adapter or self.policy_id,
        )

    def _adapter_scope(self, adapter: str | None) -> contextlib.AbstractContextManager:
        if not self.adapter_versions:
            return contextlib.nullcontext()
        if adapter in self.adapter_versions:
            self.model.set_adapter(adapter)
            return contextlib.nullcontext()
        return self.model.disable_adapter()  # a policy without an adapter yet, or the base model

    def load_adapter(self, payload: dict, version: int) -> dict[str, float]:
        """Serve `payload` (rollout.lora) as its policy's adapter from now on; the base stays untouched."""
        from peft import PeftModel, get_peft_model_state_dict, set_peft_model_state_dict

        name = payload["policy_id"]
        if name in self.adapter_versions:
            set_peft_model_state_dict(self.model, payload["tensors"], adapter_name=name)
        else:
            with tempfile.TemporaryDirectory() as folder:
                write_adapter(folder, payload)
                if isinstance(self.model, PeftModel):
                    self.model.load_adapter(folder, adapter_name=name)
                else:
                    self.model = PeftModel.from_pretrained(self.model, folder, adapter_name=name).eval()
        self.adapter_versions[name] = version
        self.version = version
        served = get_peft_model_state_dict(self.model, adapter_name=name)
        return {"version": version, "bytes": adapter_bytes(payload),
                "fingerprint": fingerprint({k: served[k] for k in payload["tensors"]})}

    def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> dict[str, float]:
        own = self.model.state_dict()
        unknown = [k for k in weights if k not in own]
        if unknown:
            raise KeyError(f"engine for policy {self.policy_id!r}: unknown weight names {unknown[:3]}")
        with torch.no_grad():
            for name, tensor in weights.items():
                own[name].copy_(tensor)
        self.version = version
        return {"version": version, "bytes": sum(t.numel() * t.element_size() for t in weights.values()),
                # Read back from the model itself, so a load that did not land is caught by the sender.
                "fingerprint": fingerprint({name: own[name] for name in weights})}

    def load_lora_delta(self, payload: dict, version: int) -> dict[str, float]:
        """Merged serving with adapter-only syncs: merge `payload`'s LoRA adapter into the base weights (held
        once) and load the layers whose adapter changed. Reports the fingerprint of every weight the learner
        named, read back from the model."""
        if self._base is None:
            self._base = BaseWeights(self.model_path, self.model.dtype)
        own = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in self._base.merged_layers(payload, changed_only=True).items():
                own[name].copy_(tensor)
        self.version = version
        return {"version": version, "bytes": adapter_bytes(payload),
                "fingerprint": fingerprint({name: own[name] for name in payload["names"]})}

    def nccl_join(self, host: str, port: int, rank: int, world_size: int, timeout_s: float) -> None:
        raise NotImplementedError("the hf engine receives weights through the object store; "
                                  "sync.transport=nccl needs rollout.backend=vllm")

    def nccl_receive(self, version: int, bucket_bytes: int) -> dict[str, float]:
        raise NotImplementedError("the hf engine receives weights through the object store; "
                                  "sync.transport=nccl needs rollout.backend=vllm")

    def weight_version(self) -> int:
        return self.version


def _eos_ids(model, tokenizer) -> list[int]:
    eos = model.generation_config.eos_token_id
    ids = eos if isinstance(eos, list) else [eos] if eos is not None else []
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def _left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s):] = 1
    return ids, mask
