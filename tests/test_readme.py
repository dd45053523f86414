"""README.md: its first screen is the two set-up commands, it stays short (the manual is docs/), and
every link in it reaches a file, and a heading of that file where it names one (mkdocs build
--strict checks docs/ itself)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(markdown: str) -> set[str]:
    """The ids GitHub gives the headings of `markdown`: lower case, punctuation other than `-`
    and `_` dropped, each space a dash (MkDocs' ids are the same unless a heading holds a run
    of punctuation and spaces)."""
    headings = re.findall(r"^#{1,6} (.+)$", re.sub(r"```.*?```", "", markdown, flags=re.S), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_the_first_screen_is_the_two_set_up_commands():
    first = README.split("\n---\n")[0]
    assert "scripts/quickstart.sh   # installs everything into .venv" in first
    assert "scripts/test.sh         # installs what the tests need" in first
    assert len(first.splitlines()) <= 16


def test_the_readme_is_short():
    assert len(README.splitlines()) < 250


def test_every_link_reaches_a_file_and_heading():
    links = [link for link in LINK.findall(README) if not link.startswith("http")]
    assert {"docs/config.md", "docs/clusters.md#which-cluster"} <= set(links)
    for link in links:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), link
        assert not anchor or anchor in anchors(target.read_text()), link


def test_anchors_follow_the_heading_rule():
    assert anchors("## Which cluster\n```\n# not a heading\n```\n### Ray dashboard / Grafana\n") == {
        "which-cluster", "ray-dashboard--grafana"}
