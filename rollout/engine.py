"""The inference-engine interface every backend implements (shaped after vLLM), and its request types."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

from marl.seeds import derive_seed
from marl.types import Completion, Message


@dataclass(frozen=True)
class Sampling:
    """Per-call sampling. temperature 0 means greedy; logprobs are of the temperature-scaled distribution."""

    temperature: float = 0.7
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0

    def derive(self, *parts: int | str) -> Sampling:
        """This sampling with a seed derived from its own for `parts` (a role's k-th batch, an engine chunk)."""
        return dataclasses.replace(self, seed=derive_seed(self.seed, *parts))

    def request_seed(self, index: int) -> int:
        """The seed of request `index` of one call (engines that seed each request, as vLLM does)."""
        return derive_seed(self.seed, "request", index)


class InferenceEngine(Protocol):
    """One inference replica holding one policy's weights."""

    def generate(self, requests: list[list[Message]], sampling: Sampling) -> list[Completion]:
        """One completion per chat request, in order."""
        ...

    def load_weights(self, weights: dict[str, Any], version: int) -> dict[str, float]:
        """Serve `weights` (HF parameter names) from now on; returns {"version", "bytes", "fingerprint"}, the
        fingerprint (cluster.fingerprint) taken from the weights the engine now serves, under the same names."""
        ...

    def weight_version(self) -> int: ...
