"""`model.dtype`: the dtypes engines serve and learners load, named once. Each name is the torch attribute of
that name, which `DTYPES` resolves on first use ("torch:<name>"), so torch is imported only in the processes
that read a dtype (engines and learners), never by `import marl`."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from marl.registry import Registry


class Dtype(StrEnum):
    """`model.dtype`: the names of DTYPES (the config schema's type for the key)."""

    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


# name -> torch.dtype (typed Any here: marl does not import torch, even for type checking)
DTYPES: Registry[Any] = Registry("model.dtype", {d.value: f"torch:{d.value}" for d in Dtype}, names=Dtype)
