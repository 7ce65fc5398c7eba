"""The benchmark's own database: created fresh, Supabase bootstrap (jobkit compat), migrations applied."""

from __future__ import annotations

import os

import psycopg
from psycopg import sql

from pgjobkit.embedded import EmbeddedPostgres
from pgjobkit.migrate import apply
from pgjobkit.settings import Settings

BENCH_DB = "jobkit_bench"


def server_url() -> str:
    """JOBKIT_BENCH_DATABASE_URL, else the local server on 5432, else the embedded one."""
    url = os.environ.get("JOBKIT_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    try:
        psycopg.connect(url, connect_timeout=3).close()
        return url
    except psycopg.OperationalError:
        return EmbeddedPostgres.from_settings(Settings.load(env_file=None)).start()


def drop_database(name: str) -> None:
    """Drop ``name`` on the benchmark server, if it is there."""
    with psycopg.connect(server_url(), autocommit=True) as conn:
        conn.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))


def fresh_database(name: str = BENCH_DB, *, migrate: bool = True) -> str:
    """Drop and create ``name`` on the benchmark server, apply jobkit's migrations (plain-PostgreSQL
    bootstrap) unless ``migrate`` is False; its URL."""
    drop_database(name)
    admin = server_url()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    info = psycopg.conninfo.conninfo_to_dict(admin)
    info["dbname"] = name
    url = psycopg.conninfo.make_conninfo("", **{k: v for k, v in info.items() if v is not None})
    if migrate:
        apply(url, bootstrap=True)
    return url


def reset(url: str) -> None:
    """Empty the queue between runs (and the plain-SQL baseline's table)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "truncate public.jobkit_jobs, public.jobkit_pipeline_jobs, public.jobkit_dependencies,"
            " public.jobkit_projected"
        )
        conn.execute("drop table if exists bench_plain")
        conn.execute("vacuum analyze public.jobkit_jobs")
