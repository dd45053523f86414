"""Rollout throughput, side by side: our VLLMEngine vs the bare vllm.LLM it wraps vs the HF stand-in.

    .venv/bin/python -m benchmarks.rollout [--model builtin:tiny] [--prompts 16] [--n 8] [--tokens 64] [--reps 3]

Same workload for all three: `prompts` chat requests × `n` samples, at most `tokens` new tokens each (all
stop at eos; the counts are of tokens actually generated), temperature 1, logprobs of the sampled tokens.
Prints the median generated tokens/s per engine and the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time

from jobs.models import resolve_model
from rollout.engine import Sampling
from rollout.hf_engine import HFEngine
from rollout.vllm_engine import VLLMEngine


def _requests(prompts: int, n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": f"What is {i} + {i + 3}? Answer briefly."}]
            for i in range(prompts) for _ in range(n)]


def _ours(engine: VLLMEngine, requests: list, sampling: Sampling) -> int:
    return sum(len(c.response_ids) for c in engine.generate(requests, sampling))


def _bare(engine: VLLMEngine, requests: list, sampling: Sampling) -> int:
    from vllm import SamplingParams  # the bare engine's own API, to measure what our wrapper adds

    prompts = [{"prompt_token_ids": engine.encode(m)} for m in requests]
    params = SamplingParams(temperature=sampling.temperature, max_tokens=sampling.max_new_tokens,
                            seed=sampling.seed, logprobs=0, stop_token_ids=engine.eos_ids)
    outs = engine.llm.generate(prompts, params, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outs)


def _hf(engine: HFEngine, requests: list, sampling: Sampling) -> int:
    return sum(len(c.response_ids) for c in engine.generate(requests, sampling))


def _median_rate(fn, engine, requests: list, sampling: Sampling, reps: int) -> float:
    fn(engine, requests[:2], sampling)  # warm-up
    rates = []
    for r in range(reps):
        t0 = time.perf_counter()
        tokens = fn(engine, requests, Sampling(sampling.temperature, 1.0, sampling.max_new_tokens, seed=r))
        rates.append(tokens / (time.perf_counter() - t0))
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--kv-cache-gb", type=float, default=1.0)
    args = parser.parse_args()
    path = resolve_model(args.model)
    requests, sampling = _requests(args.prompts, args.n), Sampling(1.0, 1.0, args.tokens)
    vllm_engine = VLLMEngine(path, kv_cache_gb=args.kv_cache_gb)
    rates = {"VLLMEngine": _median_rate(_ours, vllm_engine, requests, sampling, args.reps),
             "vllm.LLM": _median_rate(_bare, vllm_engine, requests, sampling, args.reps)}
    del vllm_engine
    rates["HFEngine"] = _median_rate(_hf, HFEngine(path), requests, sampling, args.reps)
    print(f"{args.model}: {args.prompts} prompts x {args.n} samples x {args.tokens} tokens, "
          f"median of {args.reps}")
    for name, rate in rates.items():
        print(f"  {name:<11} {rate:10.0f} tokens/s   x{rate / rates['vllm.LLM']:.2f} of vllm.LLM   "
              f"x{rate / rates['HFEngine']:.2f} of HFEngine")


if __name__ == "__main__":
    main()
