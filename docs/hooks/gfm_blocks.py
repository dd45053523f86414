"""MkDocs hook: block structure written for GitHub's renderer, read the same by Python-Markdown.

The pages that live beside the code (benchmarks/README.md, studies/*/README.md, linked into docs/) are written
for GitHub, where a list or a table may follow a paragraph line directly and a nested list item is indented by
two spaces. Python-Markdown needs a blank line before either block and four spaces for nesting; without them a
list renders as one paragraph of dashes. Only block starts outside fenced code are touched; text is unchanged.
"""

from __future__ import annotations

import re
from typing import Any

ITEM = re.compile(r"([-*]|\d+\.) ")
NESTED = re.compile(r" {2}(?=([-*]|\d+\.) )")


def on_page_markdown(markdown: str, **_: Any) -> str:
    out: list[str] = []
    fenced = in_list = False
    for line in markdown.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            line = NESTED.sub("    ", line, count=1) if NESTED.match(line) else line
            starts_list, starts_table = bool(ITEM.match(line)), line.startswith("|")
            previous = out[-1] if out else ""
            if previous.strip() and (
                (starts_list and not in_list) or (starts_table and not previous.startswith("|"))
            ):
                out.append("")
            if not line.strip():
                in_list = False
            elif starts_list:
                in_list = True
        out.append(line)
    return "\n".join(out)
