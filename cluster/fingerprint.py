"""A cheap, exact fingerprint of a set of named tensors, to check that a weight sync arrived.

The sender fingerprints the payload it sends; every receiver fingerprints the weights it serves after
loading, under the same names. The value depends only on the sampled element values (not on device,
layout or summation order), so equal weights give bit-identical fingerprints wherever they live.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

SAMPLES_PER_TENSOR = 32
_STRIDE = 2_654_435_761  # Knuth's multiplicative hash constant: spreads the samples over the tensor


def sample_indices(name: str, numel: int, k: int = SAMPLES_PER_TENSOR) -> list[int]:
    """k deterministic flat positions in a tensor of `numel` elements, chosen from its name."""
    salt = zlib.crc32(name.encode())
    return [(salt + j * _STRIDE) % numel for j in range(min(k, numel))]


def fingerprint_terms(name: str, tensor: Any, k: int = SAMPLES_PER_TENSOR) -> list[float]:
    """One tensor's share of the fingerprint: k sampled elements, each times a weight that depends on the
    name and the position (so swapped tensors or permuted samples change the sum)."""
    flat = torch.as_tensor(tensor).reshape(-1)
    if flat.numel() == 0:
        return []
    idx = sample_indices(name, flat.numel(), k)
    return sampled_terms(name, flat[torch.tensor(idx, device=flat.device)])


def sampled_terms(name: str, values: torch.Tensor) -> list[float]:
    """The terms of tensor `name` from its elements at `sample_indices(name, numel)`, in that
    order ([k]): what a receiver that reads back only those elements (a fused or packed layer,
    element by element) reports."""
    salt = zlib.crc32(name.encode())
    return [v * (1.0 + ((salt + j) % 101) / 101.0) for j, v in enumerate(values.double().cpu().tolist())]


def fingerprint(weights: Mapping[str, Any], k: int = SAMPLES_PER_TENSOR) -> float:
    """Exactly rounded float64 sum of every tensor's terms. Tensors (any device, any float dtype) or numpy
    arrays; O(k) work per tensor. fsum is order-independent, so parts may be computed in other processes."""
    return math.fsum(x for name in weights for x in fingerprint_terms(name, weights[name], k))


class Running:
    """`fingerprint` of a stream of named tensors, taken as they pass (a bucketed sync never holds them all):
    the same terms, summed exactly at the end, so `value()` equals `fingerprint` of the whole set."""

    def __init__(self, k: int = SAMPLES_PER_TENSOR):
        self.k = k
        self.terms: list[float] = []

    def add(self, name: str, tensor: Any) -> None:
        self.terms.extend(fingerprint_terms(name, tensor, self.k))

    def through(self, pairs: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
        for name, tensor in pairs:
            self.add(name, tensor)
            yield name, tensor

    def value(self) -> float:
        return math.fsum(self.terms)
