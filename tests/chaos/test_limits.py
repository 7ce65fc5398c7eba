"""Flow control across worker processes on real PostgreSQL: a type's limits hold for the whole fleet,
through a SIGKILL, and a rate limit is met without being exceeded. JOBKIT_CHAOS_FULL=1 runs the full sizes.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from pgjobkit import NewJob
from pgjobkit.stores.postgres import PostgresStore
from tests.chaos.conftest import ROOT, chaos_jobs


@pytest.fixture
def fleet(db_url: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("create table flow_runs (job_id uuid, pid int, started timestamptz, ended timestamptz)")
    try:
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def _start(db_url: str, procs: list[subprocess.Popen[bytes]], n: int) -> None:
    for _ in range(n):
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.flow_proc", db_url],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )


def _wait_done(conn: psycopg.Connection[tuple[object, ...]], type_: str, total: int, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        row = conn.execute(
            "select count(*) from public.jobkit_jobs where type = %s and status = 'succeeded'", (type_,)
        ).fetchone()
        if row is not None and row[0] == total:
            return
        time.sleep(0.2)
    pytest.fail(f"not every {type_} job succeeded within {seconds:.0f}s")


def test_max_running_holds_across_processes_and_a_sigkill(
    db_url: str, fleet: list[subprocess.Popen[bytes]]
) -> None:
    total = chaos_jobs(60, 400)
    with PostgresStore(db_url) as store:
        store.set_limit("limited", max_running=5)
        store.enqueue_many([NewJob(type="limited", payload={"n": i}, max_attempts=10) for i in range(total)])
    _start(db_url, fleet, 4)  # 4 processes x concurrency 16: 64 slots for a type limited to 5
    with psycopg.connect(db_url, autocommit=True) as conn:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # kill a worker while one of its handlers is mid-job
            busy = conn.execute(
                "select pid from flow_runs where ended is null group by pid order by count(*) desc limit 1"
            ).fetchone()
            if busy is not None:
                break
            time.sleep(0.02)
        assert busy is not None, "no worker started a job"
        victim = next(p for p in fleet if p.pid == busy[0])
        victim.kill()
        victim.wait(10)
        row = conn.execute("select clock_timestamp()").fetchone()
        assert row is not None
        killed_at = row[0]
        _wait_done(conn, "limited", total, 120)
        # The killed worker's handlers stopped when it died; its unfinished records end there.
        spans = conn.execute(
            "select started, coalesce(ended, %s) from flow_runs order by started", (killed_at,)
        ).fetchall()
        lost = conn.execute("select count(*) from flow_runs where ended is null").fetchone()
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])  # an end sorts before a start
    overlap, most = 0, 0
    for _, step in events:
        overlap += step
        most = max(most, overlap)
    assert most <= 5, f"{most} handlers of a type limited to 5 ran at once"
    assert most == 5, f"the limit was never reached ({most}): the test proves nothing"
    assert lost is not None and lost[0] >= 1, "the SIGKILL hit no running handler"


def test_rate_limit_is_never_exceeded_and_is_reached(
    db_url: str, fleet: list[subprocess.Popen[bytes]]
) -> None:
    windows = chaos_jobs(2, 6)
    total = 60 * windows
    with PostgresStore(db_url) as store:
        store.set_limit("rated", max_starts=60, per=timedelta(seconds=10))
        store.enqueue_many([NewJob(type="rated", payload={"n": i}) for i in range(total)])
    _start(db_url, fleet, 4)
    with psycopg.connect(db_url, autocommit=True) as conn:
        _wait_done(conn, "rated", total, 10 * windows + 30)
        starts = [
            r[0]
            for r in conn.execute(
                "select started_at from public.jobkit_jobs where type = 'rated' order by started_at"
            ).fetchall()
        ]
    window = timedelta(seconds=10)
    for i, first in enumerate(starts):  # every 10 s window that begins at a start holds at most 60
        within = sum(1 for s in starts[i:] if s < first + window)
        assert within <= 60, f"{within} starts in the 10 s from {first}"
    span = (starts[-1] - starts[0]).total_seconds()
    # At the limit's pace the last window opens (windows - 1) x 10 s after the first start.
    assert span <= 10 * (windows - 1) + 2.0, (
        f"{total} starts took {span:.1f}s; the limit allows {10 * (windows - 1)}s"
    )
