"""Named tensors packed into one contiguous byte buffer, for moving weights between processes.

A dict of tensors crosses Ray as one pickled object per tensor, copied on both sides. A `PackedTensors`
holds every tensor in one numpy byte array, which Ray's object store keeps out of band: the sender copies
each tensor in once, and a receiver on the same node reads it zero-copy from shared memory, its tensors
being views of the stored bytes. It is a read-only Mapping of name → tensor, so whatever takes a dict of
weights (loaders, fingerprints) takes it as it is.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

_ALIGN = 64  # bytes: every tensor starts on a cache line (and any dtype's alignment)


def tensor_bytes(tensors: Mapping[str, Tensor]) -> int:
    """The bytes `tensors`' elements take (what a weight payload moves; no alignment padding)."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # torch dtype name, e.g. "float32", "bfloat16"
    shape: tuple[int, ...]
    offset: int  # bytes into the buffer


@dataclass(frozen=True)
class PackedTensors(Mapping[str, Tensor]):
    buffer: np.ndarray  # uint8 [nbytes], possibly read-only (a view of the object store)
    specs: tuple[TensorSpec, ...]

    def __getitem__(self, name: str) -> Tensor:
        spec = self._index()[name]
        count = int(np.prod(spec.shape, dtype=np.int64))
        if count == 0:
            return torch.empty(spec.shape, dtype=getattr(torch, spec.dtype))
        with warnings.catch_warnings():  # a view of read-only shared memory: loaders only read it
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.frombuffer(self.buffer, dtype=getattr(torch, spec.dtype), count=count, offset=spec.offset)
        return flat.view(spec.shape)

    def __iter__(self) -> Iterator[str]:
        return (s.name for s in self.specs)

    def __len__(self) -> int:
        return len(self.specs)

    def _index(self) -> dict[str, TensorSpec]:
        index = self.__dict__.get("_by_name")
        if index is None:
            index = {s.name: s for s in self.specs}
            object.__setattr__(self, "_by_name", index)
        return index

    def stacked(self, names: Sequence[str]) -> Tensor | None:
        """The named tensors stacked along dim 0 ([Σ rows, *trailing]) as one view of the buffer, no copy, when they
        lie back to back in this order with one dtype and one trailing shape (as `pack` lays out tensors whose
        sizes are multiples of its alignment); None otherwise (the caller concatenates)."""
        specs = [self._index()[n] for n in names]
        first, end = specs[0], specs[0].offset
        itemsize = torch.empty((), dtype=getattr(torch, first.dtype)).element_size()
        for spec in specs:
            if (spec.offset != end or spec.dtype != first.dtype or len(spec.shape) < 1
                    or spec.shape[1:] != first.shape[1:]):
                return None
            end += int(np.prod(spec.shape, dtype=np.int64)) * itemsize
        if end == first.offset:
            return None
        with warnings.catch_warnings():  # a view of read-only shared memory: loaders only read it
            warnings.simplefilter("ignore", UserWarning)
            flat = torch.frombuffer(self.buffer, dtype=getattr(torch, first.dtype),
                                    count=(end - first.offset) // itemsize, offset=first.offset)
        return flat.view(sum(s.shape[0] for s in specs), *first.shape[1:])

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self)


def pack(tensors: Mapping[str, Tensor]) -> PackedTensors:
    """Copy `tensors` (any device, any dtype) into one host buffer: one copy per tensor, nothing else."""
    specs, offset = [], 0
    for name, t in tensors.items():
        specs.append(TensorSpec(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset))
        offset += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
    buffer = np.empty(offset, dtype=np.uint8)
    for spec, t in zip(specs, tensors.values(), strict=True):
        if t.numel():
            dst = torch.frombuffer(buffer, dtype=t.dtype, count=t.numel(), offset=spec.offset)
            dst.copy_(t.detach().reshape(-1))
    return PackedTensors(buffer, tuple(specs))
