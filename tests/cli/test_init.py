"""`jobkit init supabase` in a project that has its own, newer migrations, then the real `supabase db push`:
what the README's quickstart has a user of an existing project do."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest

from tests.cli.conftest import JOBKIT, clean_env
from tests.doubles import pgtemplate


def _init(project: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(JOBKIT), "init", "supabase"],
        cwd=project,
        capture_output=True,
        text=True,
        env=clean_env(),
        check=False,
    )


@pytest.fixture
def project(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A Supabase project two years into its life: its migrations applied, the newest made today."""
    root = tmp_path / "app"
    (root / "supabase" / "migrations").mkdir(parents=True)
    (root / "supabase" / "config.toml").write_text('project_id = "app"\n')
    today = datetime.now(UTC).strftime("%Y%m%d%H%M%S")
    (root / "supabase" / "migrations" / "20241105120000_profiles.sql").write_text(
        "create table public.profiles (id uuid primary key);\n"
    )
    (root / "supabase" / "migrations" / f"{today}_documents.sql").write_text(
        "create table public.documents (id bigint generated always as identity primary key);\n"
    )
    db = f"jk_init_{os.getpid()}_{tmp_path.name[-6:]}".replace("-", "_")
    pgtemplate.create_database(db)
    pgtemplate.bootstrap(db, "current")
    try:
        first = pgtemplate.push_migrations(db, root)
        assert first.returncode == 0, first.stderr
        yield root, db
    finally:
        pgtemplate.drop_database(db)


def test_copying_the_packaged_file_is_refused_by_push(project: tuple[Path, str]) -> None:
    """Why `jobkit init` exists: the file as shipped is older than the project's newest migration."""
    root, db = project
    shutil.copy(pgtemplate.MIGRATION, root / "supabase" / "migrations" / pgtemplate.MIGRATION.name)
    refused = pgtemplate.push_migrations(db, root)
    assert refused.returncode != 0 and "--include-all" in refused.stdout + refused.stderr


def test_init_then_push_in_an_existing_project(project: tuple[Path, str]) -> None:
    root, db = project
    done = _init(root)
    assert done.returncode == 0, done.stderr
    [written] = (root / "supabase" / "migrations").glob("*_jobkit.sql")
    assert written.read_text() == pgtemplate.MIGRATION.read_text()
    assert written.name > max(p.name for p in (root / "supabase" / "migrations").glob("2*") if p != written)
    pushed = pgtemplate.push_migrations(db, root)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    with psycopg.connect(pgtemplate.db_url(db)) as conn:
        assert conn.execute("select to_regclass('public.jobkit_jobs') is not null").fetchone() == (True,)
    again = _init(root)
    assert again.returncode == 0 and "already" in again.stdout
    assert len(list((root / "supabase" / "migrations").glob("*_jobkit.sql"))) == 1
    assert (
        "up to date"
        in pgtemplate.push_migrations(db, root).stdout + pgtemplate.push_migrations(db, root).stderr
    )
    # the direct path knows the copy by its name, whatever its version
    migrate = subprocess.run(
        [str(JOBKIT), "migrate"],
        cwd=root,
        capture_output=True,
        text=True,
        env=clean_env(JOBKIT_DATABASE_URL=pgtemplate.db_url(db)),
        check=False,
    )
    assert migrate.returncode == 0 and "up to date" in migrate.stdout, migrate.stderr


def test_init_outside_a_project_says_what_to_do(tmp_path: Path) -> None:
    result = _init(tmp_path)
    assert result.returncode == 2 and "supabase init" in result.stderr
    assert not (tmp_path / "supabase").exists()


def test_init_refuses_a_different_jobkit_migration(project: tuple[Path, str]) -> None:
    root, _ = project
    (root / "supabase" / "migrations" / "20250101000000_jobkit.sql").write_text("-- an older jobkit\n")
    result = _init(root)
    assert result.returncode == 2 and "different jobkit migration" in result.stderr
