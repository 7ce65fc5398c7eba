"""The projection of a JetStream queue into PostgreSQL (``pgjobkit.stores.jetstream.projector``): the real
3-node cluster and a database with jobkit's migrations pushed by the Supabase CLI; a signed-in user's
listing read as PostgREST reads it (``tests.doubles.postgrest``), under Row Level Security, and their live
updates as the Realtime broadcasts jobkit's triggers store."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import psycopg
import pytest
from psycopg.types.json import Jsonb

from pgjobkit.core.models import JobStatus, NewJob
from pgjobkit.errors import ConfigurationError
from pgjobkit.natscluster import LocalCluster
from pgjobkit.ops.projection import project
from pgjobkit.stores.jetstream import AsyncJetStreamStore
from pgjobkit.stores.jetstream.projector import Projector
from pgjobkit.stores.postgres import AsyncPostgresStore
from pgjobkit.stores.supabase import SupabaseStore
from pgjobkit.worker.calls_async import AsyncWorkerCalls
from tests.doubles.postgrest import Postgrest, PostgrestError
from tests.doubles.router import BASE_URL, SupabaseRouter
from tests.jetstream.store_helpers import claim_until, fresh_store, run_cli
from tests.sql.helpers import make_user, user_claims

LEASE = timedelta(seconds=30)
USER_COLUMNS = ["id", "user_id", "type", "status", "payload", "attempts", "result", "progress"]
Scenario = Callable[[AsyncJetStreamStore, AsyncPostgresStore, Projector], Awaitable[None]]


def states(pg: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
    got = pg.execute("select id::text, status::text, attempts, result from public.jobkit_jobs")
    return {r["id"]: r for r in got.fetchall()}


def run(cluster: LocalCluster, db_url: str, scenario: Scenario, partitions: int = 2) -> None:
    async def main() -> None:
        async with (
            fresh_store(cluster, partitions=partitions) as source,
            AsyncPostgresStore(db_url) as target,
        ):
            await source.migrate()
            projector = Projector(source, target, batch=7)  # several passes a drain
            try:
                await scenario(source, target, projector)
            finally:
                await projector.close()

    asyncio.run(main())


def test_each_jobs_newest_state_reaches_its_users_listing_and_topic(
    cluster: LocalCluster, db_url: str, pg: psycopg.Connection[Any], rest: Postgrest
) -> None:
    a, b = make_user(pg), make_user(pg)

    async def scenario(source: AsyncJetStreamStore, target: AsyncPostgresStore, projector: Projector) -> None:
        mine = await source.enqueue_many(
            [NewJob(type="embed", user_id=UUID(a), payload={"n": n}) for n in range(10)]
        )
        await source.enqueue(NewJob(type="embed", user_id=UUID(b)))
        assert await projector.drain() == 11
        assert {r["status"] for r in states(pg).values()} == {"queued"}
        listed = rest.select("jobkit_jobs", USER_COLUMNS, user_claims(a))
        assert sorted(r["id"] for r in listed) == sorted(str(r.id) for r in mine)  # RLS: a's own only
        assert {r["payload"]["n"] for r in listed} == set(range(10))

        calls = AsyncWorkerCalls(source)
        claimed = await claim_until(calls, ["embed"], 11)
        held = [(j.id, j.lease_token) for j in claimed[:5] if j.lease_token is not None]
        assert all((await calls.complete_many(held, {claimed[0].id: {"ok": 1}})).values())
        assert await projector.drain() == 11
        now = states(pg)
        assert sorted(r["status"] for r in now.values()) == ["running"] * 6 + ["succeeded"] * 5
        assert now[str(claimed[0].id)]["result"] == {"ok": 1}
        assert await projector.drain() == 0  # nothing new, nothing written

        # a record delivered again, or late, never moves a row back
        assert await target.run(project(target.dialect, [(claimed[0], 1)])) == set()
        assert states(pg)[str(claimed[0].id)]["status"] == "succeeded"

        # the user's live updates: each projected state of their job, on their topic only
        first = str(mine[0].id)
        sent = pg.execute(
            "select payload ->> 'status' as status from realtime.messages where topic = %s"
            " and payload ->> 'id' = %s order by inserted_at",
            (f"jobkit:user:{a}", first),
        ).fetchall()
        assert next(m["status"] for m in sent) == "queued" and len(sent) >= 2

    run(cluster, db_url, scenario)


def test_a_job_deleted_on_success_leaves_the_view_and_frees_its_key(
    cluster: LocalCluster, db_url: str, pg: psycopg.Connection[Any]
) -> None:
    """``delete_succeeded`` on JetStream, as on PostgreSQL: a job with no user is removed (its record
    emptied by the completion's compare-and-set, its key free again, its row deleted by the projection),
    a user's job kept, succeeded; a stale completion changes nothing."""
    a = make_user(pg)

    async def scenario(source: AsyncJetStreamStore, _: AsyncPostgresStore, projector: Projector) -> None:
        gone, kept = await source.enqueue_many(
            [NewJob(type="t", idempotency_key="k"), NewJob(type="t", user_id=UUID(a))]
        )
        assert await projector.drain() == 2
        calls = AsyncWorkerCalls(source)
        claimed = await claim_until(calls, ["t"], 2)
        held = [(j.id, j.lease_token) for j in claimed if j.lease_token is not None]
        assert all((await calls.complete_many(held, delete=True)).values())
        assert not any((await calls.complete_many(held, delete=True)).values())  # stale: nothing
        assert await source.get(gone.id) is None
        left = await source.get(kept.id)
        assert left is not None and left.status == JobStatus.SUCCEEDED
        assert await projector.drain() == 2
        assert {i: r["status"] for i, r in states(pg).items()} == {str(kept.id): "succeeded"}
        again = await source.enqueue(NewJob(type="t", idempotency_key="k"))
        assert again.inserted and again.id != gone.id

    run(cluster, db_url, scenario)


def test_a_record_the_database_refuses_is_passed_over_and_the_rest_written(
    cluster: LocalCluster, db_url: str, pg: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    a = make_user(pg)
    stranger = uuid4()  # not in this database's auth.users

    async def scenario(source: AsyncJetStreamStore, _: AsyncPostgresStore, projector: Projector) -> None:
        good = await source.enqueue_many([NewJob(type="t", user_id=UUID(a)) for _ in range(4)])
        bad = await source.enqueue(NewJob(type="t", user_id=stranger))
        with caplog.at_level(logging.WARNING, logger="pgjobkit.projector"):
            assert await projector.drain() == 4
        assert set(states(pg)) == {str(r.id) for r in good}
        assert f"job {bad.id} not projected" in caplog.text and "user_id" in caplog.text
        alone = await source.enqueue(NewJob(type="t", user_id=stranger))  # a batch of that one job
        assert await projector.drain() == 0 and f"job {alone.id} not projected" in caplog.text
        after = await source.enqueue(NewJob(type="t", user_id=UUID(a)))  # and the projection goes on
        assert await projector.drain() == 1 and str(after.id) in states(pg)
        # what another client with the cluster's rights may publish on a record's subject
        [wire] = await source.wires()
        await wire.js.publish(wire.layout.record(uuid4()), b'{"not": "a job"}')
        await wire.js.publish(f"{wire.layout.prefix}.job.not-an-id", b"")
        last = await source.enqueue(NewJob(type="t", user_id=UUID(a)))
        assert await projector.drain() == 1 and str(last.id) in states(pg)
        assert caplog.text.count("is not a job, passed over") == 2

    run(cluster, db_url, scenario, partitions=1)


def test_a_database_holding_a_projection_refuses_postgres_claims_reclaims_and_cancels(
    cluster: LocalCluster, db_url: str, pg: psycopg.Connection[Any], rest: Postgrest
) -> None:
    """A worker left on JOBKIT_DATABASE_URL alone must not run a JetStream job a second time: its claim is
    refused, naming the setting; so are a reclaim and a cancel of a projected job, the job's own user's
    included, and a user's enqueue (no worker would claim it). The database's own jobs can still be
    cancelled."""
    a = make_user(pg)

    async def scenario(source: AsyncJetStreamStore, target: AsyncPostgresStore, projector: Projector) -> None:
        [own] = await target.enqueue_many([NewJob(type="t")])  # the database's own, before the projection
        job = await source.enqueue(NewJob(type="t", user_id=UUID(a)))
        assert await projector.drain() == 1
        for fn, args in (
            ("jobkit_user_cancel", {"p_id": str(job.id)}),
            ("jobkit_user_enqueue", {"p_type": "t"}),  # a job no worker here would claim
            ("jobkit_user_enqueue_pipeline", {"p_jobs": [{"type": "t"}]}),
        ):
            with pytest.raises(PostgrestError) as refused:
                rest.rpc(fn, args, user_claims(a))
            assert refused.value.code == "JK004", fn
        calls = AsyncWorkerCalls(target)
        for call in (
            lambda: calls.claim(["t"], "w", LEASE, 5),
            calls.reclaim_expired,
            lambda: target.cancel([job.id]),
        ):
            with pytest.raises(
                ConfigurationError, match=r"view of a JetStream queue.*JOBKIT_NATS_URL"
            ) as info:
                await call()
            assert "apply jobkit's migration" not in str(info.value)
        assert (await target.cancel([own.id]))[0].cancelled
        assert states(pg)[str(job.id)]["status"] == "queued"  # unchanged

    run(cluster, db_url, scenario, partitions=1)


def test_pgjobkit_nats_project_moves_the_outbox_and_writes_the_queue_into_the_database(
    db_url: str, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    with LocalCluster(1) as one:
        view = {"JOBKIT_DATABASE_URL": db_url}
        assert run_cli("migrate", nats_url=one.url, cwd=tmp_path).returncode == 0
        for key in ("a", "b", "a"):
            done = run_cli("enqueue", "cli", "--key", key, nats_url=one.url, cwd=tmp_path)
            assert done.returncode == 0, done.stderr
        pg.execute(
            "select public.jobkit_outbox_enqueue(%s)", [Jsonb([{"type": "cli", "idempotency_key": "c"}])]
        )
        projected = run_cli("nats", "project", "--once", nats_url=one.url, cwd=tmp_path, env=view)
        assert projected.returncode == 0, projected.stderr
        assert projected.stdout.strip() == "1 job(s) moved from the outbox, 3 job(s) written"
        assert sorted(r["status"] for r in states(pg).values()) == ["queued"] * 3
        refused = run_cli("nats", "project", "--once", nats_url=one.url, cwd=tmp_path)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert "JOBKIT_DATABASE_URL" in refused.stderr and "Traceback" not in refused.stderr


def test_the_projection_writes_through_a_supabase_projects_api_as_the_service_role(
    cluster: LocalCluster, pg: psycopg.Connection[Any], router: SupabaseRouter, service_key: str
) -> None:
    """The target may be the Supabase project (SUPABASE_URL and its secret key): jobkit_project through
    PostgREST, as supabase-py sends it (the test router runs it as PostgREST v14 would)."""
    a = make_user(pg)

    async def main() -> None:
        target = SupabaseStore(BASE_URL, service_key).as_async()
        async with fresh_store(cluster) as source, target:
            await source.migrate()
            projector = Projector(source, target)
            try:
                jobs = await source.enqueue_many([NewJob(type="t", user_id=UUID(a)) for _ in range(3)])
                assert await projector.drain() == 3
                assert set(states(pg)) == {str(j.id) for j in jobs}
            finally:
                await projector.close()

    asyncio.run(main())
