"""The outbox and its relay (``pgjobkit.stores.jetstream.relay``): jobs an app enqueues in its own SQL
transaction, moved into the JetStream queue exactly once per key, on the real 3-node cluster and a
database with jobkit's migrations pushed by the Supabase CLI."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
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
from tests.jetstream.store_helpers import clean_env, fresh_store, run_cli
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


def projected(pg: psycopg.Connection[Any]) -> int:
    return int(pg.execute("select count(*) as n from public.jobkit_jobs").fetchone()["n"])  # type: ignore[index]


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


def test_a_relay_killed_again_and_again_adds_each_job_once(
    db_url: str, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """``pgjobkit nats project`` SIGKILLed mid-run, five times, on a cluster of its own: wherever a kill
    falls (between a pass's enqueue and its delete among them), the next run moves what is left, and the
    queue holds each outbox job once. 1,000 jobs, some of them added while it runs."""
    seed = random.Random(44)
    with LocalCluster(3) as own:
        assert run_cli("migrate", nats_url=own.url, cwd=tmp_path).returncode == 0
        outbox(pg, [{"type": "t", "idempotency_key": f"k{n}"} for n in range(500)])
        view = {"JOBKIT_DATABASE_URL": db_url}
        env = clean_env() | {"JOBKIT_NATS_URL": own.url} | view
        for kill in range(5):
            child = subprocess.Popen(
                [sys.executable, "-c", "from pgjobkit.cli import main; main()", "nats", "project"],
                cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            if kill < 4:
                added = range(500 + 125 * kill, 625 + 125 * kill)
                outbox(pg, [{"type": "t", "idempotency_key": f"k{n}"} for n in added])
            time.sleep(seed.uniform(0.3, 1.2))
            child.kill()
            child.wait(10)
        # a batch a killed projector took comes to the next after its ack_wait (5 s)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done = run_cli("nats", "project", "--once", nats_url=own.url, cwd=tmp_path, env=view)
            assert done.returncode == 0, done.stderr
            if projected(pg) == 1000:
                break
            time.sleep(1)
        assert left(pg) == []

        async def counted() -> tuple[int, set[str]]:
            async with AsyncJetStreamStore(own.url) as queue:
                stats = await queue.stats()
                keys = {
                    str(r["idempotency_key"])
                    for r in pg.execute("select idempotency_key from public.jobkit_jobs")
                }
                return stats.count(), keys

        count, keys = asyncio.run(counted())
    assert count == 1000  # each once, not once per move
    assert keys == {f"k{n}" for n in range(1000)}  # and each in the users' view
