"""A signed-in user's pipelines through supabase-py and the test router into real SQL, under both of
Supabase's default-privilege modes: they start one of open types, within their limits, waiting only for
their own jobs; read its progress and tree and what a job waits for; cancel it; and see it live on their
private Realtime topic. Another user sees none of it and can cancel none of it."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pgjobkit import AsyncUserJobs, JobNotFound, JobStatus, LimitReached, NewJob, PostgresStore, UserJobs
from pgjobkit.core.pipelines import Pipeline
from pgjobkit.errors import InvalidArgument
from pgjobkit.stores.supabase.realtime import JobUpdate, user_topic
from pgjobkit.worker.calls import WorkerCalls
from tests.doubles.postgrest import Postgrest, PostgrestError
from tests.doubles.realtime_server import realtime_server
from tests.doubles.router import BASE_URL, PUBLISHABLE_KEY, SupabaseRouter, make_jwt
from tests.sql.helpers import make_user, user_claims

pytestmark = pytest.mark.parametrize("db_name", ["current", "legacy"], indirect=True)


@pytest.fixture
def user(pg: psycopg.Connection[Any], router: SupabaseRouter) -> uuid.UUID:
    pg.execute("insert into public.jobkit_user_types (type, max_live_per_user) values ('transcribe', 3)")
    pg.execute("insert into public.jobkit_user_types (type) values ('summarize')")
    return uuid.UUID(make_user(pg))


def as_user(user: uuid.UUID | str) -> UserJobs:
    return UserJobs(BASE_URL, PUBLISHABLE_KEY, make_jwt("authenticated", sub=str(user)))


def _two_steps() -> Pipeline:
    p = Pipeline()
    t = p.add("transcribe", {"upload": "a.mp3"}, idempotency_key="a.mp3")
    p.add("summarize", after=t, ref="s")
    return p


def test_a_user_runs_and_reads_their_own_pipeline(
    user: uuid.UUID, db_url: str, pg: psycopg.Connection[Any]
) -> None:
    me, other = as_user(user), as_user(make_user(pg))
    e = me.enqueue_pipeline(_two_steps())
    assert e.pipeline_id is not None
    assert [j.status for j in e.jobs] == [JobStatus.QUEUED, JobStatus.WAITING]
    assert all(me.get(j.id) is not None and me.get(j.id).user_id == user for j in e.jobs)  # type: ignore[union-attr]
    with PostgresStore(db_url) as store:  # the app's worker runs the first step
        calls = WorkerCalls(store)
        [job] = calls.claim(["transcribe"], "w", timedelta(seconds=30), 1)
        assert job.lease_token is not None and calls.complete(job.id, job.lease_token, {"text": "hi"})
    progress = me.pipeline_progress(e.pipeline_id)
    assert progress is not None and (progress.total, progress.succeeded, progress.queued) == (2, 1, 1)
    tree = me.get_pipeline(e.pipeline_id)
    assert [t.type for t in tree] == ["transcribe", "summarize"] and list(tree[1].depends_on) == [
        e.jobs[0].id
    ]
    [dep] = me.dependencies(e.ids["s"])
    assert dep.result == {"text": "hi"} and dep.outcome == JobStatus.SUCCEEDED
    # another user sees nothing of it and cancels nothing of it
    assert other.pipeline_progress(e.pipeline_id) is None and other.get_pipeline(e.pipeline_id) == []
    assert other.dependencies(e.ids["s"]) == []
    with pytest.raises(JobNotFound):
        other.cancel_pipeline(e.pipeline_id)
    assert me.cancel_pipeline(e.pipeline_id) == 1
    assert me.get(e.ids["s"]).status == JobStatus.CANCELLED  # type: ignore[union-attr]
    me.close()
    other.close()


def test_a_user_pipeline_keeps_to_the_user_s_rules(
    user: uuid.UUID, db_url: str, pg: psycopg.Connection[Any]
) -> None:
    me = as_user(user)
    closed = Pipeline()
    closed.add("embed")
    with pytest.raises(InvalidArgument, match="job 0: jobs of type 'embed' cannot be started by users"):
        me.enqueue_pipeline(closed)
    extra = Pipeline()
    extra.add("transcribe", priority=5)
    with pytest.raises(InvalidArgument, match="job 0: has an unknown key"):
        me.enqueue_pipeline(extra)
    four = Pipeline()
    first = four.add("transcribe")
    for _ in range(3):
        four.add("transcribe", after=first)  # waiting jobs count as live: 4 > 3
    with pytest.raises(LimitReached, match="at most 3 live jobs of type transcribe"):
        me.enqueue_pipeline(four)
    with PostgresStore(db_url) as store:  # the app's job, and another user's: neither may be waited for
        app_job = store.enqueue(NewJob(type="transcribe")).id
    theirs = as_user(make_user(pg)).enqueue("transcribe").job.id
    for foreign in (app_job, theirs):
        p = Pipeline()
        p.add("summarize", after=foreign)
        with pytest.raises(JobNotFound, match="does not exist"):
            me.enqueue_pipeline(p)
    assert me.list() == []  # nothing half-written
    mine = me.enqueue("transcribe").job.id
    p = Pipeline()
    p.add("summarize", after=mine)  # their own job, yes
    assert me.enqueue_pipeline(p).jobs[0].status == JobStatus.WAITING
    me.close()


def test_a_user_sees_their_pipeline_live(user: uuid.UUID, db_url: str) -> None:
    with realtime_server(db_url) as server:

        async def main() -> list[JobUpdate]:
            me = AsyncUserJobs(
                BASE_URL, PUBLISHABLE_KEY, make_jwt("authenticated", sub=str(user)), realtime_url=server.url
            )
            watching = me.watch()
            first = asyncio.ensure_future(anext(watching))
            while not any(t == user_topic(user) and ok for t, ok in server.joins):
                await asyncio.sleep(0.01)
            e = await me.enqueue_pipeline(_two_steps())
            seen = [await asyncio.wait_for(first, 5)]
            seen.append(await asyncio.wait_for(anext(watching), 5))
            assert e.pipeline_id is not None
            await me.cancel_pipeline(e.pipeline_id)
            seen.append(await asyncio.wait_for(anext(watching), 5))
            seen.append(await asyncio.wait_for(anext(watching), 5))
            await watching.aclose()  # type: ignore[attr-defined]
            await me.close()
            return seen

        seen = asyncio.run(main())
    pipeline = {u.pipeline_id for u in seen}
    assert len(pipeline) == 1 and None not in pipeline
    assert sorted((u.type, u.status) for u in seen) == [
        ("summarize", JobStatus.CANCELLED),
        ("summarize", JobStatus.WAITING),
        ("transcribe", JobStatus.CANCELLED),
        ("transcribe", JobStatus.QUEUED),
    ]


def test_an_attacker_with_a_session_reaches_nothing_of_another_s_pipeline(
    user: uuid.UUID, pg: psycopg.Connection[Any], rest: Postgrest
) -> None:
    """Another signed-in user reads the pipeline tables directly (RLS shows them none of its rows), names
    its jobs as their own dependencies (no such job), and tries the keys a user's job may not carry: an
    owner, a status, a priority (each refused by name, nothing written)."""
    e = as_user(user).enqueue_pipeline(_two_steps())
    attacker = make_user(pg)
    claims = user_claims(attacker)
    for table in ("jobkit_pipeline_jobs", "jobkit_dependencies"):
        assert rest.select(table, ["job_id"], claims) == []
        assert len(rest.select(table, ["job_id"], user_claims(str(user)))) >= 1  # the owner sees theirs
    me = as_user(attacker)
    steal = Pipeline()
    steal.add("summarize", after=e.jobs[0].id)
    with pytest.raises(JobNotFound, match="does not exist"):
        me.enqueue_pipeline(steal)
    for key, value in (("user_id", str(user)), ("waiting", True), ("priority", 9), ("status", "running")):
        with pytest.raises(PostgrestError, match="job 0: has an unknown key") as refused:
            rest.rpc("jobkit_user_enqueue_pipeline", {"p_jobs": [{"type": "transcribe", key: value}]}, claims)
        assert refused.value.code == "JK001"
    assert me.list() == [] and me.pipeline_progress(e.pipeline_id) is None  # type: ignore[arg-type]
    me.close()
