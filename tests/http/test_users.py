"""UserJobs and SupabaseStore end to end: supabase-py's requests, through the test router, into real SQL."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pgjobkit import UserJobs
from pgjobkit.core.models import JobStatus, NewJob
from pgjobkit.errors import PermissionDenied
from pgjobkit.stores.supabase import SupabaseStore
from pgjobkit.worker.calls import WorkerCalls
from tests.doubles.router import BASE_URL, SupabaseRouter, make_jwt
from tests.sql.helpers import make_user


@pytest.fixture
def users(pg: psycopg.Connection[Any], router: SupabaseRouter, service_key: str) -> dict[str, Any]:
    a, b = uuid.UUID(make_user(pg)), uuid.UUID(make_user(pg))
    store = SupabaseStore(BASE_URL, service_key)
    jobs: dict[Any, list[uuid.UUID]] = {a: [], b: [], None: []}
    for owner, kind in [(a, "embed"), (a, "sync"), (a, "embed"), (b, "embed"), (None, "embed")]:
        jobs[owner].append(store.enqueue(NewJob(type=kind, user_id=owner)).id)
    store.close()
    return {"a": a, "b": b, "jobs": jobs}


def listing(user: uuid.UUID | None, anon_key: str) -> UserJobs:
    token = make_jwt("authenticated", sub=str(user)) if user else anon_key
    return UserJobs(BASE_URL, anon_key, token)


def test_user_sees_only_own_jobs(users: dict[str, Any], anon_key: str) -> None:
    a, b, jobs = users["a"], users["b"], users["jobs"]
    mine = listing(a, anon_key).list()
    assert sorted(j.id for j in mine) == sorted(jobs[a])
    assert {j.user_id for j in mine} == {a}
    assert [j.id for j in listing(b, anon_key).list()] == jobs[b]
    assert len(listing(a, anon_key).list(type="embed")) == 2
    assert listing(a, anon_key).list(status=JobStatus.SUCCEEDED) == []


def test_get_by_id_is_scoped_too(users: dict[str, Any], anon_key: str) -> None:
    a, b, jobs = users["a"], users["b"], users["jobs"]
    assert listing(a, anon_key).get(jobs[a][0]) is not None
    assert listing(a, anon_key).get(jobs[b][0]) is None
    assert listing(a, anon_key).get(jobs[None][0]) is None


def test_a_user_reads_progress_and_result_of_their_job(
    users: dict[str, Any], anon_key: str, service_key: str
) -> None:
    a, jobs = users["a"], users["jobs"]
    store = SupabaseStore(BASE_URL, service_key)
    [job] = [j for j in WorkerCalls(store).claim(["sync"], "w", timedelta(seconds=30), 5) if j.user_id == a]
    assert job.lease_token is not None
    WorkerCalls(store).progress([(job.id, job.lease_token, 0.4, "page 4 of 10")])
    view = listing(a, anon_key).get(job.id)
    assert view is not None and (view.status, view.progress, view.progress_message) == (
        JobStatus.RUNNING,
        0.4,
        "page 4 of 10",
    )
    assert WorkerCalls(store).complete(job.id, job.lease_token, {"pages": 10})
    done = listing(a, anon_key).get(job.id)
    assert done is not None and (done.status, done.progress, done.result) == (
        JobStatus.SUCCEEDED,
        1.0,
        {"pages": 10},
    )
    assert listing(users["b"], anon_key).get(job.id) is None  # nobody else's
    assert job.id in jobs[a]
    store.close()


def test_keyset_pages(users: dict[str, Any], anon_key: str, service_key: str) -> None:
    a = users["a"]
    store = SupabaseStore(BASE_URL, service_key)
    store.enqueue_many([NewJob(type="bulk", user_id=a)] * 7)  # one created_at for all seven
    store.close()
    view = listing(a, anon_key)
    seen: list[uuid.UUID] = []
    before = None
    while page := view.list(limit=4, before=before):
        seen += [j.id for j in page]
        before = (page[-1].created_at, page[-1].id)
    assert len(seen) == len(set(seen)) == 10


def test_anon_key_alone_sees_nothing(users: dict[str, Any], anon_key: str) -> None:
    with pytest.raises(PermissionDenied):
        listing(None, anon_key).list()


def test_user_token_cannot_call_worker_rpcs(users: dict[str, Any], anon_key: str) -> None:
    token = make_jwt("authenticated", sub=str(users["a"]))
    store = SupabaseStore(BASE_URL, token)
    with pytest.raises(PermissionDenied, match="lacks the rights") as info:
        WorkerCalls(store).claim(["embed"], "evil", timedelta(seconds=30))
    assert info.value.code == "42501"
    with pytest.raises(PermissionDenied):
        store.enqueue(NewJob(type="x"))
    store.close()


def test_forged_service_token_is_refused(router: SupabaseRouter) -> None:
    forged = make_jwt("service_role", secret="not-the-projects-secret-but-long-enough-1234")
    store = SupabaseStore(BASE_URL, forged)
    with pytest.raises(PermissionDenied) as info:
        store.stats()
    assert info.value.code == "PGRST301"
    store.close()


def test_worker_over_supabase_fails_at_once_without_service_rights(users: dict[str, Any]) -> None:
    from pgjobkit import Worker

    token = make_jwt("authenticated", sub=str(users["a"]))
    worker = Worker(SupabaseStore(BASE_URL, token, realtime=False), poll_interval=0.05)
    worker.register("embed", lambda p: None)
    with pytest.raises(PermissionDenied):
        worker.run(install_signals=False)


def test_requests_per_job_at_batch_20(router: SupabaseRouter, service_key: str) -> None:
    from pgjobkit import Worker

    store = SupabaseStore(BASE_URL, service_key, realtime=False)
    store.enqueue_many([NewJob(type="t")] * 100)
    worker = Worker(store, batch_size=20, concurrency=20)
    worker.register("t", lambda p: None)
    start = len(router.requests)
    for _ in range(5):
        assert worker.tick().count("succeeded") == 20
    # one claim-and-complete round trip per batch of 20, and the worker's one schema check at its start
    assert (len(router.requests) - start - 1) / 100 == pytest.approx(0.1)
    worker.close()
    store.close()
