"""The vLLM adapter: the one package that imports vllm, and only from `engine`
(lazily, when an engine starts).

`engine` (VLLMEngine, the adapter), `stepper` (token-by-token stepping for streamed turns), `repack` (in-place
weight loads that rebuild only the changed CPU GEMM handles), `readback` (what the engine serves, checked
against what was sent), `worker` (the worker extension receiving NCCL broadcasts), `support` (environment,
memory and adapter helpers that need no vllm import)."""
