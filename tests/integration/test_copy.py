"""enqueue_bulk on real PostgreSQL: COPY with the turns, clock, wake-ups and all-or-nothing of enqueue_many."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest

from pgjobkit import InvalidArgument, JobStatus, NewJob
from pgjobkit.errors import JobkitError
from pgjobkit.stores.postgres import AsyncPostgresStore, PostgresStore


def bulk(db_url: str, jobs: list[NewJob], *, use_async: bool) -> list[UUID]:
    if not use_async:
        with PostgresStore(db_url, max_size=1) as store:
            return store.enqueue_bulk(jobs)

    async def go() -> list[UUID]:
        store = AsyncPostgresStore(db_url, max_size=1)
        try:
            return await store.enqueue_bulk(jobs)
        finally:
            await store.close()

    return asyncio.run(go())


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_jobs_are_written_in_order_with_the_turns_enqueue_many_gives(db_url: str, use_async: bool) -> None:
    user = uuid4()
    jobs = [
        NewJob(type="t", payload={"i": 0}, fair_key="a"),
        NewJob(type="t", payload={"i": 1}, fair_key="a"),
        NewJob(type="t", payload={"i": 2}),
        NewJob(type="t", payload={"i": 3}, fair_key="b", priority=5, max_attempts=7),
        NewJob(type="t", payload={"i": 4}, fair_key="a"),
        NewJob(type="u", payload={"i": 5}, delay=timedelta(hours=1)),
    ]
    with PostgresStore(db_url, max_size=1) as store:
        store.enqueue_many([NewJob(type="t", fair_key="a")])  # a waits already: bulk's "a" jobs come after
        ids = bulk(db_url, jobs, use_async=use_async)
        assert len(set(ids)) == len(jobs)
        got = [store.get(i) for i in ids]
        assert [j.payload["i"] if j else None for j in got] == list(range(6))
        assert [(j.fair_key, j.fair_round) for j in got if j] == [
            ("a", 1),
            ("a", 2),
            (None, 0),
            ("b", 0),
            ("a", 3),
            (None, 0),
        ]
        third = got[3]
        assert third is not None and (third.priority, third.max_attempts) == (5, 7)
        assert all(j is not None and j.status == JobStatus.QUEUED for j in got)
        delayed, now = got[5], got[0]
        assert delayed is not None and now is not None
        assert timedelta(minutes=59) < delayed.run_after - now.run_after < timedelta(minutes=61)
        assert now.run_after <= now.created_at  # the database's clock: runnable at once
        # a user's jobs are keyed by the user, as enqueue_many keys them
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("insert into auth.users (id, email) values (%s, 'u@example.test')", (user,))
        ids = bulk(db_url, [NewJob(type="t", user_id=user)] * 2, use_async=use_async)
        mine = [store.get(i) for i in ids]
        assert [(j.user_id, j.fair_key, j.fair_round) for j in mine if j] == [
            (user, str(user), 0),
            (user, str(user), 1),
        ]


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_trace_contexts_are_kept_beside_the_jobs(db_url: str, use_async: bool) -> None:
    trace = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    ids = bulk(db_url, [NewJob(type="t", trace_context=trace), NewJob(type="t")], use_async=use_async)
    with PostgresStore(db_url, max_size=1) as store:
        assert store.trace_contexts(ids) == {ids[0]: trace}


def test_workers_are_woken_for_jobs_runnable_now(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("listen jobkit_jobs")
        bulk(
            db_url,
            [NewJob(type="b"), NewJob(type="a"), NewJob(type="c", delay=timedelta(hours=1))],
            use_async=False,
        )
        [note] = list(listener.notifies(timeout=2, stop_after=1))
        assert note.payload == ""  # it names no type: any role may LISTEN


def _count(db_url: str) -> Any:
    with psycopg.connect(db_url) as conn:
        row = conn.execute("select count(*) from public.jobkit_jobs").fetchone()
        return row[0] if row else None


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_all_or_nothing(db_url: str, use_async: bool) -> None:
    with pytest.raises(InvalidArgument, match=r"job 1 has an idempotency_key.*enqueue_many"):
        bulk(db_url, [NewJob(type="t"), NewJob(type="t", idempotency_key="k")], use_async=use_async)
    with pytest.raises(InvalidArgument, match="at most 10000"):
        bulk(db_url, [NewJob(type="t")] * 10_001, use_async=use_async)
    bad = NewJob.model_construct(type="t", payload={}, priority=2_000_000, max_attempts=3)  # past a CHECK
    with pytest.raises(JobkitError, match="jobkit_jobs_priority_valid"):
        bulk(db_url, [NewJob(type="t")] * 5 + [bad], use_async=use_async)
    assert _count(db_url) == 0
    assert bulk(db_url, [], use_async=use_async) == []


def test_inside_the_callers_transaction(db_url: str) -> None:
    with PostgresStore(db_url, max_size=1) as store, psycopg.connect(db_url) as conn:
        store.enqueue_bulk([NewJob(type="t")] * 3, conn=conn)
        conn.rollback()
        assert _count(db_url) == 0
        store.enqueue_bulk([NewJob(type="t")] * 3, conn=conn)
        conn.commit()
    assert _count(db_url) == 3
