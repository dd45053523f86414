"""Model resolution: turn a `model.path` spec into a local Hugging Face model folder.

Owns the spec grammar (a folder path, or `builtin:<name>[?key=int&...]`) and the on-disk cache of the
built-in models (their offline builders are in jobs.models.builtin). Every component then loads the
returned folder the ordinary way (`AutoModelForCausalLM/AutoTokenizer.from_pretrained(path)`), so
built-in models take exactly the code path a user's Qwen3 folder takes. Nothing is fetched from the hub.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl

from jobs.models.builtin import BUILTIN_MODELS

log = logging.getLogger(__name__)

BUILTIN_PREFIX = "builtin:"
# A build of the SmolLM2 GGUF takes ~30 s; a waiter gives up well after any healthy build.
LOCK_TIMEOUT_S = 900.0


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
