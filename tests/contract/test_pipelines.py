"""Pipelines, the JobStore contract: every store passes exactly these tests (jobs that wait for jobs,
fan-out from a completion, results handed on, failure and cancel policies, batches)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest

from pgjobkit.core.models import Job, JobStatus, NewJob
from pgjobkit.core.pipelines import After, Pipeline, outcomes
from pgjobkit.errors import InvalidArgument, JobNotFound
from pgjobkit.stores.base import JobStore
from pgjobkit.worker.calls import WorkerCalls
from tests.contract.conftest import Harness

LEASE = timedelta(seconds=30)


def run(store: JobStore, type: str, result: Any = None, limit: int = 100) -> list[Job]:
    """Claim every runnable job of ``type`` and complete each with ``result``."""
    calls = WorkerCalls(store)
    jobs = calls.claim([type], "w1", LEASE, limit)
    if jobs:
        done = [(j.id, j.lease_token) for j in jobs if j.lease_token is not None]
        ok = calls.complete_many(done, {j.id: result for j in jobs} if result is not None else None)
        assert all(ok.values())
    return jobs


def kill(store: JobStore, job: Job) -> None:
    """Fail ``job`` (claimed) for good."""
    assert job.lease_token is not None
    assert WorkerCalls(store).fail(job.id, job.lease_token, "boom", timedelta(0), permanent=True).ok


def status(store: JobStore, job_id: UUID) -> JobStatus:
    job = store.get(job_id)
    assert job is not None
    return job.status


def test_a_job_waits_until_every_job_it_waits_for_succeeded(store: JobStore) -> None:
    p = Pipeline()
    a, b = p.add("embed", {"n": 1}), p.add("embed", {"n": 2})
    p.add("reindex", after=[a, b], ref="r")
    e = store.enqueue_pipeline(p)
    ids = e.ids
    assert [j.status for j in e.jobs] == [JobStatus.QUEUED, JobStatus.QUEUED, JobStatus.WAITING]
    assert all(j.inserted for j in e.jobs) and e.pipeline_id is not None
    assert {store.pipeline_of(i) for i in ids.values()} == {e.pipeline_id}
    assert store.pipeline_of(store.enqueue(NewJob(type="alone")).id) is None
    assert store.pipeline_of(uuid4()) is None
    assert run(store, "reindex") == []  # not runnable while it waits
    calls = WorkerCalls(store)
    [first] = calls.claim(["embed"], "w1", LEASE, 1)
    assert first.lease_token is not None
    assert calls.complete(first.id, first.lease_token, {"v": 1})
    assert status(store, ids["r"]) == JobStatus.WAITING  # one of two
    run(store, "embed", {"v": 2})
    assert status(store, ids["r"]) == JobStatus.QUEUED  # freed by the completion that ended the last
    [reindex] = run(store, "reindex")
    deps = store.list_dependencies(reindex.id)
    assert [d.id for d in deps] == [ids[a], ids[b]] and [d.position for d in deps] == [0, 1]
    assert [d.result for d in deps] == [
        {"v": 1} if first.id == ids[a] else {"v": 2},
        {"v": 2} if first.id == ids[a] else {"v": 1},
    ]
    assert all(d.outcome == JobStatus.SUCCEEDED and d.type == "embed" for d in deps)


def test_a_chain_runs_in_order_through_the_worker_completion_in_the_claim(store: JobStore) -> None:
    p = Pipeline()
    prev = p.add("step", {"i": 0})
    for i in range(1, 4):
        prev = p.add("step", {"i": i}, after=prev)
    store.enqueue_pipeline(p)
    calls, order = WorkerCalls(store), []
    jobs = calls.claim(["step"], "w1", LEASE, 10)
    while jobs:
        assert len(jobs) == 1
        order.append(jobs[0].payload["i"])
        assert jobs[0].lease_token is not None
        _, jobs = calls.complete_and_claim([(jobs[0].id, jobs[0].lease_token)], ["step"], "w1", LEASE, 10)
    assert order == [0, 1, 2, 3]


def test_a_dead_job_cancels_what_waits_for_it_down_the_graph(store: JobStore) -> None:
    p = Pipeline()
    a = p.add("embed")
    b = p.add("reindex", after=a)
    c = p.add("notify", after=b)
    ids = store.enqueue_pipeline(p).ids
    [job] = WorkerCalls(store).claim(["embed"], "w1", LEASE, 1)
    kill(store, job)
    assert status(store, ids[b]) == JobStatus.CANCELLED and status(store, ids[c]) == JobStatus.CANCELLED
    cancelled = store.get(ids[b])
    assert cancelled is not None and cancelled.error is not None and str(ids[a]) in cancelled.error


def test_run_anyway_runs_after_a_dead_job_and_sees_how_each_ended(store: JobStore) -> None:
    p = Pipeline()
    a, b = p.add("embed"), p.add("embed")
    r = p.add("reindex", after=[After(a, "run"), b])
    ids = store.enqueue_pipeline(p).ids
    calls = WorkerCalls(store)
    first, second = calls.claim(["embed"], "w1", LEASE, 2)
    dead, alive = (first, second) if first.id == ids[a] else (second, first)
    kill(store, dead)
    assert status(store, ids[r]) == JobStatus.WAITING
    assert alive.lease_token is not None and calls.complete(alive.id, alive.lease_token, {"ok": True})
    [reindex] = run(store, "reindex")
    deps = store.list_dependencies(reindex.id)
    assert [(d.outcome, d.on_failure) for d in deps] == [
        (JobStatus.DEAD, "run"),
        (JobStatus.SUCCEEDED, "cancel"),
    ]
    assert outcomes(deps) == Counter({JobStatus.DEAD: 1, JobStatus.SUCCEEDED: 1})


def test_a_batch_runs_its_completion_job_once_whatever_each_job_did(store: JobStore) -> None:
    jobs = [NewJob(type="embed", payload={"n": n}) for n in range(5)]
    e = store.enqueue_pipeline(Pipeline.batch(jobs, NewJob(type="summary")))
    [*members, summary] = e.jobs
    assert summary.status == JobStatus.WAITING
    calls = WorkerCalls(store)
    claimed = calls.claim(["embed"], "w1", LEASE, 5)
    kill(store, claimed[0])
    store.cancel([claimed[1].id])
    for job in claimed[2:]:
        assert job.lease_token is not None and calls.complete(
            job.id, job.lease_token, {"n": job.payload["n"]}
        )
    [done] = run(store, "summary")
    assert done.id == summary.id
    counts = outcomes(store.list_dependencies(done.id))
    assert counts == Counter({JobStatus.SUCCEEDED: 3, JobStatus.DEAD: 1, JobStatus.CANCELLED: 1})
    assert {m.id for m in members} == {d.id for d in store.list_dependencies(done.id)}


def test_cancelling_a_pipeline_ends_every_job_of_it_not_finished(store: JobStore) -> None:
    p = Pipeline()
    a = p.add("embed")
    b = p.add("embed")
    p.add("reindex", after=[a, b])
    e = store.enqueue_pipeline(p)
    assert e.pipeline_id is not None
    running = run(store, "embed", limit=1)  # one succeeded
    [held] = WorkerCalls(store).claim(["embed"], "w1", LEASE, 1)  # one running
    assert store.cancel_pipeline(e.pipeline_id, "user gave up") == 2
    assert status(store, held.id) == JobStatus.CANCELLED
    assert status(store, running[0].id) == JobStatus.SUCCEEDED
    assert held.lease_token is not None
    assert not WorkerCalls(store).complete(held.id, held.lease_token)  # its lease ended with it
    progress = store.pipeline_progress(e.pipeline_id)
    assert progress is not None and progress.finished
    assert (progress.total, progress.succeeded, progress.cancelled) == (3, 1, 2)
    assert store.cancel_pipeline(e.pipeline_id) == 0


def test_cancelling_a_job_cancels_what_waits_for_it(store: JobStore) -> None:
    p = Pipeline()
    a = p.add("embed")
    b = p.add("reindex", after=a)
    ids = store.enqueue_pipeline(p).ids
    [c] = store.cancel([ids[a]])
    assert c.cancelled and status(store, ids[b]) == JobStatus.CANCELLED


def test_a_job_may_wait_for_a_job_that_exists(store: JobStore) -> None:
    done = store.enqueue(NewJob(type="embed"))
    running = store.enqueue(NewJob(type="embed2"))
    run(store, "embed", {"x": 1})
    [held] = WorkerCalls(store).claim(["embed2"], "w1", LEASE, 1)
    p = Pipeline()
    p.add("reindex", after=[done.id, running.id], ref="r")
    e = store.enqueue_pipeline(p)
    assert e.jobs[0].status == JobStatus.WAITING  # one of the two has ended
    assert held.lease_token is not None and WorkerCalls(store).complete(held.id, held.lease_token)
    assert status(store, e.ids["r"]) == JobStatus.QUEUED
    p2 = Pipeline()
    p2.add("reindex", after=[done.id])
    assert store.enqueue_pipeline(p2).jobs[0].status == JobStatus.QUEUED  # all ended: runnable at once


def test_waiting_for_a_job_that_does_not_exist_is_refused_writing_nothing(store: JobStore) -> None:
    p = Pipeline()
    p.add("embed", ref="ok")
    p.add("reindex", after=[uuid4()])
    with pytest.raises(JobNotFound, match="does not exist"):
        store.enqueue_pipeline(p)
    assert store.list_jobs() == []


def test_a_graph_that_is_not_listed_in_order_is_refused_by_the_store(store: JobStore) -> None:
    bad: list[dict[str, Any]] = [
        {"ref": "a", "type": "x", "depends_on": ["b"]},
        {"ref": "b", "type": "x", "depends_on": ["a"]},
    ]
    with pytest.raises(InvalidArgument, match="job 0: depends_on names 'b', listed at or after it"):
        store.run(_raw_pipeline(bad))
    self_loop: list[dict[str, Any]] = [{"ref": "a", "type": "x", "depends_on": ["a"]}]
    with pytest.raises(InvalidArgument, match="listed at or after it"):
        store.run(_raw_pipeline(self_loop))
    twice: list[dict[str, Any]] = [{"ref": "a", "type": "x"}, {"ref": "a", "type": "y"}]
    with pytest.raises(InvalidArgument, match="job 1: ref 'a' names two jobs"):
        store.run(_raw_pipeline(twice))
    neither: list[dict[str, Any]] = [{"type": "x", "depends_on": ["nope"]}]
    with pytest.raises(InvalidArgument, match="neither a ref listed before it nor a job id"):
        store.run(_raw_pipeline(neither))
    bad_job: list[dict[str, Any]] = [{"ref": "a", "type": ""}]
    with pytest.raises(InvalidArgument, match="job 0: type must be 1 to 200"):
        store.run(_raw_pipeline(bad_job))
    assert store.list_jobs() == []


def _raw_pipeline(jobs: list[dict[str, Any]]) -> Any:
    from pgjobkit.ops import Call

    yield Call("jobkit_enqueue_pipeline", {"p_jobs": ("jsonb", jobs)}, scalar=True)


def test_the_builder_refuses_a_job_that_waits_for_one_not_added_before_it() -> None:
    p = Pipeline()
    with pytest.raises(InvalidArgument, match="no job added before it"):
        p.add("x", after="later")
    p.add("x", ref="a")
    with pytest.raises(InvalidArgument, match="names two jobs"):
        p.add("y", ref="a")


def test_an_idempotent_pipeline_is_enqueued_once(store: JobStore) -> None:
    def build() -> Pipeline:
        p = Pipeline()
        a = p.add("embed", idempotency_key="doc-1")
        p.add("reindex", after=a, idempotency_key="reindex-1")
        return p

    first = store.enqueue_pipeline(build())
    again = store.enqueue_pipeline(build())
    assert [j.inserted for j in again.jobs] == [False, False]
    assert [j.id for j in again.jobs] == [j.id for j in first.jobs]
    assert len(store.list_jobs()) == 2


def test_a_completion_adds_jobs_only_when_it_holds_its_lease(store: JobStore, harness: Harness) -> None:
    root = store.enqueue(NewJob(type="chunk"))
    calls = WorkerCalls(store)
    [job] = calls.claim(["chunk"], "w1", LEASE, 1)
    assert job.lease_token is not None
    fan = Pipeline()
    embeds = [fan.add("embed", {"n": n}) for n in range(3)]
    fan.add("reindex", after=embeds, ref="r")
    harness.expire_lease(job.id)
    calls.reclaim_expired()
    ok, added = calls.complete_adding(job.id, job.lease_token, {"chunks": 3}, fan)
    assert not ok and added.jobs == ()  # the fence: a worker that lost its lease adds nothing
    assert [j.type for j in store.list_jobs()] == ["chunk"]
    [again] = calls.claim(["chunk"], "w2", LEASE, 1)
    assert again.lease_token is not None
    ok, added = calls.complete_adding(again.id, again.lease_token, {"chunks": 3}, fan)
    assert ok and added.pipeline_id == root.id  # a job in no pipeline starts one, named by its id
    assert [j.status for j in added.jobs] == [JobStatus.QUEUED] * 3 + [JobStatus.WAITING]
    assert status(store, root.id) == JobStatus.SUCCEEDED
    run(store, "embed", {"v": 1})
    [reindex] = run(store, "reindex")
    assert reindex.id == added.ids["r"]
    tree = store.get_pipeline(root.id)
    assert [t.id for t in tree] == [root.id] + [j.id for j in added.jobs]
    assert [t.parent_id for t in tree] == [None] + [root.id] * 4
    assert list(tree[-1].depends_on) == [j.id for j in added.jobs[:3]] and tree[-1].waiting_for == 0
    progress = store.pipeline_progress(root.id)
    assert progress is not None and (progress.total, progress.succeeded) == (5, 5)


def test_a_fan_out_from_a_user_s_job_belongs_to_the_user(store: JobStore, harness: Harness) -> None:
    user = harness.new_user()
    store.enqueue(NewJob(type="chunk", user_id=user))
    calls = WorkerCalls(store)
    [job] = calls.claim(["chunk"], "w1", LEASE, 1)
    assert job.lease_token is not None
    fan = Pipeline()
    fan.add("embed")
    ok, added = calls.complete_adding(job.id, job.lease_token, None, fan)
    assert ok
    child = store.get(added.jobs[0].id)
    assert child is not None and child.user_id == user


def test_prune_keeps_what_a_waiting_job_still_needs(store: JobStore, harness: Harness) -> None:
    p = Pipeline()
    a, b = p.add("embed"), p.add("embed2")
    p.add("reindex", after=[a, b], ref="r")
    ids = store.enqueue_pipeline(p).ids
    run(store, "embed", {"v": 1})
    harness.age(ids[a], timedelta(days=2))
    assert store.prune(timedelta(days=1)) == 0  # reindex still waits for b: a's result is kept
    run(store, "embed2", {"v": 2})
    [reindex] = run(store, "reindex")
    assert [d.result for d in store.list_dependencies(reindex.id)] == [{"v": 1}, {"v": 2}]


def test_a_pipeline_s_jobs_are_listed_and_counted_as_waiting(store: JobStore) -> None:
    p = Pipeline()
    a = p.add("embed")
    p.add("reindex", after=a)
    store.enqueue_pipeline(p)
    assert [j.type for j in store.list_jobs(status=JobStatus.WAITING)] == ["reindex"]
    assert any(r.status == JobStatus.WAITING and r.count == 1 for r in store.stats().rows)


def test_a_job_that_another_waits_for_is_kept_when_completions_delete(store: JobStore) -> None:
    """Completing with delete removes an ownerless job in no pipeline, but not one a job waits for: its
    ending must reach the waiting job (and its result be handed on)."""
    lone = store.enqueue(NewJob(type="embed"))
    p = Pipeline()
    p.add("reindex", after=lone.id, ref="r")
    ids = store.enqueue_pipeline(p).ids
    calls = WorkerCalls(store)
    [job] = calls.claim(["embed"], "w1", LEASE, 1)
    assert job.lease_token is not None
    assert calls.complete_many([(job.id, job.lease_token)], {job.id: {"v": 1}}, delete=True)[job.id]
    assert status(store, lone.id) == JobStatus.SUCCEEDED
    [reindex] = run(store, "reindex")
    assert reindex.id == ids["r"]
    assert [d.result for d in store.list_dependencies(reindex.id)] == [{"v": 1}]


def test_the_first_dependency_listed_that_failed_is_the_reason(store: JobStore) -> None:
    p = Pipeline()
    a, b = p.add("x"), p.add("x")
    p.add("y", after=[a, b], ref="y")
    ids = store.enqueue_pipeline(p).ids
    first, second = WorkerCalls(store).claim(["x"], "w1", LEASE, 2)
    store.cancel([first.id, second.id])
    cancelled = store.get(ids["y"])
    assert (
        cancelled is not None
        and cancelled.error == f"jobkit: cancelled: job {ids[a]}, which it waits for, ended cancelled"
    )
