"""mypy sees the config's types end to end: a misspelt key is an error where a typed section is
read, on the driver side and on the learner side (learners/config.py's sections, what a LearnerSpec
carries)."""

from __future__ import annotations

from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parents[2]
SNIPPET = '''
from jobs.config import load_config
from learners.config import AlgoConfig


def clip(algo: AlgoConfig) -> float:
    return algo.clip_high + algo.clip_hgih


cfg = load_config("jobs/configs/tiny.yaml")
upper: float = cfg.algo.clip_high + cfg.algo.clip_hgih
'''


def test_mypy_flags_a_misspelt_config_key(tmp_path):
    snippet = tmp_path / "snippet.py"
    snippet.write_text(SNIPPET)
    # The project's config and cache (warm after CI's mypy step): only the snippet is new.
    out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir",
                                str(ROOT / ".mypy_cache"), str(snippet)])
    errors = [line.split("snippet.py:", 1)[1] for line in out.splitlines() if ": error: " in line]
    assert status == 1, out + err
    assert errors == [
        '7: error: "AlgoConfig" has no attribute "clip_hgih"; maybe "clip_high"?  [attr-defined]',
        '11: error: "AlgoConfig" has no attribute "clip_hgih"; maybe "clip_high"?  [attr-defined]',
    ], out
