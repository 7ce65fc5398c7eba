"""The plain-SQL baseline: the same claim/complete loop a hand-written queue would run, no jobkit."""

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
