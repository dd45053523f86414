"""Member methods are named by the methods themselves (`Group.submit(EngineMember.generate, ...)`), so the
type checker catches a misspelt method, wrong arguments, another member's method or a string name before
anything runs on a remote actor. Each snippet below is checked by mypy; only the correct one passes."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEADER = """from cluster.group import Group
from cluster.member import Call
from learners.member import LearnerMember
from rollout.engine import EngineMember, Sampling


def use(engines: Group[EngineMember], learners: Group[LearnerMember]) -> None:
"""
SNIPPETS = {
    "correct": """    chat = [[{"role": "user", "content": "hi"}]]
    engines.submit_to([0], EngineMember.generate, chat, Sampling())
    versions: list[int] = engines.submit(EngineMember.weight_version).result(1.0)
    learners.submit_each([Call(LearnerMember.save_state, "/tmp/state")])
    print(versions)
""",
    "misspelt": "    engines.submit(EngineMember.genrate, [], Sampling())\n",
    "wrong_arguments": "    engines.submit(EngineMember.load_weights, {}, \"v1\")\n",
    "another_members_method": "    engines.submit(LearnerMember.export, \"out\")\n",
    "string_name": "    engines.submit(\"weight_version\")\n",
    "scatter_misspelt": "    learners.submit_each([Call(LearnerMember.updte, {}, None)])\n",
}
# The member contracts are this project's; the libraries behind them are read as untyped to keep this quick.
CONFIG = """[mypy]
ignore_missing_imports = True
explicit_package_bases = True
[mypy-torch.*,numpy.*,ray.*,transformers.*,vllm.*,omegaconf.*]
follow_imports = skip
"""


@pytest.fixture(scope="module")
def errors(tmp_path_factory) -> dict[str, list[str]]:
    """mypy's error lines per snippet, from one run over all of them."""
    folder = tmp_path_factory.mktemp("snippets")
    for name, body in SNIPPETS.items():
        (folder / f"{name}.py").write_text(HEADER + body)
    (folder / "mypy.ini").write_text(CONFIG)
    out = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(folder / "mypy.ini"),
         "--cache-dir", str(folder / "cache"), *(str(folder / f"{n}.py") for n in SNIPPETS)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )
    found: dict[str, list[str]] = {name: [] for name in SNIPPETS}
    for line in out.stdout.splitlines():
        match = re.match(rf"{re.escape(str(folder))}/(\w+)\.py:\d+: error: (.*)", line)
        if match:
            found[match.group(1)].append(match.group(2))
    assert "error" in out.stdout, out.stdout + out.stderr  # mypy ran and reported
    return found


def test_a_correct_typed_call_passes(errors):
    assert errors["correct"] == []


@pytest.mark.parametrize(("snippet", "message"), [
    ("misspelt", r'"type\[EngineMember\]" has no attribute "genrate"'),
    ("wrong_arguments", r'Argument 3 to "submit" of "Group" has incompatible type "str"; expected "int"'),
    ("another_members_method", r'Argument 1 to "submit" of "Group" has incompatible type.*LearnerMember'),
    ("string_name", r'Argument 1 to "submit" of "Group" has incompatible type "str"'),
    ("scatter_misspelt", r'"type\[LearnerMember\]" has no attribute "updte"'),
])
def test_a_wrong_member_call_fails_the_type_check(errors, snippet, message):
    assert any(re.search(message, e) for e in errors[snippet]), errors[snippet]
