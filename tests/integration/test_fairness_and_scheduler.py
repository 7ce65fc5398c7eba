"""Fairness and schedules end to end on real PostgreSQL: a worker serves a small user's job right behind a
big user's first one, and three schedulers enqueue one job per due time. JOBKIT_CHAOS_FULL=1 runs the
schedulers for the full minute."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any
from uuid import UUID

import psycopg
import pytest

from pgjobkit import NewJob, Worker
from pgjobkit.core.schedules import Schedule
from pgjobkit.stores.postgres import AsyncPostgresStore, PostgresStore
from pgjobkit.worker.scheduler import Scheduler
from tests.chaos.conftest import chaos_jobs
from tests.sql.helpers import make_user


def test_a_users_single_job_starts_right_behind_another_users_burst(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        big, small = make_user(conn), make_user(conn)
    store = PostgresStore(db_url, max_size=4)
    try:
        for start in range(0, 5000, 1000):  # the burst is queued first
            store.enqueue_many(
                [
                    NewJob(type="embed", user_id=UUID(big), payload={"n": n})
                    for n in range(start, start + 1000)
                ]
            )
        single = store.get(store.enqueue(NewJob(type="embed", user_id=UUID(small))).id)
        assert single is not None
        order: list[str] = []
        worker = Worker(store, concurrency=1, batch_size=1, poll_interval=0.05)
        worker.register("embed", lambda payload, job: order.append(str(job.user_id)))
        worker.run(install_signals=False, max_jobs=4)
    finally:
        store.close()
    # The stated bound: a key's first job waits behind at most one job of each other key of its priority.
    assert order.index(small) <= 1, order
    assert (single.fair_key, single.fair_round) == (small, 0)


def _schedule_jobs(db_url: str) -> list[datetime]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return [r[0] for r in conn.execute("select run_after from public.jobkit_jobs where type = 'tick'")]


async def _run_schedulers(db_url: str, n: int, seconds: float) -> None:
    stores = [AsyncPostgresStore(db_url, max_size=2) for _ in range(n)]
    stop = asyncio.Event()
    try:
        tasks = [asyncio.create_task(Scheduler(s).arun(stop)) for s in stores]
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        for s in stores:
            await s.close()


def test_three_schedulers_enqueue_one_job_per_due_time(db_url: str) -> None:
    seconds = chaos_jobs(12, 60)
    with PostgresStore(db_url) as store:
        store.set_schedule(Schedule(name="every-second", cron="* * * * * *", type="tick"))
    asyncio.run(_run_schedulers(db_url, 3, seconds))
    due = sorted(_schedule_jobs(db_url))
    assert len(due) >= seconds - 2, f"{len(due)} jobs in {seconds}s"
    assert not [t for t, n in Counter(due).items() if n > 1], "a due time was enqueued twice"
    steps = {(b - a).total_seconds() for a, b in pairwise(due)}
    assert steps == {1.0}, f"a due time was skipped or off the second: {sorted(steps)}"
    assert all(t.microsecond == 0 for t in due)


@pytest.mark.parametrize(("misfire", "expected"), [("catch_up", 300), ("skip", 1)])
def test_after_five_minutes_stopped_schedules_catch_up_or_skip(
    db_url: str, misfire: Any, expected: int
) -> None:
    with PostgresStore(db_url) as store:
        store.set_schedule(Schedule(name="every-second", cron="* * * * * *", type="tick", misfire=misfire))
    with psycopg.connect(db_url, autocommit=True) as conn:
        # Five minutes with no scheduler: the schedule's state is its last due time, five minutes back.
        conn.execute(
            "update public.jobkit_schedules set last_due_at = date_trunc('second', now()) - interval '300 s'"
        )
        row = conn.execute("select last_due_at from public.jobkit_schedules").fetchone()
        assert row is not None
        stopped_at: datetime = row[0]

    async def one_tick() -> int:
        async with AsyncPostgresStore(db_url, max_size=2) as store:
            enqueued, _ = await Scheduler(store).atick()
            return enqueued

    enqueued = asyncio.run(one_tick())
    due = sorted(_schedule_jobs(db_url))
    # Due times are whole seconds after the stop, up to now (a tick may straddle a second).
    assert expected <= enqueued <= expected + 1 if misfire == "catch_up" else enqueued == 1
    assert len(due) == enqueued and due[0] > stopped_at
    if misfire == "skip":
        assert due[0] > datetime.now(UTC) - timedelta(seconds=2)  # only the latest, not the missed ones
