"""The opt-in suite against a real Supabase stack (marker ``supabase``): the whole contract runs there too
(tests/contract/conftest.py adds the ``supabase-live`` store), and these cases need the real gateway,
GoTrue and Security Advisor. Set JOBKIT_SUPABASE_URL, JOBKIT_SUPABASE_SERVICE_KEY (sb_secret_...),
JOBKIT_SUPABASE_PUBLISHABLE_KEY (sb_publishable_...) and JOBKIT_SUPABASE_DB_URL from `supabase status` of a
dev stack with jobkit's migration pushed, then `scripts/test.sh -m supabase`. It empties jobkit_jobs."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from datetime import UTC, datetime

import httpx
import psycopg
import pytest

from pgjobkit import AsyncSupabaseStore, AsyncUserJobs, RunSummary, UserJobs, Worker, current
from pgjobkit.core.models import Job, JobStatus, NewJob
from pgjobkit.core.pipelines import Pipeline
from pgjobkit.errors import InvalidArgument, LimitReached, PermissionDenied
from pgjobkit.ops.projection import outbox_done, outbox_enqueue, outbox_take, project
from pgjobkit.stores.supabase import SupabaseStore
from pgjobkit.version import SCHEMA_VERSION
from supabase import create_client
from tests.contract.conftest import LIVE_ENV, STORES
from tests.doubles import pgtemplate

pytestmark = pytest.mark.supabase
MISSING = [n for n in (*LIVE_ENV, "JOBKIT_SUPABASE_PUBLISHABLE_KEY") if not os.environ.get(n)]
live = pytest.mark.skipif(bool(MISSING), reason="the real-Supabase suite is opt-in (see module doc)")


def test_real_supabase_contract_is_opt_in() -> None:
    if MISSING:
        pytest.skip(
            f"real-Supabase suite not run: set {', '.join(MISSING)} (from `supabase status` of a dev stack "
            "with jobkit's migration pushed; the suite empties its jobkit_jobs) and run "
            "`scripts/test.sh -m supabase`"
        )
    assert any(getattr(p, "values", None) == ("supabase-live",) for p in STORES)


def _signed_in_user() -> tuple[uuid.UUID, str]:
    """A new GoTrue user and its access token (signed by the stack's own keys, ES256 on new stacks)."""
    url, secret = os.environ["JOBKIT_SUPABASE_URL"], os.environ["JOBKIT_SUPABASE_SERVICE_KEY"]
    email, password = f"jobkit-{uuid.uuid4().hex[:10]}@example.test", uuid.uuid4().hex
    admin = create_client(url, secret)
    user = admin.auth.admin.create_user({"email": email, "password": password, "email_confirm": True}).user
    anon = create_client(url, os.environ["JOBKIT_SUPABASE_PUBLISHABLE_KEY"])
    session = anon.auth.sign_in_with_password({"email": email, "password": password}).session
    assert session is not None
    return uuid.UUID(user.id), session.access_token


@live
def test_a_real_user_sees_only_their_jobs() -> None:
    store = SupabaseStore(os.environ["JOBKIT_SUPABASE_URL"], os.environ["JOBKIT_SUPABASE_SERVICE_KEY"])
    user, token = _signed_in_user()
    mine = store.enqueue(NewJob(type="live", user_id=user)).id
    store.enqueue(NewJob(type="live"))
    view = UserJobs(os.environ["JOBKIT_SUPABASE_URL"], os.environ["JOBKIT_SUPABASE_PUBLISHABLE_KEY"], token)
    assert [j.id for j in view.list(type="live")] == [mine]
    with pytest.raises(PermissionDenied):
        SupabaseStore(os.environ["JOBKIT_SUPABASE_URL"], token).stats()  # a user token is no worker key
    store.close()


@live
def test_the_stack_holds_this_jobkits_schema() -> None:
    """What a worker checks at start, through PostgREST: the pushed migrations are 0.2.0's."""
    store = SupabaseStore(os.environ["JOBKIT_SUPABASE_URL"], os.environ["JOBKIT_SUPABASE_SERVICE_KEY"])
    assert store.schema_version() == SCHEMA_VERSION
    store.close()


@live
def test_a_revoked_secret_key_is_refused() -> None:
    with pytest.raises(PermissionDenied):
        SupabaseStore(os.environ["JOBKIT_SUPABASE_URL"], "sb_secret_revoked0000000000000000").stats()


@live
def test_the_real_advisor_is_clean_apart_from_pg_graphql() -> None:
    url = os.environ["JOBKIT_SUPABASE_DB_URL"]
    with psycopg.connect(url) as conn:
        assert conn.execute("select to_regclass('public.jobkit_jobs') is not null").fetchone() == (True,)
    result = pgtemplate.supabase(
        "db", "advisors", "--db-url", url, "--type", "all", "--level", "warn", "--output-format", "json"
    )
    found = json.loads(result.stdout)["results"] if result.stdout.strip() else []
    ours = [r for r in found if "jobkit" in r["detail"] and not r["name"].startswith("pg_graphql_")]
    assert result.returncode == 0 and ours == [], result.stdout


@live
def test_the_async_worker_and_listing_on_the_real_api() -> None:
    url, key = os.environ["JOBKIT_SUPABASE_URL"], os.environ["JOBKIT_SUPABASE_SERVICE_KEY"]
    user, token = _signed_in_user()

    async def main() -> tuple[RunSummary, list[uuid.UUID]]:
        async with AsyncSupabaseStore(url, key) as store:
            await store.enqueue_many([NewJob(type="live-async", user_id=user)] * 200)
            worker = Worker(store, poll_interval=0.1)

            @worker.handler("live-async")
            async def wait(payload: dict[str, object]) -> None:
                await asyncio.sleep(0.05)

            summary = await worker.arun(install_signals=False, until_empty=True)
            await worker.aclose()
        view = AsyncUserJobs(url, os.environ["JOBKIT_SUPABASE_PUBLISHABLE_KEY"], token)
        try:
            return summary, [j.id for j in await view.list(type="live-async", status="succeeded", limit=500)]
        finally:
            await view.close()

    summary, listed = asyncio.run(main())
    assert (summary.claimed, summary.succeeded) == (200, 200)
    assert len(listed) == 200


@live
def test_quick_jobs_claimed_ahead_over_the_real_api_each_run_once() -> None:
    """No-op jobs run quick, so the worker keeps several claim round trips in flight through the real
    gateway and PostgREST (pgjobkit.worker.exchange): every job runs exactly once and ends succeeded."""
    url, key = os.environ["JOBKIT_SUPABASE_URL"], os.environ["JOBKIT_SUPABASE_SERVICE_KEY"]
    ran: list[int] = []

    async def main() -> RunSummary:
        async with AsyncSupabaseStore(url, key) as store:
            await store.enqueue_many([NewJob(type="live-quick", payload={"n": i}) for i in range(1000)])
            worker = Worker(store, poll_interval=0.1, concurrency=10, batch_size=10)

            @worker.handler("live-quick")
            async def quick(payload: dict[str, int]) -> None:
                ran.append(payload["n"])

            summary = await worker.arun(install_signals=False, until_empty=True)
            await worker.aclose()
            return summary

    summary = asyncio.run(main())
    assert (summary.claimed, summary.succeeded) == (1000, 1000)
    assert sorted(ran) == list(range(1000))


@live
def test_a_real_user_starts_and_cancels_their_own_job() -> None:
    url, secret = os.environ["JOBKIT_SUPABASE_URL"], os.environ["JOBKIT_SUPABASE_SERVICE_KEY"]
    create_client(url, secret).table("jobkit_user_types").upsert(
        {"type": "live-user", "max_live_per_user": 5}
    ).execute()
    user, token = _signed_in_user()
    me = UserJobs(url, os.environ["JOBKIT_SUPABASE_PUBLISHABLE_KEY"], token)
    started = me.enqueue("live-user", {"n": 1}, idempotency_key="one")
    assert started.inserted and started.job.user_id == user
    assert me.cancel(started.job.id).cancelled
    with pytest.raises(InvalidArgument):
        me.enqueue("live")  # not open to users
    me.close()


@live
def test_a_real_user_watches_their_job_over_real_realtime() -> None:
    url, secret = os.environ["JOBKIT_SUPABASE_URL"], os.environ["JOBKIT_SUPABASE_SERVICE_KEY"]
    user, token = _signed_in_user()
    store = SupabaseStore(url, secret)

    async def main() -> JobStatus:
        jobs = AsyncUserJobs(url, os.environ["JOBKIT_SUPABASE_PUBLISHABLE_KEY"], token)
        watching = jobs.watch()
        first = asyncio.ensure_future(anext(watching))
        await asyncio.sleep(3)  # joined by then on a local stack
        await asyncio.to_thread(store.enqueue, NewJob(type="live-watch", user_id=user))
        update = await asyncio.wait_for(first, 15)
        await watching.aclose()  # type: ignore[attr-defined]
        await jobs.close()
        return update.status

    assert asyncio.run(main()) == JobStatus.QUEUED
    store.close()


@live
def test_a_real_user_cannot_store_what_a_worker_cannot_read_nor_exceed_their_limits() -> None:
    """Through the real gateway and PostgREST: supabase-js's raw JSON, as any client may send it, with a
    number Python refuses; a loop of enqueue and cancel stops at the type's creation limit."""
    url, secret = os.environ["JOBKIT_SUPABASE_URL"], os.environ["JOBKIT_SUPABASE_SERVICE_KEY"]
    publishable = os.environ["JOBKIT_SUPABASE_PUBLISHABLE_KEY"]
    create_client(url, secret).table("jobkit_user_types").upsert(
        {"type": "live-hostile", "max_live_per_user": 5, "max_created_per_user": 3, "per_seconds": 3600}
    ).execute()
    _, token = _signed_in_user()
    answer = httpx.post(
        f"{url}/rest/v1/rpc/jobkit_user_enqueue",
        content=b'{"p_type": "live-hostile", "p_payload": {"n": 1e4300}}',
        headers={
            "apikey": publishable,
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
        },
    )
    assert answer.status_code == 400 and answer.json()["code"] == "23514", answer.text
    me = UserJobs(url, publishable, token)
    for _ in range(3):
        me.cancel(me.enqueue("live-hostile", {}).job.id)
    with pytest.raises(LimitReached):
        me.enqueue("live-hostile", {})
    me.close()


@live
def test_a_real_user_s_pipeline_fans_in_on_a_worker_over_the_real_api() -> None:
    """A user starts transcribe → summarize; a worker on the real Data API runs both, the second handed
    the first's result; the user reads the pipeline's progress, and another user reads nothing of it."""
    url, secret = os.environ["JOBKIT_SUPABASE_URL"], os.environ["JOBKIT_SUPABASE_SERVICE_KEY"]
    publishable = os.environ["JOBKIT_SUPABASE_PUBLISHABLE_KEY"]
    admin = create_client(url, secret)
    for type_ in ("live-transcribe", "live-summarize"):
        admin.table("jobkit_user_types").upsert({"type": type_, "max_live_per_user": 5}).execute()
    _, token = _signed_in_user()
    _, other_token = _signed_in_user()
    me, other = UserJobs(url, publishable, token), UserJobs(url, publishable, other_token)
    p = Pipeline()
    p.add("live-summarize", after=p.add("live-transcribe", {"upload": "a.mp3"}))
    e = me.enqueue_pipeline(p)
    assert e.pipeline_id is not None
    handed: list[object] = []
    worker = Worker(SupabaseStore(url, secret), schedules=False, poll_interval=0.1)
    worker.register("live-transcribe", lambda payload: {"text": "hello"})
    worker.register(
        "live-summarize", lambda payload: handed.extend(d.result for d in current().dependencies())
    )
    worker.run(until_empty=True, install_signals=False)
    assert handed == [{"text": "hello"}]
    progress = me.pipeline_progress(e.pipeline_id)
    assert progress is not None and (progress.total, progress.succeeded) == (2, 2)
    assert other.pipeline_progress(e.pipeline_id) is None
    me.close()
    other.close()


@live
def test_a_projected_job_reaches_its_real_user_and_the_projection_is_removed_after() -> None:
    """jobkit_project through the real gateway and PostgREST (what ``pgjobkit nats project`` sends when
    SUPABASE_URL is its target): the job is its user's to read; a second, older version changes nothing.
    The stack is left as it was (no row in jobkit_projected: it would make it a view)."""
    url, secret = os.environ["JOBKIT_SUPABASE_URL"], os.environ["JOBKIT_SUPABASE_SERVICE_KEY"]
    user, token = _signed_in_user()
    store = SupabaseStore(url, secret)
    now = datetime.now(UTC)
    job = Job(
        id=uuid.uuid4(), user_id=user, type="live-projected", status=JobStatus.QUEUED, payload={"n": 1},
        attempts=0, max_attempts=3, priority=0, run_after=now, created_at=now, updated_at=now,
    )  # fmt: skip
    try:
        assert store.run(project(store.dialect, [(job, 5)])) == {job.id}
        stale = job.model_copy(update={"status": JobStatus.CANCELLED})
        assert store.run(project(store.dialect, [(stale, 4)])) == set()
        me = UserJobs(url, os.environ["JOBKIT_SUPABASE_PUBLISHABLE_KEY"], token)
        seen = me.get(job.id)
        assert seen is not None and seen.status == JobStatus.QUEUED
        me.close()
    finally:
        admin = create_client(url, secret)
        admin.table("jobkit_projected").delete().eq("job_id", str(job.id)).execute()
        admin.table("jobkit_jobs").delete().eq("id", str(job.id)).execute()
        store.close()


@live
def test_the_outbox_takes_a_job_through_the_real_api_and_refuses_one_without_a_key() -> None:
    """jobkit_outbox_enqueue as the service role through the real gateway and PostgREST, then taken and
    removed as the relay does; the stack's outbox is left as it was."""
    url, secret = os.environ["JOBKIT_SUPABASE_URL"], os.environ["JOBKIT_SUPABASE_SERVICE_KEY"]
    key = f"live-outbox-{uuid.uuid4().hex[:8]}"
    store = SupabaseStore(url, secret)
    [seq] = store.run(outbox_enqueue([NewJob(type="live", idempotency_key=key)]))
    try:
        taken = dict(store.run(outbox_take(1000)))
        assert taken[seq]["idempotency_key"] == key and taken[seq]["type"] == "live"
        with pytest.raises(InvalidArgument, match="idempotency_key is required"):
            store.run(outbox_enqueue([NewJob(type="live")]))
    finally:
        assert store.run(outbox_done([seq], [None])) == 1
        store.close()
