"""`pgjobkit init supabase` in a project that has its own, newer migrations, then the real `supabase db push`:
what the README's quickstart has a user of an existing project do."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest

from pgjobkit.version import SCHEMA_VERSION
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


def test_copying_the_packaged_files_is_refused_by_push(project: tuple[Path, str]) -> None:
    """Why `pgjobkit init` exists: the files as shipped are older than the project's newest migration."""
    root, db = project
    for migration in pgtemplate.MIGRATIONS:
        shutil.copy(migration, root / "supabase" / "migrations" / migration.name)
    refused = pgtemplate.push_migrations(db, root)
    assert refused.returncode != 0 and "--include-all" in refused.stdout + refused.stderr


def _jobkit_files(root: Path) -> list[Path]:
    return sorted(
        p
        for p in (root / "supabase" / "migrations").glob("*.sql")
        if p.name.split("_", 1)[1].startswith("jobkit")
    )


def test_init_then_push_in_an_existing_project(project: tuple[Path, str]) -> None:
    root, db = project
    done = _init(root)
    assert done.returncode == 0, done.stderr
    written = _jobkit_files(root)
    assert [p.read_text() for p in written] == [m.read_text() for m in pgtemplate.MIGRATIONS]
    assert [p.name.split("_", 1)[1] for p in written] == [
        m.name.split("_", 1)[1] for m in pgtemplate.MIGRATIONS
    ]
    others = [p.name for p in (root / "supabase" / "migrations").glob("2*") if p not in written]
    assert min(p.name for p in written) > max(others)
    pushed = pgtemplate.push_migrations(db, root)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    with psycopg.connect(pgtemplate.db_url(db)) as conn:
        assert conn.execute("select public.jobkit_schema_version()").fetchone() == (SCHEMA_VERSION,)
    again = _init(root)
    assert again.returncode == 0 and "already has every jobkit migration" in again.stdout
    assert _jobkit_files(root) == written
    assert (
        "up to date"
        in pgtemplate.push_migrations(db, root).stdout + pgtemplate.push_migrations(db, root).stderr
    )


def test_init_adds_only_the_upgrade_to_a_project_that_holds_0_1(project: tuple[Path, str]) -> None:
    """A project that took jobkit 0.1 (its file under the version `pgjobkit init` gave it then, pushed):
    init keeps that file as it is and adds the migrations after it, newer than everything there."""
    root, db = project
    baseline = pgtemplate.MIGRATIONS[0]
    newest = max(p.name.split("_", 1)[0] for p in (root / "supabase" / "migrations").glob("*.sql"))
    version = datetime.strptime(newest, "%Y%m%d%H%M%S") + timedelta(seconds=1)
    old = root / "supabase" / "migrations" / f"{version:%Y%m%d%H%M%S}_jobkit.sql"
    old.write_text(baseline.read_text())
    assert pgtemplate.push_migrations(db, root).returncode == 0
    before = old.stat().st_mtime_ns
    done = _init(root)
    assert done.returncode == 0, done.stderr
    assert f"already in the project: supabase/migrations/{old.name}" in done.stdout
    written = _jobkit_files(root)
    assert written[0] == old and old.stat().st_mtime_ns == before
    assert [p.name.split("_", 1)[1] for p in written[1:]] == [
        m.name.split("_", 1)[1] for m in pgtemplate.MIGRATIONS[1:]
    ]
    assert all(p.name > old.name for p in written[1:])
    pushed = pgtemplate.push_migrations(db, root)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    with psycopg.connect(pgtemplate.db_url(db)) as conn:
        assert conn.execute("select public.jobkit_schema_version()").fetchone() == (SCHEMA_VERSION,)
