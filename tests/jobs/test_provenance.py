"""A run's code version: the commit and dirtiness of a git checkout whose root is the package's, "unknown"
without git, outside a repository or inside someone else's; the saved config still loads; the first
metrics row alone carries it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from jobs.config import load_config, to_yaml
from jobs.driver.provenance import ROOT, code_version, config_header, prompt_version
from jobs.telemetry.tracking import RunLog, read_metrics


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def repo(path: Path) -> Path:
    path.mkdir()
    git(path, "init", "-q")
    (path / "a.py").write_text("x = 1\n")
    git(path, "add", "a.py")
    git(path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    return path


def test_commit_and_dirty_tree(tmp_path):
    root = repo(tmp_path / "r")
    assert code_version(root) == {"code/commit": git(root, "rev-parse", "HEAD"), "code/dirty": False}
    (root / "runs.log").write_text("output\n")  # untracked: not dirty
    assert code_version(root)["code/dirty"] is False
    (root / "a.py").write_text("x = 2\n")
    assert code_version(root)["code/dirty"] is True


def test_unknown_without_a_repository_of_its_own(tmp_path, monkeypatch):
    unknown = {"code/commit": "unknown", "code/dirty": "unknown"}
    (tmp_path / "plain").mkdir()
    assert code_version(tmp_path / "plain") == unknown  # a working dir shipped without .git
    nested = repo(tmp_path / "r") / "site-packages"
    nested.mkdir()
    assert code_version(nested) == unknown  # installed inside another checkout: not its commit
    monkeypatch.setenv("PATH", "")  # no git at all
    assert code_version(ROOT) == unknown


def test_saved_config_still_loads_and_first_row_carries_the_version(tmp_path):
    cfg = load_config("jobs/configs/tiny.yaml", [f"out_dir={tmp_path}"])
    version = {"code/commit": "abc123", "code/dirty": True}
    (tmp_path / "config.yaml").write_text(config_header(version) + to_yaml(cfg))
    assert (tmp_path / "config.yaml").read_text().startswith("# code/commit: abc123\n# code/dirty: true\n")
    assert load_config(str(tmp_path / "config.yaml")) == cfg
    log = RunLog(tmp_path, tensorboard=False, first_row=version)
    log.log(0, {"reward/mean": 0.5})
    log.log(1, {"reward/mean": 0.75})
    first, second = read_metrics(tmp_path)
    assert first["code/commit"] == "abc123" and first["code/dirty"] is True and "code/commit" not in second


def test_the_prompt_set_and_its_hash_are_recorded(tmp_path):
    cfg = load_config("jobs/configs/tiny.yaml", [f"out_dir={tmp_path}", "marl.prompts=fewshot"])
    version = {"code/commit": "abc123", "code/dirty": False, **prompt_version(cfg.marl.prompts)}
    assert version["prompts/set"] == "fewshot" and len(str(version["prompts/hash"])) == 16
    assert prompt_version("paper")["prompts/hash"] != version["prompts/hash"]
    (tmp_path / "config.yaml").write_text(config_header(version) + to_yaml(cfg))
    header = (tmp_path / "config.yaml").read_text().splitlines()[:4]
    assert header == ["# code/commit: abc123", "# code/dirty: false", "# prompts/set: fewshot",
                      f"# prompts/hash: {version['prompts/hash']}"]
    assert load_config(str(tmp_path / "config.yaml")) == cfg
    log = RunLog(tmp_path, tensorboard=False, first_row=version)
    log.log(0, {"reward/mean": 0.5})
    log.log(1, {"reward/mean": 0.75})
    first, second = read_metrics(tmp_path)
    assert first["prompts/set"] == "fewshot" and first["prompts/hash"] == version["prompts/hash"]
    assert "prompts/set" not in second
