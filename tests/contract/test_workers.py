"""Seeing the queue on every store: trace context kept on the job, the queue's depth, workers' beats and
their activity by the minute."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pgjobkit.core.models import JobStatus, NewJob
from pgjobkit.core.workers import Activity
from pgjobkit.errors import InvalidArgument
from pgjobkit.stores.base import JobStore
from pgjobkit.worker.calls import WorkerCalls
from tests.contract.conftest import Harness

LEASE = timedelta(seconds=30)
TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "k=v"}


def test_the_trace_context_is_kept_beside_the_jobs_it_was_enqueued_with(store: JobStore) -> None:
    one = store.enqueue(NewJob(type="t", trace_context=TRACE))
    many = store.enqueue_many([NewJob(type="t", trace_context=TRACE), NewJob(type="t")])
    keyed = store.enqueue(NewJob(type="t", idempotency_key="k", trace_context={"traceparent": "first"}))
    again = store.enqueue(NewJob(type="t", idempotency_key="k", trace_context={"traceparent": "second"}))
    assert not again.inserted
    claimed = WorkerCalls(store).claim(["t"], "w", LEASE, 10)
    assert len(claimed) == 4
    contexts = store.trace_contexts([j.id for j in claimed])
    assert contexts == {one.id: TRACE, many[0].id: TRACE, keyed.id: {"traceparent": "first"}}
    assert store.trace_contexts([]) == {}


def test_a_trace_context_that_is_not_a_small_object_of_strings_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="trace_context"):
        NewJob(type="t", trace_context={"traceparent": 5})  # type: ignore[dict-item]
    with pytest.raises(InvalidArgument, match="trace_context must be at most 1024 bytes"):
        NewJob(type="t", trace_context={"tracestate": "x" * 1100})


def test_queue_depth_counts_unfinished_jobs_by_type_and_status(store: JobStore) -> None:
    store.enqueue_many([NewJob(type="a") for _ in range(3)] + [NewJob(type="b", delay=timedelta(hours=1))])
    [running] = WorkerCalls(store).claim(["a"], "w", LEASE, 1)
    [done] = WorkerCalls(store).claim(["a"], "w", LEASE, 1)
    assert WorkerCalls(store).complete(done.id, done.lease_token)  # type: ignore[arg-type]
    depth = {(d.type, d.status): d for d in store.queue_depth()}
    assert {k: d.jobs for k, d in depth.items()} == {
        ("a", JobStatus.QUEUED): 1,
        ("a", JobStatus.RUNNING): 1,
        ("b", JobStatus.QUEUED): 1,
    }
    assert depth[("b", JobStatus.QUEUED)].oldest_seconds is None  # not runnable yet
    oldest = depth[("a", JobStatus.QUEUED)].oldest_seconds
    assert oldest is not None and oldest >= 0
    assert running.id != done.id


def test_a_worker_beats_is_listed_holding_its_jobs_and_goes_when_it_stops(store: JobStore) -> None:
    store.enqueue_many([NewJob(type="a") for _ in range(2)])
    WorkerCalls(store).claim(["a"], "w1", LEASE, 2)
    assert store.worker_beat("w1", host="h", pid=7, version="0.5.0", types=["a"], concurrency=4) == 0
    [w] = store.list_workers()
    assert (w.name, w.host, w.pid, w.version, w.types, w.concurrency, w.alive, w.holding) == (
        "w1",
        "h",
        7,
        "0.5.0",
        ("a",),
        4,
        True,
        2,
    )
    first_beat = w.heartbeat_at
    store.worker_beat("w1", types=["a"])
    [again] = store.list_workers()
    assert again.started_at == w.started_at and again.heartbeat_at >= first_beat
    assert store.worker_stop("w1") is True
    assert store.worker_stop("w1") is False
    assert store.list_workers() == []


def test_a_vanished_worker_is_pruned_by_another_workers_beat(store: JobStore, harness: Harness) -> None:
    store.worker_beat("gone", stale_seconds=1)
    harness.age_flow(timedelta(seconds=5))
    [w] = store.list_workers()
    assert not w.alive
    assert store.worker_beat("alive") == 1
    assert [w.name for w in store.list_workers()] == ["alive"]


def test_activity_adds_up_across_beats_and_workers(store: JobStore) -> None:
    now = datetime.now(UTC)
    a, b = Activity(), Activity()
    a.add(now.timestamp(), "embed", "succeeded", run=2.0, wait=0.5)
    a.add(now.timestamp(), "embed", "succeeded", run=4.0, wait=1.5)
    b.add(now.timestamp(), "embed", "succeeded", run=1.0, wait=3.0)
    b.add(now.timestamp(), "embed", "dead", run=0.1, wait=0.0)
    store.worker_beat("w1", activity=a.take())
    store.worker_beat("w2", activity=b.take())
    assert not a and not b
    rows = {(r.type, r.outcome): r for r in store.activity(now - timedelta(minutes=5))}
    ok = rows[("embed", "succeeded")]
    assert (ok.jobs, ok.run_seconds, ok.run_max, ok.wait_seconds, ok.wait_max) == (3, 7.0, 4.0, 5.0, 3.0)
    assert ok.minute == now.replace(second=0, microsecond=0)
    assert rows[("embed", "dead")].jobs == 1
    assert store.activity(now + timedelta(minutes=5)) == []


@pytest.mark.parametrize(
    ("activity", "problem"),
    [
        ([{"minute": "x"}], "minute"),
        ([1], "must be a JSON object"),
        (
            [{"minute": "2020-01-01T00:00:00+00:00", "type": "t", "outcome": "lost"}],
            "jobs, run_seconds",
        ),
        (
            [
                {
                    "minute": "2020-01-01T00:00:00+00:00",
                    "type": "t",
                    "outcome": "won",
                    "jobs": 1,
                    "run_seconds": 0,
                    "run_max": 0,
                    "wait_seconds": 0,
                    "wait_max": 0,
                }
            ],
            "outcome must be",
        ),
    ],
)
def test_a_beat_refuses_bad_activity_and_changes_nothing(
    store: JobStore, activity: list[object], problem: str
) -> None:
    with pytest.raises(InvalidArgument, match=problem):
        store.worker_beat("w", activity=activity)  # type: ignore[arg-type]
    assert store.list_workers() == []
    with pytest.raises(InvalidArgument, match="p_worker"):
        store.worker_beat("")
