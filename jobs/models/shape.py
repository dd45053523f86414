"""A model's shape for the planner, without loading it: from its folder's config.json, from a built-in model's
spec, or, for the paper's Qwen3 models where no folder is at hand (a config checked on a machine without the
weights), from the published shapes keyed by the folder's name."""

from __future__ import annotations

import json
import os
import re

from jobs.models.builtin import CHAR_VOCAB, QWEN3_SHAPES, QWEN3_VOCAB
from jobs.models.resolve import is_builtin, parse_builtin
from learners.compute.memory import ModelShape

# SmolLM2-135M-Instruct's config.json (the built-in converted from its GGUF).
SMOLLM2_135M = ModelShape(
    layers=30, hidden=576, intermediate=1536, heads=9, kv_heads=3, head_dim=64, vocab=49152
)
# the character tokenizers (builtin_models.char_tokenizer)
_TINY_VOCAB = {"tiny": CHAR_VOCAB, "tiny-wide": 132}
_QWEN3_NAME = re.compile(r"qwen3-(0\.6b|1\.7b|4b)(?![\d.])", re.IGNORECASE)


def qwen3_shape(size: str, vocab: int = QWEN3_VOCAB, **overrides: int) -> ModelShape:
    """Qwen3 `size` (0.6b, 1.7b, 4b) as published, with any dimension overridden."""
    hidden, inter, layers, heads, kv = QWEN3_SHAPES[size]
    dims: dict[str, int] = dict(layers=layers, hidden=hidden, intermediate=inter, heads=heads, kv_heads=kv,
                                head_dim=128, vocab=vocab)
    dims.update(overrides)
    return ModelShape(**dims)  # type: ignore[arg-type]  # every key an int field


def shape_of(spec: str) -> ModelShape:
    """The shape of `model.path`'s model. ValueError naming the path when none can be found."""
    if is_builtin(spec):
        return _builtin_shape(spec)
    config = os.path.join(os.path.expanduser(spec), "config.json")
    if os.path.isfile(config):
        with open(config) as f:
            return shape_from_config(json.load(f))
    match = _QWEN3_NAME.search(os.path.basename(os.path.normpath(spec)))
    if match:
        return qwen3_shape(match.group(1).lower())
    raise ValueError(f"model.path={spec!r}: no config.json there and not a known Qwen3 name "
                     f"({', '.join('Qwen3-' + s.upper() for s in QWEN3_SHAPES)}): the planner cannot size it")


def shape_from_config(c: dict) -> ModelShape:
    """An HF config.json (Llama, Qwen2/3, Mistral layouts); a multimodal config's `text_config` if present."""
    c = c.get("text_config", c)
    heads = c["num_attention_heads"]
    return ModelShape(
        layers=c["num_hidden_layers"],
        hidden=c["hidden_size"],
        intermediate=c["intermediate_size"],
        heads=heads,
        kv_heads=c.get("num_key_value_heads") or heads,
        head_dim=c.get("head_dim") or c["hidden_size"] // heads,
        vocab=c["vocab_size"],
        tied=bool(c.get("tie_word_embeddings", False)),
    )


def _builtin_shape(spec: str) -> ModelShape:
    name, p = parse_builtin(spec)
    if name in _TINY_VOCAB:
        return ModelShape(
            layers=p["layers"],
            hidden=p["hidden"],
            intermediate=p["intermediate"],
            heads=p["heads"],
            kv_heads=p["kv_heads"],
            head_dim=p["head_dim"],
            vocab=p.get("vocab", _TINY_VOCAB[name]),
        )
    if name == "smollm2-135m-instruct":
        return SMOLLM2_135M
    size = name.removeprefix("qwen3-").removesuffix("-shape")
    # The shape built-ins keep the character tokenizer's vocabulary unless told otherwise (`?vocab=`).
    keys = {"layers": "layers", "hidden": "hidden", "intermediate": "intermediate", "heads": "heads",
            "kv_heads": "kv_heads", "head_dim": "head_dim"}
    return qwen3_shape(size, vocab=p.get("vocab", CHAR_VOCAB),
                       **{field: p[key] for key, field in keys.items() if key in p})
