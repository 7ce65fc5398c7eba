"""`pgjobkit migrate` (pgjobkit.migrate.apply) on a database URL: only what the database lacks, in order; an
applied migration whose text changed is refused by name; a held lock makes it give up cleanly."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from pgjobkit import migrate
from pgjobkit.errors import ConfigurationError, TransientError
from pgjobkit.version import SCHEMA_VERSION
from tests.doubles import pgtemplate
from tests.doubles.long_transaction import reading_jobs


@pytest.fixture
def bare(templates: pgtemplate.Templates) -> Iterator[str]:
    """A Supabase-like database with no jobkit in it yet."""
    name = f"{templates.prefix}_bare"
    pgtemplate.create_database(name)
    pgtemplate.bootstrap(name, "current")
    try:
        yield pgtemplate.db_url(name)
    finally:
        pgtemplate.drop_database(name)


def _copy(tmp_path: Path, count: int | None = None) -> Path:
    folder = tmp_path / "migrations"
    folder.mkdir()
    for path in pgtemplate.MIGRATIONS[:count]:
        shutil.copy(path, folder / path.name)
    return folder


def _version(url: str) -> str | None:
    with psycopg.connect(url) as conn:
        found = conn.execute(
            "select to_regprocedure('public.jobkit_schema_version()') is not null"
        ).fetchone()
        if not (found and found[0]):
            return None
        row = conn.execute("select public.jobkit_schema_version()").fetchone()
        return str(row[0]) if row else None


def test_applies_only_what_the_database_lacks_in_order(bare: str, tmp_path: Path) -> None:
    first = _copy(tmp_path, 1)
    assert migrate.apply(bare, directory=first) == [pgtemplate.MIGRATIONS[0].name]
    assert _version(bare) is None  # 0.1 had no version function
    assert migrate.apply(bare) == [p.name for p in pgtemplate.MIGRATIONS[1:]]
    assert _version(bare) == SCHEMA_VERSION
    assert migrate.apply(bare) == []
    with psycopg.connect(bare) as conn:
        recorded = conn.execute(
            "select name from supabase_migrations.jobkit_checksums order by name"
        ).fetchall()
    assert [r[0] for r in recorded] == sorted(
        p.name.split("_", 1)[1].removesuffix(".sql") for p in pgtemplate.MIGRATIONS
    )


def test_an_edited_applied_migration_is_refused_naming_its_file(bare: str, tmp_path: Path) -> None:
    migrate.apply(bare)
    folder = _copy(tmp_path)
    edited = folder / pgtemplate.MIGRATIONS[0].name
    edited.write_text(edited.read_text().replace("-- jobkit: a job queue", "-- jobkit: a queue", 1))
    with pytest.raises(ConfigurationError, match=pgtemplate.MIGRATIONS[0].name) as refused:
        migrate.apply(bare, directory=folder)
    assert "must never change" in str(refused.value)
    assert migrate.apply(bare) == []  # the shipped text still passes


def test_a_database_jobkit_0_1_migrated_is_checked_by_the_text_it_recorded(bare: str, tmp_path: Path) -> None:
    """jobkit 0.1's `pgjobkit migrate` kept each file's whole text and no checksum."""
    baseline = pgtemplate.MIGRATIONS[0]
    with psycopg.connect(bare, autocommit=True) as conn:
        conn.execute(baseline.read_text().encode())
        conn.execute("create schema supabase_migrations")
        conn.execute(
            "create table supabase_migrations.schema_migrations (version text primary key, statements text[], name text)"
        )
        conn.execute(
            "insert into supabase_migrations.schema_migrations values (%s, %s, 'jobkit')",
            ("20260101000000", [baseline.read_text()]),
        )
    folder = _copy(tmp_path)
    (folder / baseline.name).write_text(baseline.read_text() + "\n-- changed\n")
    with pytest.raises(ConfigurationError, match=baseline.name):
        migrate.apply(bare, directory=folder)
    assert migrate.apply(bare) == [p.name for p in pgtemplate.MIGRATIONS[1:]]
    assert _version(bare) == SCHEMA_VERSION


def test_a_held_lock_makes_it_give_up_with_nothing_applied(bare: str, tmp_path: Path) -> None:
    migrate.apply(bare, directory=_copy(tmp_path, 1))
    with reading_jobs(bare):
        with pytest.raises(TransientError, match=pgtemplate.MIGRATIONS[1].name) as gave_up:
            migrate.apply(bare, lock_timeout=timedelta(milliseconds=100))
        assert "nothing of it was applied" in str(gave_up.value)
        assert _version(bare) is None
    assert migrate.apply(bare) == [p.name for p in pgtemplate.MIGRATIONS[1:]]
