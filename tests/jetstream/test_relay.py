"""The outbox and its relay (``pgjobkit.stores.jetstream.relay``): jobs an app enqueues in its own SQL
transaction, moved into the JetStream queue exactly once per key, on the real 3-node cluster and a
database with jobkit's migrations pushed by the Supabase CLI."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgjobkit.core.models import NewJob
from pgjobkit.natscluster import LocalCluster
from pgjobkit.ops.projection import outbox_done, outbox_enqueue, outbox_take
from pgjobkit.stores.jetstream import AsyncJetStreamStore
from pgjobkit.stores.jetstream.projector import Projector
from pgjobkit.stores.jetstream.relay import Relay
from pgjobkit.stores.postgres import AsyncPostgresStore, PostgresStore
from pgjobkit.stores.supabase import SupabaseStore
from tests.doubles.router import BASE_URL, SupabaseRouter
from tests.jetstream.store_helpers import fresh_store
from tests.sql.helpers import make_user

Scenario = Callable[[AsyncJetStreamStore, AsyncPostgresStore], Awaitable[None]]


def run(cluster: LocalCluster, db_url: str, scenario: Scenario) -> None:
    async def main() -> None:
        async with fresh_store(cluster, partitions=2) as queue, AsyncPostgresStore(db_url) as database:
            await queue.migrate()
            await scenario(queue, database)

    asyncio.run(main())


def outbox(pg: psycopg.Connection[Any], jobs: list[dict[str, Any]]) -> list[int]:
    rows = pg.execute("select * from public.jobkit_outbox_enqueue(%s) as seq", [Jsonb(jobs)]).fetchall()
    return [r["seq"] for r in rows]


def left(pg: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    return pg.execute("select seq, job, error from public.jobkit_outbox order by seq").fetchall()


def test_what_the_apps_transaction_commits_moves_once_and_reaches_its_user(
    cluster: LocalCluster, db_url: str, pg: psycopg.Connection[Any]
) -> None:
    a = make_user(pg)
    with pg.transaction() as rolled_back:  # with the app's other writes
        outbox(pg, [{"type": "embed", "idempotency_key": "gone"}])
        raise psycopg.Rollback(rolled_back)
    with pg.transaction():
        seqs = outbox(pg, [{"type": "embed", "idempotency_key": f"doc-{n}", "user_id": a} for n in range(5)])
    assert len(seqs) == 5

    async def scenario(queue: AsyncJetStreamStore, database: AsyncPostgresStore) -> None:
        relay = Relay(database, queue, batch=2)  # several passes
        assert await relay.drain() == 5
        assert left(pg) == []
        stats = await queue.stats()
        assert stats.count() == 5
        again = await queue.enqueue(NewJob(type="embed", idempotency_key="doc-3"))
        assert not again.inserted  # the key's job is the one the relay made
        projector = Projector(queue, database)
        try:
            assert await projector.drain() == 5
        finally:
            await projector.close()
        keys = pg.execute(
            "select idempotency_key, user_id::text from public.jobkit_jobs order by 1"
        ).fetchall()
        assert keys == [{"idempotency_key": f"doc-{n}", "user_id": a} for n in range(5)]

    run(cluster, db_url, scenario)


def test_a_move_repeated_after_a_stop_adds_nothing(
    cluster: LocalCluster, db_url: str, pg: psycopg.Connection[Any]
) -> None:
    """The relay stopped after its enqueue and before the outbox's delete: the next pass enqueues by the
    same keys, JetStream answers the jobs already there, and the outbox is emptied."""
    outbox(pg, [{"type": "t", "idempotency_key": f"k{n}", "delay_seconds": 3600} for n in range(4)])

    async def scenario(queue: AsyncJetStreamStore, database: AsyncPostgresStore) -> None:
        taken = await database.run(outbox_take(100))
        first = await queue.enqueue_many([NewJob.model_validate(job) for _, job in taken])  # ... and stopped
        assert all(r.inserted for r in first)
        assert await Relay(database, queue).drain() == 4
        assert left(pg) == [] and (await queue.stats()).count() == 4
        job = await queue.get(first[0].id)
        assert job is not None and job.run_after > job.created_at  # delay_seconds, counted from the enqueue

    run(cluster, db_url, scenario)


def test_a_job_jetstream_refuses_stays_with_its_error_and_the_rest_moves(
    cluster: LocalCluster, db_url: str, pg: psycopg.Connection[Any]
) -> None:
    """Rows written into the outbox by hand, past jobkit_outbox_enqueue's checks: one JetStream refuses (a
    priority), one that is not a job. Each stays with its error, later passes leave it, the rest moves."""
    outbox(pg, [{"type": "t", "idempotency_key": "a"}])
    pg.execute(
        """insert into public.jobkit_outbox (job) values ('{"type": "t", "idempotency_key": "p", "priority": 5}')"""
    )
    pg.execute("""insert into public.jobkit_outbox (job) values ('{"nothing": "here"}')""")
    outbox(pg, [{"type": "t", "idempotency_key": "b"}])

    async def scenario(queue: AsyncJetStreamStore, database: AsyncPostgresStore) -> None:
        assert await Relay(database, queue).drain() == 2
        kept = left(pg)
        assert [r["job"].get("idempotency_key") for r in kept] == ["p", None]
        assert "priority" in kept[0]["error"] and "not available" in kept[0]["error"]
        assert "not a job" in kept[1]["error"]
        assert await Relay(database, queue).drain() == 0 and len(left(pg)) == 2
        assert (await queue.stats()).count() == 2

    run(cluster, db_url, scenario)


@pytest.mark.parametrize(
    ("job", "says"),
    [
        ({"type": "t"}, "idempotency_key is required"),
        ({"type": "t", "idempotency_key": "k", "priority": 1}, "priority must be 0"),
        ({"type": "t", "idempotency_key": "k", "fair_key": "f"}, "fair_key is not available"),
        ({"type": "t", "idempotency_key": "k", "payload": [1]}, "payload must be a JSON object"),
        ({"type": "t", "idempotency_key": "k", "what": 1}, "unknown key"),
    ],
)
def test_the_outbox_refuses_at_the_apps_enqueue_what_jetstream_would(
    pg: psycopg.Connection[Any], job: dict[str, Any], says: str
) -> None:
    with pytest.raises(psycopg.Error, match=says) as info:
        outbox(pg, [{"type": "ok", "idempotency_key": "fine"}, job])
    assert info.value.sqlstate == "JK001" and "job 1:" in str(info.value)
    assert left(pg) == []


def test_python_enqueues_into_the_outbox_in_the_apps_transaction_and_through_the_api(
    db_url: str, pg: psycopg.Connection[Any], router: SupabaseRouter, service_key: str
) -> None:
    """``store.run(outbox_enqueue(jobs), conn)``: on PostgresStore, in the caller's connection's
    transaction (rolled back with it); on SupabaseStore, through PostgREST as supabase-py sends it."""
    store = PostgresStore(db_url)
    try:
        with psycopg.connect(db_url) as conn:
            with conn.transaction() as rolled_back:
                store.run(outbox_enqueue([NewJob(type="t", idempotency_key="gone")]), conn)
                raise psycopg.Rollback(rolled_back)
            with conn.transaction():
                [kept] = store.run(outbox_enqueue([NewJob(type="t", idempotency_key="kept")]), conn)
    finally:
        store.close()
    api = SupabaseStore(BASE_URL, service_key)
    try:
        seqs = api.run(outbox_enqueue([NewJob(type="t", idempotency_key=f"api-{n}") for n in range(2)]))
        assert [r["seq"] for r in left(pg)] == [kept, *seqs]
        assert [job["idempotency_key"] for _, job in api.run(outbox_take(10))] == ["kept", "api-0", "api-1"]
        assert api.run(outbox_done(seqs, [None, "kept by hand"])) == 2
    finally:
        api.close()
    assert [(r["job"]["idempotency_key"], r["error"]) for r in left(pg)] == [
        ("kept", None),
        ("api-1", "kept by hand"),
    ]
