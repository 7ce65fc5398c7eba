"""Every fenced block of the manual (README.md, docs/) carries a marker, and every block marked to run runs:
python blocks page by page in one namespace against the test's own database (and the Supabase test router),
sql blocks against a migrated database, sh blocks as a shell with the `pgjobkit` command on that database.
See tests/docs/blocks.py for the markers."""

from __future__ import annotations

import asyncio
import inspect
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.docs import preambles
from tests.docs.blocks import ROOT, Block, all_blocks, blocks, manual_files
from tests.doubles.router import SupabaseRouter

KINDS = {"run:python", "run:sql", "run:sh", "quickstart", "quickstart-copy", "not-run"}
LANGS = {"run:python": {"python"}, "run:sql": {"sql"}, "run:sh": {"sh"}}
BLOCKS = all_blocks()


def _pages(kind: str) -> list[Path]:
    return [p for p in manual_files() if any(b.kind == kind for b in blocks(p))]


def test_every_block_has_a_marker_that_says_how_it_runs() -> None:
    wrong = [
        f"{b.where}: marker {b.marker!r}"
        for b in BLOCKS
        if b.kind not in KINDS
        or (b.kind in LANGS and b.lang not in LANGS[b.kind])
        or (b.kind == "run:python" and b.name is not None and b.name not in preambles.PYTHON)
        or (b.kind == "run:sql" and b.name is not None and b.name not in preambles.SQL)
        or (b.kind in {"not-run", "quickstart", "quickstart-copy"} and not b.name)
        or (b.kind == "quickstart" and b.path.name != "README.md")
    ]
    assert not wrong, "blocks without a valid marker (see tests/docs/blocks.py):\n" + "\n".join(wrong)


def test_the_markers_find_blocks_of_each_kind() -> None:
    """The extraction itself: a manual whose blocks all came back unmarked, or none of a kind, is a bug here."""
    kinds = Counter(b.kind for b in BLOCKS)
    assert all(kinds[k] for k in KINDS), kinds


def test_an_unmarked_block_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n\n```python\nprint(1)\n```\n\n<!-- run:sql -->\n   ```sql\n   select 1;\n   ```\n")
    found = blocks(page)
    assert [(b.line, b.kind, b.code) for b in found] == [(3, "", "print(1)\n"), (8, "run:sql", "select 1;\n")]


def test_the_docs_quickstart_is_the_readme_quickstart_that_runs() -> None:
    """The site's quickstart copies the README's, which tests/cli/test_install.py runs verbatim."""
    readme = {b.name: b.code for b in blocks(ROOT / "README.md") if b.kind == "quickstart"}
    copies = [b for b in BLOCKS if b.kind == "quickstart-copy"]
    assert copies
    for b in copies:
        assert b.code == readme.get(b.name), f"{b.where} differs from the README's quickstart:{b.name}"


def _close(namespace: dict[str, Any]) -> None:
    """Close what the blocks opened (workers, stores, users' clients): a test leaves no pool behind."""
    for value in namespace.values():
        if type(value).__module__.startswith("pgjobkit") and callable(getattr(value, "close", None)):
            closed = value.close()
            if inspect.iscoroutine(closed):
                asyncio.run(closed)


@pytest.mark.parametrize("page", _pages("run:python"), ids=lambda p: str(p.relative_to(ROOT)))
def test_python_blocks_run(
    page: Path,
    db_url: str,
    pg: psycopg.Connection[Any],
    router: SupabaseRouter,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    for name in list(os.environ):
        if name.startswith(("JOBKIT_", "SUPABASE_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("JOBKIT_DATABASE_URL", db_url)
    monkeypatch.setenv("EMBEDDINGS_URL", "http://embeddings.test")
    monkeypatch.chdir(tmp_path)  # no .env of the checkout's
    namespace: dict[str, Any] = {"__name__": "docs_page", "_db_url": db_url, "_pg": pg}
    try:
        for block in (b for b in blocks(page) if b.kind == "run:python"):
            if block.name is not None:
                exec(compile(preambles.PYTHON[block.name], f"<preamble {block.name}>", "exec"), namespace)  # noqa: S102  # the manual's own text, run as a reader would
            exec(compile(block.code, block.where, "exec"), namespace)  # noqa: S102
    finally:
        _close(namespace)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "run:sql"], ids=lambda b: b.where)
def test_sql_blocks_run(block: Block, pg: psycopg.Connection[Any]) -> None:
    before, check = preambles.SQL[block.name] if block.name else ("", None)
    if before:
        pg.execute(before)
    pg.execute(block.code)  # the manual's text, as psql would send it
    if check is not None:
        check(pg)


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.kind == "run:sh"], ids=lambda b: b.where)
def test_sh_blocks_run(block: Block, db_url: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBKIT_", "SUPABASE_"))}
    env |= {"JOBKIT_DATABASE_URL": db_url, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"}
    ran = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, f"{block.where}:\n{ran.stdout[-2000:]}{ran.stderr[-2000:]}"
