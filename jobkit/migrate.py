"""Apply jobkit's migrations to a database URL, recorded where the Supabase CLI records them.

``supabase db push`` and ``jobkit migrate`` share ``supabase_migrations.schema_migrations``, so either
can follow the other. Each file is applied in its own transaction under an advisory lock.
"""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass
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
    """supabase/migrations in a checkout, or the copy shipped inside the installed package."""
    checkout = Path(__file__).resolve().parent.parent / "supabase" / "migrations"
    if checkout.is_dir():
        return checkout
    return importlib.resources.files("jobkit.migrations")


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
    """Apply pending migrations; return the versions applied. ``bootstrap`` loads jobkit/compat.sql when
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
            compat = importlib.resources.files("jobkit").joinpath("compat.sql").read_text()
            with conn.transaction():
                conn.execute(compat.encode())
        conn.execute("create schema if not exists supabase_migrations")
        conn.execute(
            "create table if not exists supabase_migrations.schema_migrations "
            "(version text not null primary key, statements text[], name text)"
        )
        for m in migrations():
            with conn.transaction():
                conn.execute("select pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                done = conn.execute(
                    "select 1 from supabase_migrations.schema_migrations where version = %s", (m.version,)
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
