"""The plain-SQL baseline: the claim/complete loop and the inserts a hand-written queue would run, no jobkit."""

from __future__ import annotations

import threading
import time

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
        conn.execute("drop table if exists bench_plain")
        conn.execute(PLAIN_TABLE)
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
    return jobs / (time.perf_counter() - start)


def insert_one_per_call(url: str, jobs: int) -> float:
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        conn.execute("drop table if exists bench_plain")
        conn.execute(PLAIN_TABLE)
        start = time.perf_counter()
        for i in range(jobs):
            conn.execute("insert into bench_plain (payload) values (%s)", (f'{{"n": {i}}}',))
        return jobs / (time.perf_counter() - start)


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


def insert_batches(url: str, jobs: int, size: int = 1000, *, keyed: bool = False) -> float:
    """Insert ``jobs`` rows ``size`` per call, each call its own transaction: without keys a COPY into the
    plain table, with keys one ``INSERT … ON CONFLICT DO NOTHING RETURNING id`` from arrays into a table
    with a unique key. Checked afterwards: exactly ``jobs`` rows. Jobs/s."""
    table = "bench_plain_keyed" if keyed else "bench_plain"
    with psycopg.connect(url, autocommit=True, prepare_threshold=None) as conn:
        conn.execute(f"drop table if exists {table}")
        conn.execute(PLAIN_KEYED_TABLE if keyed else PLAIN_TABLE)
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
        row = conn.execute(f"select count(*) from {table}").fetchone()
    if row is None or row[0] != jobs:
        raise AssertionError(f"plain-SQL batch insert not valid: {table} holds {row}, expected {jobs} rows")
    return rate
