"""The manual builds: `mkdocs build --strict` (mkdocs.yml) fails on any warning, such as a broken link or
anchor, a page left out of the nav, or an API name mkdocstrings cannot resolve. Every name pgjobkit exports
has a place in the generated API reference."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pgjobkit
from tests.docs.blocks import DOCS, ROOT


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(ROOT / "mkdocs.yml"),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(sys.executable).parent)},
    )
    assert built.returncode == 0, built.stdout[-4000:] + built.stderr[-4000:]
    assert "WARNING" not in built.stderr, built.stderr[-4000:]
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert 'id="pgjobkit.UserJobs"' in api and 'id="pgjobkit.Worker"' in api  # rendered, not just listed


def test_every_exported_name_is_in_the_api_reference() -> None:
    listed = set(re.findall(r"^::: pgjobkit\.(\w+)$", (DOCS / "reference" / "api.md").read_text(), re.M))
    assert listed == set(pgjobkit.__all__) - {"__version__"}


_LINK = re.compile(r"\]\((?!https?://|mailto:)([^)\s]+)\)")


def test_the_readme_links_resolve_on_github() -> None:
    """The README's links are relative paths to files of the repository (docs pages, the CHANGELOG), as
    GitHub renders them; a link to a section names a heading of that page."""
    broken = []
    for target in _LINK.findall((ROOT / "README.md").read_text()):
        path, _, anchor = target.partition("#")
        page = ROOT / path
        if not page.is_file() or (
            anchor and anchor not in {_slug(h) for h in re.findall(r"^#+ (.+)$", page.read_text(), re.M)}
        ):
            broken.append(target)
    assert not broken, broken
    assert "docs/guide/pipelines.md" in (ROOT / "README.md").read_text()


def _slug(heading: str) -> str:
    """A heading's anchor, as both GitHub and MkDocs' toc make it for the headings of this manual."""
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", heading).strip().lower())
