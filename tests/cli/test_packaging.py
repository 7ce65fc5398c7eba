"""`pip install .` ships the migrations inside the wheel, and `pgjobkit migrate` works from the install."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.doubles import pgtemplate


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    tree = pgtemplate.copy_tracked(tmp_path_factory.mktemp("tree"))  # a clone, not this checkout
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(tree)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    [built] = out.glob("pgjobkit-*.whl")
    return built


def test_wheel_migrations_equal_the_supabase_project(wheel: Path) -> None:
    source = {p.name: p.read_bytes() for p in (pgtemplate.ROOT / "supabase" / "migrations").glob("*.sql")}
    with zipfile.ZipFile(wheel) as zf:
        packaged = {
            Path(n).name: zf.read(n) for n in zf.namelist() if n.startswith("pgjobkit/sql/migrations/")
        }
        assert "pgjobkit/bootstrap_plain_postgres.sql" in zf.namelist()
    assert source and packaged == source


def test_migrate_from_the_installed_package(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    name = f"jk_pkg_{os.getpid()}"
    pgtemplate.create_database(name)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBKIT_", "SUPABASE_"))}
        env |= {"PYTHONPATH": str(target), "JOBKIT_DATABASE_URL": pgtemplate.db_url(name)}
        code = (
            "import pgjobkit.migrate as m, sys; assert 'site' in m.__file__, m.__file__; "
            "from pgjobkit.cli import main; main(['migrate', '--bootstrap'])"
        )
        result = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert f"applied {', '.join(m.name for m in pgtemplate.MIGRATIONS)}" in result.stdout
    finally:
        pgtemplate.drop_database(name)
