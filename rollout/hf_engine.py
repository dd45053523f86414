"""The transformers-generate stand-in engine: same interface (rollout.engine.EngineMember) as the vLLM
adapter, for CPU tests and laptops.

Calls are served on the engine's serving loop (rollout.serving). A call of several requests (a
lockstep chunk) is one batched `generate`; single-request calls queued together (streaming) are merged
into one batch. A guarded call (Sampling.guard) samples under its grammar: a logits processor holds each row
to the tokens xgrammar's matcher allows (marl.guard_grammar, the masks vLLM's structured outputs apply), and
the reported logprobs are of that masked distribution. Every row samples from its own generator seeded
`sampling.request_seed(i)`, as vLLM
seeds each request, so a request's draws do not depend on what it was batched with, nor on another
engine's thread reseeding torch's global one.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LogitsProcessor, LogitsProcessorList
from transformers.utils import logging as hf_logging

from cluster.fingerprint import fingerprint
from cluster.packing import pack, tensor_bytes
from cluster.payloads import AdapterPayload, LoraDelta
from cluster.sketch import SKETCH_RTOL, sketch
from cluster.transport import Report
from marl.dtypes import DTYPES
from marl.guard_grammar import TokenMasks, merged_eos, unpack
from marl.types import Completion
from rollout.engine import EngineCapabilities, Sampling, served_by
from rollout.lora import BaseWeights, write_adapter
from rollout.serving import ChatServing, Job, ServingLoop, between_calls
from rollout.sleep import WAKE_TAGS, WeightStash

hf_logging.disable_progress_bar()  # one bar per weight load floods the driver log through Ray


class HFEngine(ChatServing):
    """Batched left-padded `generate` with per-token logprobs of the sampled tokens."""

    # CPU only; weights arrive through the object store.
    capabilities: ClassVar[EngineCapabilities] = EngineCapabilities(gpus=False)

    @staticmethod
    def actor_env(slot: int, threads: int) -> dict[str, str]:
        return {}  # torch's threads are set in the constructor (torch_threads)

    def __init__(self, model_path: str, dtype: str = "float32", torch_threads: int = 0,
                 policy_id: str = "", chat_template_kwargs: dict | None = None):
        if torch_threads:
            torch.set_num_threads(torch_threads)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.tokenizer.padding_side = "left"
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=DTYPES[dtype]).eval()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.eos_ids = merged_eos(self.model.generation_config.eos_token_id, self.tokenizer.eos_token_id)
        self.policy_id = policy_id
        self.chat_kwargs = dict(chat_template_kwargs or {})
        self.version = 0
        self.model_path = model_path
        self._base: BaseWeights | None = None  # adapter-delta sync: the base weights, read on first use
        self.adapter_versions: dict[str, int] = {}  # multi-LoRA serving: adapter (policy id) -> version
        self._queue: list[Job] = []  # admitted calls, served first come first served
        self.sleep_mode = WeightStash(self.model)  # rollout.layout=colocated: weights freed during the update
        self._masks: TokenMasks | None = None  # guarded calls: the guards' grammars for this tokenizer
        self.loop = ServingLoop(self, f"hf:{policy_id}")

    # The serving loop's Stepper (rollout.serving), on the loop's thread.
    def admit(self, jobs: list[Job]) -> None:
        self._queue.extend(jobs)

    def busy(self) -> bool:
        return bool(self._queue)

    def fail(self, error: BaseException) -> None:
        for job in self._queue:
            if not job.future.done():
                job.future.set_exception(error)
        self._queue = []

    @torch.no_grad()
    def step(self, count: Callable[[int], None]) -> None:
        """Serve the first queued call, batched with the single-request calls queued behind it that share its
        adapter and sampling settings (a call of several requests is always its own batch)."""
        self.sleep_mode.check_awake("generate")
        batch = _next_batch(self._queue)
        self._queue = [job for job in self._queue if job not in batch]  # identity: Job compares by identity
        prompts = [p for job in batch for p in job.prompts]
        seeds = [job.sampling.request_seed(i) for job in batch for i in range(len(job.prompts))]
        first = batch[0]
        with self._adapter_scope(first.adapter):
            outs = self._generate(prompts, seeds, first.sampling, first.adapter, count)
        for job in batch:
            job.future.set_result(outs[:len(job.prompts)])
            outs = outs[len(job.prompts):]

    def _generate(self, prompts: list[list[int]], seeds: list[int], sampling: Sampling, adapter: str | None,
                  count: Callable[[int], None]) -> list[Completion]:
        ids, mask = _left_pad(prompts, self.pad_id)
        guard = _GuardProcessor(self.token_masks(), sampling.guard, len(prompts)) if sampling.guard else None
        processors = [*([guard] if guard else []), _RowSampler(sampling, seeds, count)]
        # Greedy decoding over what _RowSampler leaves: its own draw (sampling) or the argmax (temperature 0).
        out = self.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=sampling.max_new_tokens, do_sample=False,
            temperature=None, top_p=None, top_k=None, pad_token_id=self.pad_id, eos_token_id=self.eos_ids,
            logits_processor=LogitsProcessorList(processors),
            return_dict_in_generate=True, output_logits=True,
        )
        new = out.sequences[:, ids.shape[1]:]
        logits = torch.stack(out.logits, dim=1).float()  # [B, new, V], raw (before temperature)
        if guard is not None:  # the distribution sampled from: the guard's mask at every step
            logits = logits.masked_fill(~guard.allowed(), float("-inf"))
        if sampling.temperature != 0:
            logits = logits / sampling.temperature
        lps = torch.log_softmax(logits, dim=-1).gather(-1, new.unsqueeze(-1)).squeeze(-1)
        return [self._completion(p, row, lp, adapter) for p, row, lp in zip(prompts, new, lps, strict=True)]

    def token_masks(self) -> TokenMasks:
        """The guards' grammars compiled for this engine's tokenizer (built on the first guarded call)."""
        if self._masks is None:
            self._masks = TokenMasks(self.tokenizer, self.model.config.vocab_size, self.eos_ids)
        return self._masks

    def _completion(
        self, prompt: list[int], row: torch.Tensor, lp: torch.Tensor, adapter: str | None
    ) -> Completion:
        tokens = row.tolist()
        end = next((i + 1 for i, t in enumerate(tokens) if t in self.eos_ids), None)
        n = end if end is not None else len(tokens)
        return Completion(
            text=self.tokenizer.decode(tokens[:n], skip_special_tokens=True),
            prompt_ids=prompt, response_ids=tokens[:n], logprobs=lp[:n].tolist(),
            finish_reason="stop" if end is not None else "length",
            version=self.adapter_versions.get(adapter, 0) if adapter else self.version,
            policy_id=served_by(adapter, self.adapter_versions, self.policy_id),
        )

    def _adapter_scope(self, adapter: str | None) -> contextlib.AbstractContextManager:
        if not self.adapter_versions:
            return contextlib.nullcontext()
        if adapter in self.adapter_versions:
            self.model.set_adapter(adapter)
            return contextlib.nullcontext()
        return self.model.disable_adapter()  # a policy without an adapter yet, or the base model

    @between_calls
    def load_adapter(self, payload: AdapterPayload, version: int) -> dict[str, float]:
        """Serve `payload` (rollout.lora) as its policy's adapter from now on; the base stays untouched."""
        from peft import PeftModel, get_peft_model_state_dict, set_peft_model_state_dict

        name = payload.policy_id
        if name in self.adapter_versions:
            set_peft_model_state_dict(self.model, dict(payload.tensors), adapter_name=name)
        else:
            with tempfile.TemporaryDirectory() as folder:
                write_adapter(folder, payload)
                if isinstance(self.model, PeftModel):
                    self.model.load_adapter(folder, adapter_name=name)
                else:
                    self.model = PeftModel.from_pretrained(self.model, folder, adapter_name=name).eval()
                    self.sleep_mode.module = self.model  # the adapters' parameters sleep with the base
        self.adapter_versions[name] = version
        self.version = version
        served = get_peft_model_state_dict(self.model, adapter_name=name)
        return {"version": version, "bytes": payload.nbytes,
                "fingerprint": fingerprint({k: served[k] for k in payload.tensors})}

    @between_calls
    def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> dict[str, float]:
        own = self.model.state_dict()
        unknown = [k for k in weights if k not in own]
        if unknown:
            raise KeyError(f"engine for policy {self.policy_id!r}: unknown weight names {unknown[:3]}")
        with torch.no_grad():
            for name, tensor in weights.items():
                own[name].copy_(tensor)
        self.version = version
        return {"version": version, "bytes": tensor_bytes(weights),
                # Read back from the model itself, so a load that did not land is caught by the sender.
                "fingerprint": fingerprint({name: own[name] for name in weights})}

    @between_calls
    def load_lora_delta(self, delta: LoraDelta, version: int) -> Report:
        """Merged serving with adapter-only syncs: merge the delta's LoRA adapter into the base weights (held
        once) and load the layers whose adapter changed. Reports the sketch (cluster.sketch) of every weight
        the learner named, read back from the model, for the learner's own to be compared with."""
        if self._base is None:
            self._base = BaseWeights(self.model_path, self.model.dtype)
        own = self.model.state_dict()
        with torch.no_grad():
            for name, tensor in self._base.merged_layers(delta.adapter, changed_only=True).items():
                own[name].copy_(tensor)
        self.version = version
        return {"version": version, "bytes": delta.adapter.nbytes,
                "sketch": pack({name: sketch(name, own[name]) for name in delta.names}),
                "sketch_rtol": SKETCH_RTOL[self.model.dtype]}

    def nccl_join(self, host: str, port: int, rank: int, world_size: int, timeout_s: float, backend: str,
                  bucket_bytes: int) -> None:
        raise NotImplementedError(_NO_CHANNEL)

    def nccl_receive(self, version: int, layout: list[Any]) -> dict[str, float]:
        raise NotImplementedError(_NO_CHANNEL)

    def ipc_start(self) -> None:
        raise NotImplementedError(_NO_CHANNEL)

    def ipc_load(self, info: dict[str, Any]) -> None:
        raise NotImplementedError(_NO_CHANNEL)

    def ipc_finish(self, version: int) -> dict[str, float]:
        raise NotImplementedError(_NO_CHANNEL)

    def weight_version(self) -> int:
        return self.version

    @between_calls
    def sleep(self, level: int = 1) -> dict[str, float]:
        """Free every weight's memory (level 1: a host copy kept; rollout/sleep.py). No KV cache outlives a
        call here, so there is none to drop."""
        return self.sleep_mode.sleep(level)

    @between_calls
    def wake_up(self, tags: tuple[str, ...] = WAKE_TAGS) -> dict[str, float]:
        return self.sleep_mode.wake_up(tags)


class _RowSampler(LogitsProcessor):
    """Samples each row's next token from its own seeded generator (temperature, then top-p) and leaves only
    that token, so greedy decoding picks it; at temperature 0 it leaves the logits as they are. Counts every
    row's token as generated (the serving loop's progress)."""

    def __init__(self, sampling: Sampling, seeds: list[int], count: Callable[[int], None]):
        self.sampling, self.count = sampling, count
        self.generators = [torch.Generator().manual_seed(s) for s in seeds]

    def __call__(  # type: ignore[override]
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor
    ) -> torch.Tensor:
        """scores: [B, V] raw logits of the next token -> [B, V], -inf everywhere but each row's draw."""
        self.count(scores.shape[0])
        if self.sampling.temperature == 0:
            return scores
        probs = _top_p(torch.softmax(scores.float() / self.sampling.temperature, dim=-1), self.sampling.top_p)
        picks = [torch.multinomial(p, 1, generator=g) for p, g in zip(probs, self.generators, strict=True)]
        out = torch.full_like(scores, float("-inf"))
        return out.scatter_(1, torch.stack(picks), 0.0)


class _GuardProcessor(LogitsProcessor):
    """Holds each row to its guard: before every step the row's matcher takes the row's last token and fills
    the tokens it allows next; the others get -inf. Keeps every step's masks for the reported logprobs."""

    def __init__(self, masks: TokenMasks, grammar: str, rows: int):
        self.masks = masks
        self.matchers = [masks.matcher(grammar) for _ in range(rows)]
        self.steps: list[torch.Tensor] = []  # per step: [B, words] int32

    def __call__(  # type: ignore[override]
        self, input_ids: torch.LongTensor, scores: torch.FloatTensor
    ) -> torch.Tensor:
        """scores [B, V] -> [B, V], -inf where the row's guard allows no token."""
        bits = self.masks.empty(len(self.matchers))
        for i, matcher in enumerate(self.matchers):
            if self.steps and not matcher.is_terminated() and not matcher.accept_token(int(input_ids[i, -1])):
                raise RuntimeError(f"row {i}: the sampled token {int(input_ids[i, -1])} left its guard")
            self.masks.fill(matcher, bits, i)
        self.steps.append(torch.from_numpy(bits))
        allowed = torch.from_numpy(unpack(bits, scores.shape[-1]))
        return scores.masked_fill(~allowed, float("-inf"))

    def allowed(self) -> torch.Tensor:
        """Every step's allowed tokens [B, steps, V] bool."""
        vocab = self.masks.vocab_size
        return torch.stack([torch.from_numpy(unpack(b.numpy(), vocab)) for b in self.steps], dim=1)


def _top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """probs: [B, V] -> [B, V] renormalised over the smallest set of top tokens
    holding `top_p` of the mass."""
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True)
    drop = sorted_p.cumsum(-1) - sorted_p > top_p  # tokens after the mass already reached top_p
    kept = sorted_p.masked_fill(drop, 0.0)
    out = torch.zeros_like(probs).scatter_(-1, order, kept)
    return out / out.sum(-1, keepdim=True)


def _next_batch(queue: list[Job]) -> list[Job]:
    """The first queued call and, if it holds one request, the other one-request calls it can share a batch
    with (same adapter and sampling settings but the seed)."""
    first = queue[0]
    if len(first.prompts) != 1:
        return [first]
    key = _batch_key(first)
    return [job for job in queue if len(job.prompts) == 1 and _batch_key(job) == key]


def _batch_key(job: Job) -> tuple:
    s = job.sampling
    return job.adapter, s.temperature, s.top_p, s.max_new_tokens, s.guard


def _left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s):] = 1
    return ids, mask


_NO_CHANNEL = ("the hf engine receives weights through the object store; sync.transport=nccl or ipc needs "
               "rollout.backend=vllm")
