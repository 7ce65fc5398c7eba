"""Every operation at its documented per-call limit, through the router under Supabase's statement
timeouts (8 s for service_role requests, tests/doubles/supabase_bootstrap.sql): each finishes, and each request
stays within PostgREST's max-rows. A statement past its timeout would fail these with 57014."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pgjobkit import UserJobs
from pgjobkit.core.models import JobStatus, NewJob
from pgjobkit.core.pipelines import Pipeline
from pgjobkit.stores.supabase import SupabaseStore
from pgjobkit.worker.calls import WorkerCalls
from tests.doubles.router import BASE_URL, PUBLISHABLE_KEY, SupabaseRouter, make_jwt
from tests.sql.helpers import make_user


@pytest.fixture
def store(router: SupabaseRouter, service_key: str) -> SupabaseStore:
    return SupabaseStore(BASE_URL, service_key)


def _calls(router: SupabaseRouter, fn: str) -> int:
    return sum(r.url.path.endswith(f"/rpc/{fn}") for r in router.requests)


def test_enqueue_many_of_10000_is_one_request(router: SupabaseRouter, store: SupabaseStore) -> None:
    out = store.enqueue_many(
        [NewJob(type="t", idempotency_key=f"k{i}", payload={"i": i}) for i in range(10_000)]
    )
    assert len(out) == 10_000 and all(o.inserted for o in out)
    assert _calls(router, "jobkit_enqueue_many_ids_json") == 1


def test_claim_999_then_complete_and_claim_at_the_cap(router: SupabaseRouter, store: SupabaseStore) -> None:
    store.enqueue_many([NewJob(type="t")] * 3000)
    jobs = WorkerCalls(store).claim(["t"], "w", timedelta(seconds=60), 999)
    assert len(jobs) == 999
    ok, more = WorkerCalls(store).complete_and_claim(
        [(j.id, j.lease_token or j.id) for j in jobs], ["t"], "w", timedelta(seconds=60), 999
    )
    assert all(ok.values()) and len(ok) == 999 and 0 < len(more) <= 999
    assert WorkerCalls(store).complete_many([(j.id, j.lease_token or j.id) for j in more]) == {
        j.id: True for j in more
    }


def test_prune_10000_per_call_and_requeue_1000_per_call(
    router: SupabaseRouter, store: SupabaseStore, pg: psycopg.Connection[Any]
) -> None:
    pg.execute("""
        insert into public.jobkit_jobs (type, status, attempts, claimed_by, error, created_at, updated_at)
        select 't', case when g <= 12000 then 'succeeded' else 'dead' end, 1, 'w', 'x',
               now() - interval '2 days', now() - interval '2 days'
        from generate_series(1, 14500) g""")
    assert store.prune(timedelta(days=1), statuses=[JobStatus.SUCCEEDED]) == 10_000
    assert store.prune(timedelta(days=1), statuses=[JobStatus.SUCCEEDED]) == 2000
    assert len(store.requeue()) == 2500
    assert _calls(router, "jobkit_requeue") == 3  # 1000, 1000, 500
    assert store.stats().count(JobStatus.QUEUED) == 2500


def test_pipelines_at_their_limits(
    router: SupabaseRouter, store: SupabaseStore, pg: psycopg.Connection[Any]
) -> None:
    """A pipeline of 10,000 jobs, one waiting for the other 9,999, in one request; its 10,000 rows read
    back in pages within max-rows; the fan-in handed 9,999 results in pages; a completion adding 1,000 jobs
    and one waiting for them; a pipeline of 10,001 jobs cancelled in one request."""
    p = Pipeline()
    p.add("fan_in", after=[p.add("t", {"i": i}) for i in range(9_999)], ref="in")
    made = store.enqueue_pipeline(p)
    assert made.pipeline_id is not None and len(made.jobs) == 10_000
    assert _calls(router, "jobkit_enqueue_pipeline") == 1
    pg.execute(
        "update public.jobkit_jobs set status = 'succeeded', attempts = 1, result = '{\"ok\": 1}' where type = 't'"
    )
    pg.execute(
        "select jobkit_private.release_waiters(array(select id from public.jobkit_jobs where type = 't'))"
    )
    assert store.get(made.ids["in"]).status == JobStatus.QUEUED  # type: ignore[union-attr]
    handed = store.list_dependencies(made.ids["in"])
    assert len(handed) == 9_999 and all(d.result == {"ok": 1} for d in handed)
    assert _calls(router, "jobkit_list_dependencies") == 10
    assert len(store.get_pipeline(made.pipeline_id)) == 10_000
    assert _calls(router, "jobkit_get_pipeline") == 11  # ten full pages, then an empty one
    calls = WorkerCalls(store)
    [job] = calls.claim(["fan_in"], "w", timedelta(seconds=60), 1)
    fan = Pipeline()
    fan.add("reindex", after=[fan.add("embed", {"n": n}) for n in range(1000)])
    assert job.lease_token is not None
    ok, added = calls.complete_adding(job.id, job.lease_token, None, fan)
    assert ok and len(added.jobs) == 1001
    assert store.cancel_pipeline(made.pipeline_id) == 1001  # the embeds and reindex, in one request


def test_a_user_pipeline_of_1000_under_the_user_timeout(
    router: SupabaseRouter, pg: psycopg.Connection[Any]
) -> None:
    """authenticated's statement timeout is 8 s too: a user's largest pipeline (1,000 jobs, 1,000 waits, at
    most 100 a job: 990 jobs and 10 that wait for 100 of them each), within its type's limits."""
    pg.execute(
        "insert into public.jobkit_user_types (type, max_live_per_user, max_created_per_user) values ('u', 1000, 1000)"
    )
    user = make_user(pg)
    me = UserJobs(BASE_URL, PUBLISHABLE_KEY, make_jwt("authenticated", sub=user))
    p = Pipeline()
    plain = [p.add("u", {"i": i}) for i in range(990)]
    for n in range(10):
        p.add("u", {"fan_in": n}, after=plain[n * 99 : n * 99 + 100])
    made = me.enqueue_pipeline(p)
    assert len(made.jobs) == 1000 and made.jobs[-1].status == JobStatus.WAITING
    me.close()
