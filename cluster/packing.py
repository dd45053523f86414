"""Named tensors as byte buffers plus a manifest, the one wire format of weights between processes.

A dict of tensors crosses Ray as one pickled object per tensor (torch pickles each storage on its own), copied
and unpickled one by one on both sides. A `PackedTensors` is a manifest (name, dtype, shape, buffer, offset
per tensor) and numpy byte buffers, which Ray's object store keeps out of band: the sender's buffers are
copied into the store once, and a receiver on the same node reads them zero-copy from shared memory, its
tensors being views of the stored bytes. Two ways to build one:
- `pack`: every tensor copied into one contiguous buffer (one copy on the sender). For many small tensors (an
  adapter, sketches): one buffer to store and to map, and fused parts lying back to back read as one view;
- `share`: every tensor's own bytes as a buffer of its own, no copy (the object store's copy is then the only
  one on the sender's side). For full weights, where the pack copy would double the sender's memory traffic.
It is a read-only Mapping of name → tensor, so whatever takes a dict of weights (loaders,
fingerprints) takes it as it is.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

_ALIGN = 64  # bytes: every packed tensor starts on a cache line (and any dtype's alignment)


def tensor_bytes(tensors: Mapping[str, Tensor]) -> int:
    """The bytes `tensors`' elements take (what a weight payload moves; no alignment padding)."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # torch dtype name, e.g. "float32", "bfloat16"
    shape: tuple[int, ...]
    offset: int  # bytes into its buffer
    buffer: int = 0  # which of the payload's buffers


@dataclass(frozen=True)
class PackedTensors(Mapping[str, Tensor]):
    buffers: tuple[np.ndarray, ...]  # uint8 each, possibly read-only (views of the object store)
    specs: tuple[TensorSpec, ...]

    def __getitem__(self, name: str) -> Tensor:
        return self._tensors()[name]

    def __contains__(self, name: object) -> bool:
        return name in self._index()

    def __iter__(self) -> Iterator[str]:
        return (s.name for s in self.specs)

    def __len__(self) -> int:
        return len(self.specs)

    def __getstate__(self) -> dict[str, object]:
        return {"buffers": self.buffers, "specs": self.specs}  # not the caches: rebuilt where they are read

    def _index(self) -> dict[str, TensorSpec]:
        index = self.__dict__.get("_by_name")
        if index is None:
            index = {s.name: s for s in self.specs}
            object.__setattr__(self, "_by_name", index)
        return index

    def _tensors(self) -> dict[str, Tensor]:
        """Every tensor's view, made once: readers (a load, its check, fingerprints, a sketch comparison) look
        each tensor up several times, and a view costs a frombuffer under a warnings guard."""
        views = self.__dict__.get("_views")
        if views is None:
            views = {s.name: self._tensor(s) for s in self.specs}
            object.__setattr__(self, "_views", views)
        return views

    def _tensor(self, spec: TensorSpec) -> Tensor:
        count = int(np.prod(spec.shape, dtype=np.int64))
        if count == 0:
            return torch.empty(spec.shape, dtype=getattr(torch, spec.dtype))
        return self._view(spec.buffer, spec.dtype, spec.offset, count).view(spec.shape)

    def _view(self, buffer: int, dtype: str, offset: int, count: int) -> Tensor:
        with warnings.catch_warnings():  # a view of read-only shared memory: loaders only read it
            warnings.simplefilter("ignore", UserWarning)
            return torch.frombuffer(
                self.buffers[buffer], dtype=getattr(torch, dtype), count=count, offset=offset
            )

    def stacked(self, names: Sequence[str]) -> Tensor | None:
        """The named tensors stacked along dim 0 ([Σ rows, *trailing]) as one view of a buffer, no
        copy, when they lie back to back in this order in one buffer with one dtype and one trailing
        shape (as `pack` lays out tensors whose sizes are multiples of its alignment); None
        otherwise (the caller concatenates)."""
        specs = [self._index()[n] for n in names]
        first, end = specs[0], specs[0].offset
        itemsize = torch.empty((), dtype=getattr(torch, first.dtype)).element_size()
        for spec in specs:
            if (spec.offset != end or spec.buffer != first.buffer or spec.dtype != first.dtype
                    or len(spec.shape) < 1 or spec.shape[1:] != first.shape[1:]):
                return None
            end += int(np.prod(spec.shape, dtype=np.int64)) * itemsize
        if end == first.offset:
            return None
        flat = self._view(first.buffer, first.dtype, first.offset, (end - first.offset) // itemsize)
        return flat.view(sum(s.shape[0] for s in specs), *first.shape[1:])

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self)


def _spec(name: str, t: Tensor, offset: int, buffer: int = 0) -> TensorSpec:
    return TensorSpec(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, buffer)


def pack(tensors: Mapping[str, Tensor]) -> PackedTensors:
    """Copy `tensors` (any device, any dtype) into one host buffer: one copy per tensor, nothing else."""
    specs, offset = [], 0
    for name, t in tensors.items():
        specs.append(_spec(name, t, offset))
        offset += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
    buffer = np.empty(offset, dtype=np.uint8)
    for spec, t in zip(specs, tensors.values(), strict=True):
        if t.numel():
            dst = torch.frombuffer(buffer, dtype=t.dtype, count=t.numel(), offset=spec.offset)
            dst.copy_(t.detach().reshape(-1))
    return PackedTensors((buffer,), tuple(specs))


def share(tensors: Mapping[str, Tensor]) -> PackedTensors:
    """`tensors` (host tensors) as they are, each one's bytes a buffer of its own: no copy (a non-contiguous
    tensor is made contiguous). A tensor that is another one's alias (a tied LM head) shares its buffer, so
    its bytes travel once. The buffers are views of the tensors: hand the payload over before they change."""
    buffers: list[np.ndarray] = []
    seen: dict[tuple[int, int, str, tuple[int, ...]], int] = {}  # (address, bytes, dtype, shape) -> buffer
    specs = []
    for name, t in tensors.items():
        flat = t.detach().contiguous().reshape(-1)
        key = (flat.data_ptr(), flat.numel() * flat.element_size(), str(t.dtype), tuple(t.shape))
        if key not in seen:
            seen[key] = len(buffers)
            buffers.append(flat.view(torch.uint8).numpy() if flat.numel() else np.empty(0, dtype=np.uint8))
        specs.append(_spec(name, t, 0, seen[key]))
    return PackedTensors(tuple(buffers), tuple(specs))
