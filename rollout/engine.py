"""The engine contract: `EngineMember`, what every backend's engine implements (shaped after vLLM) and what an
EngineGroup and the weight sync call on it, the request types, and the engines' registry (`rollout.backend`):
each engine class declares what it can serve (`EngineCapabilities`), which the config checks read instead of
the backend's name. Built-in classes are imported on first use (marl/registry.py); another joins as a module
declaring its class as `ENGINE`, named by its path in `rollout.backend`, or with `ENGINES.register(name, cls)`
in one process."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from marl.registry import Registry
from marl.seeds import derive_seed
from marl.types import Completion, Message

if TYPE_CHECKING:  # the contract needs no torch to import
    from torch import Tensor

    from cluster.buckets import Meta
    from cluster.payloads import AdapterPayload, LoraDelta
    from cluster.transport import Report

@dataclass(frozen=True, kw_only=True)
class EngineCapabilities:
    """What an engine class can serve, declared on it (`capabilities`) and read by the config checks
    (jobs/config/loading.py, precision.py) and the engine group instead of comparing backend names."""

    gpus: bool  # generates on GPUs (rollout.engine_num_gpus > 0); False: on CPU, whatever the actors ask for
    weight_channel: bool = False  # receives weights over NCCL from the learner (sync.transport=nccl)
    multi_lora: bool = True  # serves several policies' LoRA adapters on one base (rollout.lora_serving=multi)
    # Takes rollout's memory settings (KV cache, GPU memory share, context length, LoRA slots, the weight
    # channel and sync path: rollout.engine_group._engine_kwargs) as constructor arguments.
    memory_settings: bool = False


@dataclass(frozen=True)
class Sampling:
    """Per-call sampling. temperature 0 means greedy; logprobs are of the temperature-scaled distribution."""

    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0
    # (role, cap) pairs overriding max_new_tokens for those roles' turns (rollout.role_max_new_tokens).
    role_caps: tuple[tuple[str, int], ...] = ()
    # The output guard the call's turns are sampled under: its grammar's EBNF text (marl.guard_grammar), "" =
    # none; and the (role, grammar) pairs that set it per role (marl.guards).
    guard: str = ""
    role_guards: tuple[tuple[str, str], ...] = ()

    def for_role(self, role: str) -> Sampling:
        """This sampling with `role`'s own response cap and guard, if it has them."""
        cap = dict(self.role_caps).get(role, self.max_new_tokens)
        return dataclasses.replace(self, max_new_tokens=cap, guard=dict(self.role_guards).get(role, ""))

    def derive(self, *parts: int | str) -> Sampling:
        """This sampling with a seed derived from its own for `parts` (a role's k-th batch, an engine chunk,
        one streamed turn: episode, agent and the agent's turn)."""
        return dataclasses.replace(self, seed=derive_seed(self.seed, *parts))

    def request_seed(self, index: int) -> int:
        """The seed of request `index` of one call (engines that seed each request, as vLLM does)."""
        return derive_seed(self.seed, "request", index)


class EngineMember(Protocol):
    """One inference replica holding one policy's weights (or a base model and LoRA adapters): an EngineGroup
    member. Its group names these methods as `EngineMember.<method>`, so a misspelt one fails the type check.
    Load methods return {"version", "bytes", "fingerprint"}, the fingerprint (cluster.fingerprint) taken from
    what the engine now serves, under the names it was sent."""

    capabilities: ClassVar[EngineCapabilities]

    @staticmethod
    def actor_env(slot: int, threads: int) -> dict[str, str]:
        """Environment variables of the Ray actor hosting engine `slot` (`threads` CPU threads), set before it
        imports anything: settings a library reads at import (vLLM's)."""
        ...

    def encode(self, messages: list[Message]) -> list[int]:
        """The prompt token ids of one chat request (the chat template rendered, generation prompt added)."""
        ...

    def generate(self, requests: list[list[Message]], sampling: Sampling,
                 adapter: str | None = None) -> list[Completion]:
        """One completion per chat request, in order; `adapter`: through that policy's LoRA adapter."""
        ...

    async def generate_async(self, requests: list[list[Message]], sampling: Sampling,
                             adapter: str | None = None) -> list[Completion]:
        """`generate`, awaited: many calls may be in flight on one engine (continuous batching), served on the
        engine's serving loop (rollout.serving) while it answers `progress`."""
        ...

    async def progress(self) -> int:
        """Tokens generated so far, all calls together: an EngineGroup declares the engine hung when this
        stays flat for rollout.stall_timeout_s while it holds calls."""
        ...

    def load_weights(self, weights: Mapping[str, Tensor], version: int) -> dict[str, float]:
        """Serve `weights` (HF parameter names) from now on."""
        ...

    def load_lora_delta(self, delta: LoraDelta, version: int) -> Report:
        """Merged serving with adapter-only syncs: merge the delta's adapter (rollout.lora) into the base
        weights and serve the result; reports {"version", "bytes", "sketch": {name: served sketch
        (cluster.sketch)} for every weight `delta.names` lists (packed into one buffer, cluster.packing),
        "sketch_rtol": the serving dtype's tolerance}."""
        ...

    def load_adapter(self, payload: AdapterPayload, version: int) -> dict[str, float]:
        """Multi-LoRA serving: serve the adapter payload (rollout.lora) as its policy's adapter."""
        ...

    def nccl_join(self, host: str, port: int, rank: int, world_size: int, timeout_s: float, backend: str,
                  bucket_bytes: int, /) -> None:
        """Join the learner's weight channel (cluster.weight_transfer) as `rank`, on the c10d `backend` the
        driver chose for every end; a second join aborts the channel it replaces."""
        ...

    def nccl_receive(self, version: int, layout: list[Meta], /) -> dict[str, float]:
        """Receive one broadcast over the channel (`layout`: what it holds, in order) and serve it."""
        ...

    def ipc_start(self) -> None:
        """A colocated sync over CUDA IPC begins (cluster.weight_transfer.broadcast_ipc)."""
        ...

    def ipc_load(self, info: dict[str, Any], /) -> None:
        """Load one bucket of the learner's IPC buffer on this engine's GPU."""
        ...

    def ipc_finish(self, version: int, /) -> dict[str, float]:
        """After the last bucket: serve them as `version`; reports as nccl_receive does."""
        ...

    def weight_version(self) -> int:
        """The version of the weights served (the last one loaded; 0 = the model folder's)."""
        ...

    def sleep(self, level: int = 1) -> dict[str, float]:
        """Release the engine's memory for the learner on its GPU (rollout.layout=colocated; levels and tags:
        rollout/sleep.py); {"freed_bytes", "sleeps"}. No call may be in flight until `wake_up`."""
        ...

    def wake_up(self, tags: tuple[str, ...] = ("weights", "kv_cache")) -> dict[str, float]:
        """Take back what `tags` name ("weights" before a sync loads into them, then "kv_cache");
        {"restored_bytes", "wakes"}."""
        ...


def served_by(adapter: str | None, loaded: Mapping[str, object], own: str) -> str:
    """The policy whose weights served a request, as its Completion reports it: `adapter` when that adapter is
    loaded; BASE_MODEL when it was asked for but is not (vLLM serves such a request from the base model,
    without an error, and so does the hf engine); else the engine's own policy `own` (merged serving)."""
    if adapter is None:
        return own
    return adapter if adapter in loaded else BASE_MODEL


# What a Completion's policy_id says when a request asked for an adapter the engine did not hold.
BASE_MODEL = "<base model>"


# Open: `rollout.backend` also takes a module path, whose module declares its class as ENGINE.
ENGINES: Registry[type[EngineMember]] = Registry("rollout.backend", {
    "hf": "rollout.hf_engine:HFEngine",
    "vllm": "rollout.vllm.engine:VLLMEngine",
}, declares="ENGINE")


def engine_capabilities(backend: str) -> EngineCapabilities:
    """What the engine registered as `backend` can serve (its class imported now, vllm itself not)."""
    return ENGINES[backend].capabilities
