"""The fenced code blocks of the manual (README.md and docs/), each with the marker comment before it.

A marker is the line just before a block's opening fence, at any indentation:

- ``<!-- run:python -->``, ``<!-- run:sql -->``, ``<!-- run:sh -->``: tests/docs/test_blocks.py runs it;
  ``run:KIND:NAME`` first runs the preamble NAME of tests/docs/preambles.py (stand-ins for the names a
  fragment takes from its page, and checks of what it did);
- ``<!-- quickstart:LABEL -->``: README only; tests/cli/test_install.py runs it in a fresh environment;
- ``<!-- quickstart-copy:LABEL -->``: a docs page's copy of the README's quickstart block, held equal to it;
- ``<!-- not-run: REASON -->``: a block that cannot run here (a diagram, a real Supabase project); the
  reason is required.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from tests.doubles import pgtemplate

ROOT = pgtemplate.ROOT
DOCS = ROOT / "docs"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<lang>[\w+-]*)[ \t]*$")
_MARKER = re.compile(r"^[ \t]*<!--[ \t]*(?P<body>.*?)[ \t]*-->[ \t]*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    lang: str
    marker: str | None  # the comment's body, e.g. "run:python:worker", or None when the line before is none
    code: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def kind(self) -> str:
        """run:python, run:sql, run:sh, quickstart, quickstart-copy, not-run, or "" (no marker)."""
        if self.marker is None:
            return ""
        if self.marker.startswith("run:"):
            return ":".join(self.marker.split(":")[:2])
        return self.marker.split(":", 1)[0]

    @property
    def name(self) -> str | None:
        """run:KIND:NAME's NAME, quickstart:LABEL's LABEL, or not-run's reason."""
        if self.marker is None:
            return None
        parts = self.marker.split(":", 2 if self.marker.startswith("run:") else 1)
        rest = parts[2] if self.marker.startswith("run:") and len(parts) > 2 else None
        if not self.marker.startswith("run:") and len(parts) > 1:
            rest = parts[1]
        return rest.strip() if rest is not None else None


def manual_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        end = next(
            (
                j
                for j in range(i + 1, len(lines))
                if re.fullmatch(rf"[ \t]*{re.escape(fence)}[ \t]*", lines[j])
            ),
            None,
        )
        assert end is not None, f"{path}:{i + 1}: a fence that never closes"
        marker = _MARKER.match(lines[i - 1]) if i > 0 else None
        body = "\n".join(
            line[len(indent) :] if line.startswith(indent) else line for line in lines[i + 1 : end]
        )
        found.append(
            Block(
                path, i + 1, opening["lang"], marker["body"] if marker else None, textwrap.dedent(body) + "\n"
            )
        )
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [b for path in manual_files() for b in blocks(path)]
