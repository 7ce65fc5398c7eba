"""The plain-SQL baseline: the claim/complete loop and the inserts a hand-written queue would run, no jobkit."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

PLAIN_TABLE = """
create table bench_plain (
  id bigint generated always as identity primary key,
  status text not null default 'queued',
  payload jsonb not null default '{}',
  run_after timestamptz not null default now(),
  created_at timestamptz not null default now());
create index bench_plain_claim on bench_plain (run_after) where status = 'queued';
"""
CLAIM = """
update bench_plain set status = 'running' where id in (
  select id from bench_plain where status = 'queued' and run_after <= now()
  order by run_after limit %s for update skip locked) returning id"""
COMPLETE = "update bench_plain set status = 'succeeded' where id = any(%s)"


def prepare(url: str, jobs: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        _fresh(conn, keyed=False)
        conn.execute("insert into bench_plain (payload) select '{}' from generate_series(1, %s)", (jobs,))
        conn.execute("vacuum analyze bench_plain")


def process(url: str, jobs: int, *, batch: int, connections: int) -> float:
    """Claim ``batch`` and complete them, one transaction each, on ``connections`` threads: jobs/s."""
    prepare(url, jobs)
    barrier = threading.Barrier(connections + 1)

    def loop() -> None:
        with psycopg.connect(url, prepare_threshold=None) as conn:
            barrier.wait()
            while True:
                with conn.transaction():
                    ids = [r[0] for r in conn.execute(CLAIM, (batch,)).fetchall()]
                    if not ids:
                        return
                    conn.execute(COMPLETE, (ids,))

    threads = [threading.Thread(target=loop) for _ in range(connections)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    rate = jobs / (time.perf_counter() - start)
    with psycopg.connect(url) as conn:
        _check(conn, "select count(*) from bench_plain where status = 'succeeded'", jobs)
    return rate


PLAIN_KEYED_TABLE = """
create table bench_plain_keyed (
  id bigint generated always as identity primary key,
  key text not null unique,
  payload jsonb not null default '{}',
  created_at timestamptz not null default now());
"""
KEYED_INSERT = """
insert into bench_plain_keyed (key, payload) select * from unnest(%s::text[], %s::jsonb[])
on conflict (key) do nothing returning id"""


def _check(conn: psycopg.Connection[Any], query: str, jobs: int) -> None:
    """A plain-SQL run counts only when ``query`` counts exactly ``jobs`` rows, as a peer's run does."""
    row = conn.execute(query).fetchone()
    if row is None or row[0] != jobs:
        raise AssertionError(f"plain-SQL run not valid: {query!r} gave {row}, expected {jobs}")


def _fresh(conn: psycopg.Connection[Any], keyed: bool) -> str:
    """Create the insert baselines' table anew (with a unique key when ``keyed``); its name."""
    table = "bench_plain_keyed" if keyed else "bench_plain"
    conn.execute(f"drop table if exists {table}")
    conn.execute(PLAIN_KEYED_TABLE if keyed else PLAIN_TABLE)
    return table


def insert_one_per_call(url: str, jobs: int) -> float:
    """Insert ``jobs`` rows, one autocommit insert each; checked afterwards: exactly ``jobs`` rows. Jobs/s."""
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        table = _fresh(conn, keyed=False)
        start = time.perf_counter()
        for i in range(jobs):
            conn.execute("insert into bench_plain (payload) values (%s)", (f'{{"n": {i}}}',))
        rate = jobs / (time.perf_counter() - start)
        _check(conn, f"select count(*) from {table}", jobs)
    return rate


def insert_batches(url: str, jobs: int, size: int = 1000, *, keyed: bool = False) -> float:
    """Insert ``jobs`` rows ``size`` per call, each call its own transaction: without keys a COPY into the
    plain table, with keys one ``INSERT … ON CONFLICT DO NOTHING RETURNING id`` from arrays into a table
    with a unique key. Checked afterwards: exactly ``jobs`` rows. Jobs/s."""
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        table = _fresh(conn, keyed)
        start = time.perf_counter()
        for lo in range(0, jobs, size):
            batch = range(lo, min(lo + size, jobs))
            if keyed:
                payloads = [f'{{"n": {i}}}' for i in batch]
                conn.execute(KEYED_INSERT, ([f"k{i}" for i in batch], payloads)).fetchall()
            else:
                with conn.cursor().copy("copy bench_plain (payload) from stdin") as copy:
                    for i in batch:
                        copy.write_row((f'{{"n": {i}}}',))
        rate = jobs / (time.perf_counter() - start)
        _check(conn, f"select count(*) from {table}", jobs)
    return rate
