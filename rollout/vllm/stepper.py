"""The vLLM engine's Stepper (rollout.serving): continuous batching through the engine's own request queue.

vLLM's asynchronous engine (`AsyncLLM`) always runs its engine core in a separate process ("Running EngineCore
in asyncio without multiprocessing is not currently supported", vllm 0.32 core_client), which on CPU costs
18-35 s and ~1.5 GB more per engine than the in-process core (notes/vllm_cpu.md). The in-process `LLMEngine`
that `LLM` wraps does the same continuous batching through `add_request` and `step`: requests join the running
batch at the next step and leave it when they finish. The serving loop's thread drives those steps; no vllm
import here (the adapter, rollout.vllm.engine, builds the sampling parameters and the completions).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from marl.types import Completion
from rollout.engine import Sampling
from rollout.serving import Job

# (sampling, the request's seed) -> vLLM SamplingParams reporting each step's new tokens only (DELTA)
MakeParams = Callable[[Sampling, int], Any]
# (prompt ids, response ids, their logprobs, the job's adapter) -> the Completion
MakeCompletion = Callable[[list[int], list[int], list[float], str | None], Completion]
# adapter -> the LoRARequest it is served through (None: the base model / merged weights)
LoraOf = Callable[[str | None], Any]


@dataclass
class _Running:
    """One job's requests as they progress: per request its tokens and their logprobs so far."""

    job: Job
    tokens: list[list[int]]
    logprobs: list[list[float]]
    left: int
    done: set[int] = field(default_factory=set)


class VLLMStepper:
    """Adds each admitted request to `llm_engine` (vllm.v1.engine.llm_engine.LLMEngine) and steps it; `lock`:
    the process's vLLM lock (in-process engines of one process take turns)."""

    def __init__(self, llm_engine: Any, lock: threading.Lock, make_params: MakeParams,
                 make_completion: MakeCompletion, lora_of: LoraOf):
        self.engine, self.lock = llm_engine, lock
        self.make_params, self.make_completion, self.lora_of = make_params, make_completion, lora_of
        self._ids = itertools.count()
        self._requests: dict[str, tuple[_Running, int]] = {}  # request id -> (its job, its index there)

    def admit(self, jobs: list[Job]) -> None:
        with self.lock:
            for job in jobs:
                n = len(job.prompts)
                running = _Running(job, [[] for _ in range(n)], [[] for _ in range(n)], n)
                lora = self.lora_of(job.adapter)
                for i, prompt in enumerate(job.prompts):
                    rid = str(next(self._ids))
                    self._requests[rid] = (running, i)
                    self.engine.add_request(rid, {"prompt_token_ids": prompt},
                                            self.make_params(job.sampling, job.sampling.request_seed(i)),
                                            lora_request=lora)

    def step(self, count: Callable[[int], None]) -> None:
        # vLLM's CPU attention plans by this thread's OpenMP count: settle it from
        # torch's first (see generate).
        torch.get_num_threads()
        with self.lock:
            outputs = self.engine.step()
        for out in outputs:
            running, i = self._requests[out.request_id]
            delta = out.outputs[0]
            new = list(delta.token_ids)
            running.tokens[i] += new
            # logprobs=0: each step's dict holds just the sampled token's entry.
            running.logprobs[i] += [
                step[t].logprob for t, step in zip(new, delta.logprobs or [], strict=True)
            ]
            count(len(new))
            if out.finished:
                del self._requests[out.request_id]
                running.left -= 1
                if running.left == 0:
                    self._finish(running)

    def _finish(self, running: _Running) -> None:
        job = running.job
        outs = [self.make_completion(p, t, lp, job.adapter)
                for p, t, lp in zip(job.prompts, running.tokens, running.logprobs, strict=True)]
        job.future.set_result(outs)

    def busy(self) -> bool:
        return bool(self._requests)

    def fail(self, error: BaseException) -> None:
        ids = list(self._requests)
        for running, _ in self._requests.values():
            if not running.job.future.done():
                running.job.future.set_exception(error)
        self._requests = {}
        if ids:
            with self.lock:
                self.engine.abort_request(ids)
