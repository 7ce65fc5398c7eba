"""Every operation at its documented per-call limit, through the router under Supabase's statement
timeouts (8 s for service_role requests, tests/doubles/supabase_bootstrap.sql): each finishes, and each request
stays within PostgREST's max-rows. A statement past its timeout would fail these with 57014."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pgjobkit.core.models import JobStatus, NewJob
from pgjobkit.stores.supabase import SupabaseStore
from pgjobkit.worker.calls import WorkerCalls
from tests.doubles.router import BASE_URL, SupabaseRouter


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
    assert _calls(router, "jobkit_enqueue_many_json") == 1


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
