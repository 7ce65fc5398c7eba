"""jobkit's migrations: applied to a database URL (``apply``), or written into a Supabase project for
``supabase db push`` (``init_project``).

A migration is known by its name, the file name after its version (``jobkit``, ``jobkit_0_2_0``), since
``init_project`` gives each copy a version of its own. ``apply`` and ``supabase db push`` both record what
they applied in ``supabase_migrations.schema_migrations``, so either can follow the other. ``apply`` also
records each file's SHA-256 (``supabase_migrations.jobkit_checksums``) and refuses to go on when an applied
migration's file has changed since: the database holds what the old text made, not what the new one says.
Each file runs in its own transaction, under an advisory lock (one migrator at a time) and a short
``lock_timeout``, retried a few times, so a migration never queues behind a long transaction while every
worker queues behind it.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING

from pgjobkit.errors import ConfigurationError, TransientError

if TYPE_CHECKING:
    import psycopg

_LOCK_KEY = 7_300_117  # advisory lock: one migrator at a time
_VERSION_FORMAT = "%Y%m%d%H%M%S"
LOCK_TIMEOUT = timedelta(seconds=5)  # the longest a migration waits for a lock (then tries again)
TRIES = 3


@dataclass(frozen=True)
class Migration:
    """One migration file: ``version`` (its timestamp), ``name`` (the rest of its file name), ``sql``."""

    version: str
    name: str
    sql: str

    @property
    def file_name(self) -> str:
        return f"{self.version}_{self.name}.sql"

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def _package_root() -> Traversable:
    """The migrations shipped in the package (supabase/migrations in a checkout links there)."""
    return importlib.resources.files("pgjobkit").joinpath("sql", "migrations")


def migrations(directory: Traversable | Path | None = None) -> list[Migration]:
    """Every migration in ``directory`` (default: jobkit's own), in version order."""
    root = directory if directory is not None else _package_root()
    files = sorted((f for f in root.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)
    if not files:
        raise ConfigurationError(f"jobkit: no migrations found in {root}")
    return [_parse(f.name, f.read_text()) for f in files]


def _parse(file_name: str, sql: str) -> Migration:
    version, _, name = file_name.removesuffix(".sql").partition("_")
    return Migration(version, name, sql)


def apply(
    conninfo: str,
    *,
    bootstrap: bool = False,
    directory: Traversable | Path | None = None,
    lock_timeout: timedelta = LOCK_TIMEOUT,
    timeout: float = 10.0,
    origin: str | None = None,
) -> list[str]:
    """Apply the migrations the database lacks, in order; return the file names applied. ``bootstrap``
    loads pgjobkit/bootstrap_plain_postgres.sql when the database lacks Supabase's auth schema (a plain
    PostgreSQL). An applied migration whose text changed is a ConfigurationError naming its file. The
    connection is a first one (``connect_first``): a wrong URL is a ConfigurationError naming ``origin``,
    an unreachable server a TransientError after ``timeout`` seconds."""
    # the [postgres] extra: writing a Supabase project's migrations needs none of it
    from pgjobkit.pgconnect import connect_first

    wanted = migrations(directory)
    applied: list[str] = []
    with connect_first(conninfo, timeout=timeout, origin=origin, autocommit=True) as conn:
        _prepare(conn, bootstrap)
        for m in wanted:
            if _apply_one(conn, m, lock_timeout):
                applied.append(m.file_name)
    return applied


def _prepare(conn: psycopg.Connection[tuple[object, ...]], bootstrap: bool) -> None:
    has_auth = conn.execute("select to_regclass('auth.users') is not null").fetchone()
    if not (has_auth and has_auth[0]):
        if not bootstrap:
            raise ConfigurationError(
                "jobkit: this database has no auth.users (it is not a Supabase database). Run "
                "`pgjobkit migrate --bootstrap` to create the roles and auth schema jobkit references."
            )
        bootstrap_sql = (
            importlib.resources.files("pgjobkit").joinpath("bootstrap_plain_postgres.sql").read_text()
        )
        with conn.transaction():
            conn.execute(bootstrap_sql.encode())
    with conn.transaction():
        conn.execute("select pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
        conn.execute("create schema if not exists supabase_migrations")
        conn.execute(
            "create table if not exists supabase_migrations.schema_migrations "
            "(version text not null primary key, statements text[], name text)"
        )
        conn.execute(
            "create table if not exists supabase_migrations.jobkit_checksums "
            "(name text primary key, sha256 text not null, applied_at timestamptz not null default now())"
        )


def _apply_one(conn: psycopg.Connection[tuple[object, ...]], m: Migration, lock_timeout: timedelta) -> bool:
    """Apply ``m`` unless the database has it (checking its checksum): True when this call applied it."""
    import psycopg

    for attempt in range(1, TRIES + 1):
        try:
            with conn.transaction():
                conn.execute("select pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                if _check_applied(conn, m):
                    return False
                conn.execute(f"set local lock_timeout = {int(lock_timeout.total_seconds() * 1000)}")
                conn.execute(m.sql.encode())
                conn.execute(
                    "insert into supabase_migrations.schema_migrations (version, statements, name) "
                    "values (%s, %s, %s)",
                    (m.version, [m.sql], m.name),
                )
                _record(conn, m)
                return True
        except psycopg.errors.LockNotAvailable as exc:
            if attempt == TRIES:
                raise TransientError(
                    f"jobkit: {m.file_name} could not take its locks within {lock_timeout.total_seconds():g}s, "
                    f"{TRIES} times (a long transaction holds jobkit's tables); nothing of it was applied. "
                    "Run `pgjobkit migrate` again when the database is quieter.",
                    code=exc.sqlstate,
                ) from None
            time.sleep(0.5 * attempt)
    raise AssertionError("unreachable")


def _check_applied(conn: psycopg.Connection[tuple[object, ...]], m: Migration) -> bool:
    """Whether ``m`` is applied (by name, whatever version its copy had); an applied migration's text must
    not have changed. One applied by the Supabase CLI or an older jobkit has no checksum yet: the text
    recorded with it is checked where there is one, then its checksum is recorded."""
    row = conn.execute(
        "select s.statements, c.sha256 from supabase_migrations.schema_migrations s "
        "left join supabase_migrations.jobkit_checksums c on c.name = s.name "
        "where s.name = %s order by s.version limit 1",
        (m.name,),
    ).fetchone()
    if row is None:
        return False
    statements, recorded = row
    if recorded is None and isinstance(statements, list) and len(statements) == 1:
        recorded = hashlib.sha256(str(statements[0]).encode()).hexdigest()  # a pgjobkit migrate of 0.1
    if recorded is not None and recorded != m.checksum:
        raise ConfigurationError(
            f"jobkit: migration {m.file_name} was applied to this database with a different text (sha256 "
            f"{str(recorded)[:12]}..., the file now {m.checksum[:12]}...). An applied migration must never "
            "change: restore the file as it was applied, and put the change in a new migration."
        )
    _record(conn, m)
    return True


def _record(conn: psycopg.Connection[tuple[object, ...]], m: Migration) -> None:
    conn.execute(
        "insert into supabase_migrations.jobkit_checksums (name, sha256) values (%s, %s) "
        "on conflict (name) do nothing",
        (m.name, m.checksum),
    )


def init_project(migrations_dir: Path, now: datetime | None = None) -> list[tuple[Path, bool]]:
    """Write the jobkit migrations a Supabase project's ``migrations_dir`` lacks, in order, under fresh
    versions newer than every migration already there (``supabase db push`` refuses, without
    --include-all, one older than the newest it has applied). A migration the project already has, under
    whatever version, is never rewritten. Returns each of jobkit's migrations as (path, written)."""
    existing = _existing(migrations_dir)
    version = _next_version(existing, now or datetime.now(UTC))
    out: list[tuple[Path, bool]] = []
    for m in migrations():
        have = [p for p in existing if _parse(p.name, "").name == m.name]
        if have:
            out.append((have[0], False))
            continue
        migrations_dir.mkdir(parents=True, exist_ok=True)
        path = migrations_dir / f"{version.strftime(_VERSION_FORMAT)}_{m.name}.sql"
        path.write_text(m.sql)
        out.append((path, True))
        version += timedelta(seconds=1)
    return out


def _existing(migrations_dir: Path) -> list[Path]:
    if not migrations_dir.is_dir():
        return []
    return sorted(p for p in migrations_dir.glob("*.sql") if p.is_file())


def _next_version(existing: Iterable[Path], now: datetime) -> datetime:
    versions = [p.name.split("_", 1)[0][:14] for p in existing if p.name.split("_", 1)[0].isdigit()]
    newest = max(versions, default="")
    start = now.replace(microsecond=0, tzinfo=None)
    if newest and newest.ljust(14, "0") >= start.strftime(_VERSION_FORMAT):
        start = datetime.strptime(newest.ljust(14, "0"), _VERSION_FORMAT) + timedelta(seconds=1)
    return start
