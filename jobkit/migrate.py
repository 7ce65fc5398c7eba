"""jobkit's migration: copied into a Supabase project (``init_project``) or applied to a database URL
(``apply``), recorded where the Supabase CLI records them.

``supabase db push`` and ``jobkit migrate`` share ``supabase_migrations.schema_migrations``, so either
can follow the other; a migration counts as applied by its version or by its name, since ``init_project``
gives the copy a version of its own. Each file is applied in its own transaction under an advisory lock.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib.resources.abc import Traversable
from pathlib import Path

import psycopg

from jobkit.errors import ConfigurationError

_LOCK_KEY = 7_300_117  # advisory lock: one migrator at a time


@dataclass(frozen=True)
class Migration:
    version: str
    name: str
    sql: str


def _migration_root() -> Traversable:
    """The migrations shipped in the package (jobkit/sql/migrations; supabase/migrations in a checkout
    links there, for the Supabase CLI)."""
    return importlib.resources.files("jobkit").joinpath("sql", "migrations")


def migrations() -> list[Migration]:
    """Every migration, in version order."""
    files = sorted((f for f in _migration_root().iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)
    if not files:
        raise ConfigurationError(f"jobkit: no migrations found in {_migration_root()}")
    return [
        Migration(f.name.split("_", 1)[0], f.name.split("_", 1)[1].removesuffix(".sql"), f.read_text())
        for f in files
    ]


def apply(conninfo: str, *, bootstrap: bool = False) -> list[str]:
    """Apply pending migrations; return the versions applied. ``bootstrap`` loads jobkit/bootstrap_plain_postgres.sql when
    the database lacks Supabase's auth schema (a plain PostgreSQL)."""
    applied: list[str] = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        has_auth = conn.execute("select to_regclass('auth.users') is not null").fetchone()
        if not (has_auth and has_auth[0]):
            if not bootstrap:
                raise ConfigurationError(
                    "jobkit: this database has no auth.users (it is not a Supabase database). Run "
                    "`jobkit migrate --bootstrap` to create the roles and auth schema jobkit references."
                )
            bootstrap_sql = (
                importlib.resources.files("jobkit").joinpath("bootstrap_plain_postgres.sql").read_text()
            )
            with conn.transaction():
                conn.execute(bootstrap_sql.encode())
        conn.execute("create schema if not exists supabase_migrations")
        conn.execute(
            "create table if not exists supabase_migrations.schema_migrations "
            "(version text not null primary key, statements text[], name text)"
        )
        for m in migrations():
            with conn.transaction():
                conn.execute("select pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                done = conn.execute(
                    "select 1 from supabase_migrations.schema_migrations where version = %s or name = %s",
                    (m.version, m.name),
                ).fetchone()
                if done:
                    continue
                conn.execute(m.sql.encode())
                conn.execute(
                    "insert into supabase_migrations.schema_migrations (version, statements, name) "
                    "values (%s, %s, %s)",
                    (m.version, [m.sql], m.name),
                )
                applied.append(m.version)
    return applied


_VERSION_FORMAT = "%Y%m%d%H%M%S"


def init_project(migrations_dir: Path, now: datetime | None = None) -> tuple[Path, bool]:
    """Write jobkit's migrations into a Supabase project's ``migrations_dir`` under fresh versions, newer than
    every migration already there (``supabase db push`` refuses, without --include-all, one older than
    the newest it has applied). Returns the file and whether it was written (False: already there)."""
    [ours] = migrations()  # one file; an upgrade would bring a second
    existing = (
        sorted(p for p in migrations_dir.glob("*.sql") if p.is_file()) if migrations_dir.is_dir() else []
    )
    for path in existing:
        if path.name.split("_", 1)[-1] == f"{ours.name}.sql":
            if path.read_text() == ours.sql:
                return path, False
            raise ConfigurationError(
                f"jobkit: {path} is a different jobkit migration than this jobkit's. If it was never pushed, "
                "delete it and run `jobkit init supabase` again."
            )
    version = (now or datetime.now(UTC)).strftime(_VERSION_FORMAT)
    versions = [p.name.split("_", 1)[0] for p in existing if p.name.split("_", 1)[0].isdigit()]
    if versions and max(versions) >= version:
        newest = datetime.strptime(max(versions)[:14].ljust(14, "0"), _VERSION_FORMAT)
        version = (newest + timedelta(seconds=1)).strftime(_VERSION_FORMAT)
    migrations_dir.mkdir(parents=True, exist_ok=True)
    path = migrations_dir / f"{version}_{ours.name}.sql"
    path.write_text(ours.sql)
    return path, True
