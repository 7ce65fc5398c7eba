"""A poison job that kills its worker process on every attempt ends dead through reclaim; it never loops."""

from __future__ import annotations

import time
from typing import Any

import psycopg

from pgjobkit import NewJob
from pgjobkit.stores.postgres import PostgresStore
from tests.chaos.conftest import CHAOS_TABLE, Fleet


def test_poison_job_ends_dead_and_other_work_goes_on(
    db_url: str, pg: psycopg.Connection[Any], fleet_factory: list[Fleet]
) -> None:
    pg.execute(CHAOS_TABLE)
    store = PostgresStore(db_url)
    poison = store.enqueue(NewJob(type="poison", max_attempts=3, priority=10))
    # Jobs claimed in the same batch as the poison job lose an attempt with it each time the process dies,
    # so they get room for that; the poison job has the default 3.
    store.enqueue_many([NewJob(type="chaos", payload={"n": i}, max_attempts=10) for i in range(200)])
    store.close()
    fleet = Fleet(db_url, "exit", CHAOS_LEASE="1", CHAOS_WORK_SECONDS="0.01")
    fleet_factory.append(fleet)
    fleet.start()
    restarts = 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        row = pg.execute(
            "select count(*) filter (where status = 'dead' and type = 'poison') as dead, "
            "count(*) filter (where status = 'succeeded' and type = 'chaos') as done from public.jobkit_jobs"
        ).fetchone()
        if row == {"dead": 1, "done": 200}:
            break
        if not fleet.alive():  # the poison job took the worker down: a supervisor restarts it
            restarts += 1
            fleet.start()
        time.sleep(0.1)
    final = pg.execute("select status, attempts, error from public.jobkit_jobs where id = %s", (poison.id,))
    job = final.fetchone()
    print(f"\npoison: worker died {restarts} times; final {job}")
    assert job is not None and job["status"] == "dead" and job["attempts"] == 3
    assert "lease expired on attempt 3" in job["error"]
    assert restarts == 3  # one crash per attempt, then never again
    assert pg.execute("select count(distinct job_id) as n from chaos_runs").fetchone() == {"n": 200}
    statuses = pg.execute(
        "select type, status, count(*) as n from public.jobkit_jobs group by 1, 2"
    ).fetchall()
    assert sorted((r["type"], r["status"], r["n"]) for r in statuses) == [
        ("chaos", "succeeded", 200),
        ("poison", "dead", 1),
    ]
