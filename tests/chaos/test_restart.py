"""Database faults mid-run: every backend terminated, then the server itself restarted.

Runs on a private embedded PostgreSQL (so restarting it disturbs nothing else), with worker processes.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from pgjobkit.embedded import EmbeddedPostgres
from pgjobkit.migrate import apply
from tests.chaos.conftest import Fleet, chaos_jobs, prepare_chaos
from tests.doubles import pgtemplate


@pytest.fixture
def server(tmp_path: Path) -> Iterator[EmbeddedPostgres]:
    home = pgtemplate.embedded_home(tmp_path)
    pg = EmbeddedPostgres(home, pgtemplate.free_port())
    try:
        pg.start()
        yield pg
    finally:
        pg.stop()
        shutil.rmtree(home, ignore_errors=True)


def _statuses(url: str) -> dict[str, int]:
    for _ in range(50):  # the server may be mid-restart
        try:
            with psycopg.connect(url, row_factory=dict_row, connect_timeout=2) as conn:
                rows = conn.execute("select status, count(*) as n from public.jobkit_jobs group by status")
                return {r["status"]: r["n"] for r in rows.fetchall()}
        except psycopg.OperationalError:
            time.sleep(0.2)
    raise AssertionError("the database did not come back")


def test_workers_ride_out_terminated_backends_and_a_restart(
    server: EmbeddedPostgres, fleet_factory: list[Fleet]
) -> None:
    total = chaos_jobs(1500, 15000)
    url = server.url.rsplit("/", 1)[0] + "/postgres"
    apply(url, bootstrap=True)
    prepare_chaos(url, total)

    fleet = Fleet(url, CHAOS_LEASE="2", CHAOS_WORK_SECONDS="0.03")
    fleet_factory.append(fleet)
    workers = [fleet.start() for _ in range(3)]
    time.sleep(1.5)
    with psycopg.connect(url, autocommit=True) as conn:
        terminated = conn.execute(
            "select count(*) from (select pg_terminate_backend(pid) from pg_stat_activity "
            "where backend_type = 'client backend' and pid <> pg_backend_pid()) t"
        ).fetchone()
    assert terminated is not None and terminated[0] >= 3
    time.sleep(1.5)
    server.restart()

    deadline = time.monotonic() + 90
    while _statuses(url).get("succeeded") != total and time.monotonic() < deadline:
        time.sleep(0.5)
    alive = [w.poll() is None for w in workers]
    statuses = _statuses(url)
    with psycopg.connect(url) as conn:
        row: Any = conn.execute("select count(*), count(distinct job_id) from chaos_runs").fetchone()
    print(
        f"\nrestart: {total} jobs, {terminated[0]} backends terminated, 1 restart, "
        f"{row[0]} executions for {row[1]} jobs, workers alive {alive}, statuses {statuses}"
    )
    assert all(alive), "a transient fault made a worker exit"
    assert statuses == {"succeeded": total}
    assert row[1] == total
