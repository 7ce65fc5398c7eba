"""What a new user does: `python -m build` makes a wheel and an sdist that carry the SQL and pass `twine
check`, and the README's quickstart, run as written in a fresh virtual environment beside a copy of what git
tracks (the clone it installs), works against the embedded PostgreSQL."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgjobkit.version import __version__
from tests.docs.blocks import blocks
from tests.doubles import pgtemplate

README = pgtemplate.ROOT / "README.md"


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel and sdist of what git tracks, built the way a release is (no isolation: offline-safe)."""
    tree = pgtemplate.copy_tracked(tmp_path_factory.mktemp("tree"))
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(tree)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return out


def _sql_names(names: list[str]) -> set[str]:
    return {n.split("pgjobkit/", 1)[1] for n in names if n.endswith(".sql") and "pgjobkit/sql/" in n}


def test_the_wheel_and_the_sdist_carry_the_sql(dist: Path) -> None:
    [wheel], [sdist] = dist.glob("pgjobkit-*.whl"), dist.glob("pgjobkit-*.tar.gz")
    expected = {f"sql/migrations/{p.name}" for p in pgtemplate.MIGRATIONS} | {
        f"sql/schema/{p.name}" for p in pgtemplate.SCHEMA_SOURCES
    }
    with zipfile.ZipFile(wheel) as zf:
        assert _sql_names(zf.namelist()) == expected
        metadata = zf.read(next(n for n in zf.namelist() if n.endswith("METADATA"))).decode()
    with tarfile.open(sdist) as tf:
        assert _sql_names(tf.getnames()) == expected
    assert "Name: pgjobkit" in metadata and f"Version: {__version__}" in metadata
    assert "Provides-Extra: postgres" in metadata and "Provides-Extra: supabase" in metadata


def test_twine_finds_the_wheel_and_the_sdist_fit_for_pypi(dist: Path) -> None:
    """What PyPI would refuse (metadata, a README that does not render) fails here, before a release."""
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, sorted(dist.iterdir()))],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("PASSED") == 2, checked.stdout


def test_the_readme_says_which_install_line_works_today() -> None:
    """pgjobkit is not on PyPI yet: the README's runnable install line installs a clone, and the published
    form is labelled as such wherever it is given."""
    text = README.read_text()
    assert "not on PyPI yet" in text
    for line in text.splitlines():
        if re.search(r"^\s*pip install [\"']pgjobkit\[", line):
            raise AssertionError(f"an unlabelled install line that fails today: {line.strip()}")


def _block(label: str) -> str:
    """The README's fenced block marked ``<!-- quickstart:label -->`` (read as tests/docs reads every block)."""
    found = [b.code for b in blocks(README) if b.kind == "quickstart" and b.name == label]
    assert found, f"README lost its quickstart:{label} block"
    return found[0]


@pytest.fixture
def embedded_home() -> Iterator[tuple[Path, int]]:
    """A private embedded cluster (its own folder and port), stopped and removed afterwards. Under /var/tmp:
    as root the server runs as nobody, who must reach it."""
    home = Path("/var/tmp") / f"pgjobkit-quickstart-{uuid.uuid4().hex[:8]}"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield home, port
    shutil.rmtree(home, ignore_errors=True)


def test_the_readme_quickstart_runs_in_a_fresh_environment(
    tmp_path: Path, embedded_home: tuple[Path, int]
) -> None:
    script = _block("sh")
    assert 'pip install "./jobkit[embedded]"' in script  # as written: the clone beside it, built by pip
    pgtemplate.copy_tracked(tmp_path / "jobkit")
    (tmp_path / "hello.py").write_text(_block("hello.py"))
    home, port = embedded_home
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBKIT_", "SUPABASE_", "VIRTUAL_ENV"))}
    env |= {"JOBKIT_EMBEDDED_DIR": str(home), "JOBKIT_EMBEDDED_PORT": str(port)}
    stop = ". .venv/bin/activate && python -m pgjobkit.embedded stop"
    try:
        ran = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", script + "python hello.py\n"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        subprocess.run(
            ["bash", "-c", stop], cwd=tmp_path, env=env, capture_output=True, timeout=120, check=False
        )
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert "applied 20261203000000_jobkit.sql" in ran.stdout
    # the first run greets; the second finds the key's job done and runs nothing
    assert ran.stdout.count("hello, world") == 1, ran.stdout
    first, second = ran.stdout.split("hello, world", 1)[1].split("RunSummary(")[1:3]
    assert first.startswith("claimed=1, succeeded=1,") and second.startswith("claimed=0, succeeded=0,"), (
        ran.stdout
    )
