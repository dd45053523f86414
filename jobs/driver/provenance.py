"""The code a run ran: the git commit of this repository and whether its tracked files had uncommitted
changes; and the wording it sent: the prompt set `marl.prompts` named and a hash of its resolved content.

Recorded in the run dir's config.yaml (as comment lines, so the file still loads as a config) and in the first
metrics row each start of the run writes (`code/commit`, `code/dirty`, `prompts/set`, `prompts/hash`; a
resumed run records the code it resumed with), beside what the run's layout resolved from `auto` settings
(`layout/gradient_checkpointing/<policy>`), which the saved config keeps as null. Where this package is not a
git repository's root (an installed package, a `ray job submit` working dir copied without .git) or git is
missing or fails, both read "unknown": recording never stops a run.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from jobs.plan.run_layout_record import RunLayout
from marl.prompts import load_prompt_set

UNKNOWN = "unknown"
ROOT = Path(__file__).resolve().parents[2]  # the folder holding jobs/, marl/, learners/ ...


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def code_version(root: Path = ROOT) -> dict[str, str | bool]:
    """{"code/commit": the HEAD sha | "unknown", "code/dirty": True | False | "unknown"}.

    Only a repository whose top level is `root` counts: a package installed inside some other repository (a
    virtual environment in a checkout) must not report that repository's commit. Untracked files (run outputs)
    do not make the tree dirty; a changed tracked file does."""
    top = _git(root, "rev-parse", "--show-toplevel")
    sha = _git(root, "rev-parse", "HEAD") if top and Path(top).resolve() == root.resolve() else None
    if not sha:
        return {"code/commit": UNKNOWN, "code/dirty": UNKNOWN}
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    return {"code/commit": sha, "code/dirty": UNKNOWN if status is None else bool(status)}


def prompt_version(spec: str) -> dict[str, str | bool]:
    """{"prompts/set": `marl.prompts` as given, "prompts/hash": the resolved set's digest
    (marl.prompts.digest)}: a user's file edited between two runs keeps its name and changes its hash."""
    return {"prompts/set": spec, "prompts/hash": load_prompt_set(spec).digest}


def config_header(version: dict[str, str | bool]) -> str:
    """YAML comment lines to put before a run's saved config, one per entry of `version`."""
    return "".join(f"# {key}: {str(v).lower() if isinstance(v, bool) else v}\n" for key, v in version.items())


def layout_record(layout: RunLayout) -> dict[str, str | bool]:
    """What the run's layout resolved from `auto` settings, per policy
    (`layout/gradient_checkpointing/<policy>`), for the config.yaml header and the first metrics row."""
    return {f"layout/gradient_checkpointing/{pid}": on for pid, on in sorted(layout.checkpointing.items())}
