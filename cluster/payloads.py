"""The typed weight-sync payloads that are not whole weights: an adapter (named tensors, packed into one
buffer by cluster.packing, and its config) and an adapter delta (an adapter and the names of the weights the
receiver serves after merging it). Frozen dataclasses: they pickle through the object store as they are, the
packed buffers out of band."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from cluster.packing import tensor_bytes

# A JSON-like record: what json.dump writes and json.load returns (an adapter's config file).
JsonConfig = Mapping[str, Any]


@dataclass(frozen=True)
class AdapterPayload:
    """A LoRA adapter of policy `policy_id` as a sync ships it: its tensors under peft's saved names (as in
    adapter_model.safetensors; a PackedTensors when sent) and its config (as in adapter_config.json)."""

    policy_id: str
    tensors: Mapping[str, Tensor]
    config: JsonConfig

    @property
    def nbytes(self) -> int:
        """The bytes the adapter's tensors take (what the sync moves)."""
        return tensor_bytes(self.tensors)


@dataclass(frozen=True)
class LoraDelta:
    """An adapter-only sync of merged serving: the adapter, and the names of every weight the engines serve
    (the merged layers and the base's others)."""

    adapter: AdapterPayload
    names: list[str]
