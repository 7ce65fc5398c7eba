"""The JobStore contract. Every store passes exactly these tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest

from pgjobkit.core.models import Job, JobStatus, NewJob
from pgjobkit.errors import InvalidArgument, JobNotFound
from pgjobkit.stores.base import JobStore
from pgjobkit.worker.calls import WorkerCalls
from tests.contract.conftest import Harness

LEASE = timedelta(seconds=30)


def new(type: str = "embed", **kw: object) -> NewJob:
    return NewJob.model_validate({"type": type, **kw})


def claim_one(store: JobStore, type: str = "embed", worker: str = "w1") -> Job:
    [job] = WorkerCalls(store).claim([type], worker, LEASE, 1)
    return job


def token(job: Job) -> UUID:
    assert job.lease_token is not None
    return job.lease_token


def close_to(when: datetime | None, expected: datetime, slack: float = 5.0) -> bool:
    assert when is not None
    return abs((when - expected).total_seconds()) <= slack


# --- enqueue and dedup ---------------------------------------------------------------------------------
def test_enqueue_defaults(store: JobStore) -> None:
    e = store.enqueue(new(payload={"doc": 1}))
    assert e.inserted and e.status == JobStatus.QUEUED
    j = store.get(e.id)
    assert j is not None
    assert (j.status, j.attempts, j.max_attempts, j.priority, j.payload) == (
        JobStatus.QUEUED,
        0,
        3,
        0,
        {"doc": 1},
    )
    assert j.lease_until is None and j.lease_token is None and j.error is None
    assert close_to(j.run_after, datetime.now(UTC))


def test_dedup_by_live_key(store: JobStore) -> None:
    a = store.enqueue(new(idempotency_key="k", payload={"v": 1}))
    b = store.enqueue(new(idempotency_key="k", payload={"v": 2}))
    assert a.inserted and not b.inserted
    assert b.id == a.id and b.status == JobStatus.QUEUED and store.get(b.id).payload == {"v": 1}  # type: ignore[union-attr]
    assert len(store.list_jobs()) == 1


def test_dead_key_frees_it(store: JobStore) -> None:
    a = store.enqueue(new(idempotency_key="k", max_attempts=1))
    c = claim_one(store)
    assert WorkerCalls(store).fail(c.id, token(c), "x", timedelta(0)).status == JobStatus.DEAD
    b = store.enqueue(new(idempotency_key="k"))
    assert b.inserted and b.id != a.id


def test_enqueue_many_order_and_dedup(store: JobStore) -> None:
    old = store.enqueue(new(idempotency_key="old"))
    out = store.enqueue_many(
        [
            new("a", idempotency_key="n"),
            new("b", idempotency_key="old"),
            new("c"),
            new("d", idempotency_key="n"),
        ]
    )
    assert [o.inserted for o in out] == [True, False, True, False]
    assert out[1].id == old.id
    assert out[3].id == out[0].id and len({o.id for o in out}) == 3
    assert {o.status for o in out} == {JobStatus.QUEUED}
    stored = [store.get(o.id) for o in out]  # the whole job is one call away
    assert [j.type if j else None for j in stored] == ["a", "embed", "c", "a"]
    assert store.enqueue_many([]) == []
    assert store.stats().count() == 3
    [again] = store.enqueue_many([new("a", idempotency_key="n")])  # one job takes its own path
    [one] = store.enqueue_many([new("f", idempotency_key="one")])
    assert (again.id, again.inserted) == (out[0].id, False) and one.inserted
    assert [store.get(o.id).type for o in (again, one)] == ["a", "f"]  # type: ignore[union-attr]


def test_enqueue_many_too_big(store: JobStore) -> None:
    with pytest.raises(InvalidArgument, match="at most 10000"):
        store.enqueue_many([new()] * 10_001)
    assert store.list_jobs() == []


def test_delay_and_run_after(store: JobStore, harness: Harness) -> None:
    delayed = store.enqueue(new(delay=timedelta(hours=1)))
    assert close_to(store.get(delayed.id).run_after, datetime.now(UTC) + timedelta(hours=1))  # type: ignore[union-attr]
    later = store.enqueue(new(run_after=datetime(2099, 1, 1, tzinfo=UTC)))
    assert store.get(later.id).run_after == datetime(2099, 1, 1, tzinfo=UTC)  # type: ignore[union-attr]
    assert WorkerCalls(store).claim(["embed"], "w", LEASE, 10) == []
    harness.make_runnable(delayed.id)
    assert [j.id for j in WorkerCalls(store).claim(["embed"], "w", LEASE, 10)] == [delayed.id]


# --- claims ----------------------------------------------------------------------------------------------
def test_claim_order_priority_then_age(store: JobStore) -> None:
    low_old = store.enqueue(new(priority=0))
    high = store.enqueue(new(priority=10))
    low_new = store.enqueue(new(priority=0))
    mid = store.enqueue(new(priority=5))
    got = WorkerCalls(store).claim(["embed"], "w", LEASE, 10)
    assert [j.id for j in got] == [high.id, mid.id, low_old.id, low_new.id]


def test_a_claim_after_a_job_looks_after_it_first(store: JobStore) -> None:
    """p_after: the jobs from the caller's last claimed job's place on (the jobs enqueued with it share it),
    within its priority, come first; a claim without it, or whose band has run out, looks from the front,
    where priority is strict."""
    calls = WorkerCalls(store)
    a, b, c = store.enqueue_many([new(payload={"n": n}) for n in range(3)])
    [first] = calls.claim(["embed"], "w", LEASE, 1)
    high = store.enqueue(new(priority=10))
    [second] = calls.claim(["embed"], "w", LEASE, 1, after=first.id)
    assert (first.id, second.id) == (a.id, b.id)  # high waits for a claim from the front
    assert [j.id for j in calls.claim(["embed"], "w", LEASE, 1)] == [high.id]
    later = store.enqueue(new(priority=10))
    # after c, nothing of its priority is left: the rest from the front, in claim order
    assert [j.id for j in calls.claim(["embed"], "w", LEASE, 5, after=c.id)] == [later.id, c.id]
    again = store.enqueue_many([new(payload={"n": n}) for n in range(2)])
    [d] = calls.claim(["embed"], "w", LEASE, 1, after=uuid4())  # no such job: from the front
    assert d.id == again[0].id


def test_a_claim_of_a_limited_type_always_looks_from_the_front(store: JobStore) -> None:
    store.set_limit("embed", max_running=10)
    calls = WorkerCalls(store)
    a, b = store.enqueue_many([new(payload={"n": n}) for n in range(2)])
    [first] = calls.claim(["embed"], "w", LEASE, 1)
    high = store.enqueue(new(priority=10))
    assert [j.id for j in calls.claim(["embed"], "w", LEASE, 2, after=first.id)] == [high.id, b.id]
    assert first.id == a.id


def test_claim_sets_lease(store: JobStore) -> None:
    job = store.enqueue(new())
    c = claim_one(store, worker="w9")
    assert c.id == job.id
    assert (c.status, c.attempts, c.claimed_by) == (JobStatus.RUNNING, 1, "w9")
    assert close_to(c.lease_until, datetime.now(UTC) + LEASE)
    assert c.lease_token is not None


def test_claim_batches_and_types(store: JobStore) -> None:
    store.enqueue_many([new("a")] * 5 + [new("b")])
    first = WorkerCalls(store).claim(["a"], "w", LEASE, 3)
    assert len(first) == 3 and {j.type for j in first} == {"a"}
    assert len(WorkerCalls(store).claim(["a"], "w", LEASE, 10)) == 2
    assert [j.type for j in WorkerCalls(store).claim(["a", "b"], "w", LEASE, 10)] == ["b"]
    assert WorkerCalls(store).claim(["a", "b"], "w", LEASE, 10) == []


def test_types_with_array_syntax_claim_exactly_themselves(store: JobStore) -> None:
    odd = ["a,b", 'say "hi"', "back\\slash", "{braces}", " NULL ", "ü"]
    store.enqueue_many([new(t) for t in odd] + [new("a"), new("b")])
    claimed = WorkerCalls(store).claim(odd, "w", LEASE, 20)
    assert sorted(j.type for j in claimed) == sorted(odd)
    done = WorkerCalls(store).complete_and_claim(
        [(j.id, j.lease_token or j.id) for j in claimed], [*odd, "a"], "w", LEASE, 5
    )
    assert all(done[0].values()) and [j.type for j in done[1]] == ["a"]


def test_claim_limit_clamped(store: JobStore) -> None:
    store.enqueue_many([new()] * 1100)
    assert len(WorkerCalls(store).claim(["embed"], "w", LEASE, 5000)) == 999


@pytest.mark.parametrize(
    ("types", "worker", "lease", "limit"),
    [
        ([], "w", LEASE, 1),
        ([""], "w", LEASE, 1),
        (["a"], "", LEASE, 1),
        (["a"], "w", timedelta(0), 1),
        (["a"], "w", timedelta(days=2), 1),
        (["a"], "w", LEASE, 0),
        (["a"], "w", LEASE, -1),
    ],
)
def test_claim_bad_input(
    store: JobStore, types: list[str], worker: str, lease: timedelta, limit: int
) -> None:
    with pytest.raises(InvalidArgument, match="jobkit: "):
        WorkerCalls(store).claim(types, worker, lease, limit)


# --- complete / fail / extend ---------------------------------------------------------------------------------
def test_complete(store: JobStore) -> None:
    store.enqueue(new())
    c = claim_one(store)
    assert WorkerCalls(store).complete(c.id, token(c)) is True
    done = store.get(c.id)
    assert done is not None
    assert (done.status, done.lease_until, done.lease_token, done.claimed_by) == (
        JobStatus.SUCCEEDED,
        None,
        None,
        "w1",
    )
    assert WorkerCalls(store).complete(c.id, token(c)) is False  # twice: the lease is gone


def test_complete_many(store: JobStore) -> None:
    store.enqueue_many([new()] * 3)
    jobs = WorkerCalls(store).claim(["embed"], "w", LEASE, 3)
    bogus = (uuid4(), uuid4())
    result = WorkerCalls(store).complete_many([(j.id, token(j)) for j in jobs] + [bogus])
    assert result == {**{j.id: True for j in jobs}, bogus[0]: False}


def test_fail_retrying_then_dead(store: JobStore, harness: Harness) -> None:
    job = store.enqueue(new(max_attempts=2))
    c = claim_one(store)
    r = WorkerCalls(store).fail(c.id, token(c), "boom 1", timedelta(seconds=60))
    assert (r.ok, r.status, r.attempts) == (True, JobStatus.RETRYING, 1)
    assert close_to(r.run_after, datetime.now(UTC) + timedelta(seconds=60))
    got = store.get(job.id)
    assert got is not None and got.error == "boom 1" and got.lease_token is None
    assert WorkerCalls(store).claim(["embed"], "w", LEASE, 1) == []  # not before run_after
    harness.make_runnable(job.id)
    c2 = claim_one(store)
    assert c2.attempts == 2
    r2 = WorkerCalls(store).fail(c2.id, token(c2), "boom 2", timedelta(seconds=60))
    assert (r2.status, r2.attempts) == (JobStatus.DEAD, 2)
    final = store.get(job.id)
    assert final is not None and final.error == "boom 2" and final.status == JobStatus.DEAD


def test_permanent_failure(store: JobStore) -> None:
    store.enqueue(new(max_attempts=5))
    c = claim_one(store)
    r = WorkerCalls(store).fail(c.id, token(c), "bad input", timedelta(seconds=5), permanent=True)
    assert (r.status, r.attempts) == (JobStatus.DEAD, 1)


def test_error_is_bounded(store: JobStore) -> None:
    store.enqueue(new())
    c = claim_one(store)
    WorkerCalls(store).fail(c.id, token(c), "é" * 9000, timedelta(0))
    got = store.get(c.id)
    assert got is not None and got.error == "é" * 4000


def test_fail_bad_delay(store: JobStore) -> None:
    store.enqueue(new())
    c = claim_one(store)
    with pytest.raises(InvalidArgument):
        WorkerCalls(store).fail(c.id, token(c), "x", timedelta(seconds=-1))
    got = store.get(c.id)
    assert got is not None and got.status == JobStatus.RUNNING


def test_heartbeat_extends_a_lease(store: JobStore) -> None:
    store.enqueue(new())
    c = claim_one(store)
    beat = WorkerCalls(store).heartbeat([(c.id, token(c))], timedelta(minutes=10))[c.id]
    assert beat.held and close_to(beat.lease_until, datetime.now(UTC) + timedelta(minutes=10))
    with pytest.raises(InvalidArgument):
        WorkerCalls(store).heartbeat([(c.id, token(c))], timedelta(0))


def test_fencing_after_lost_lease(store: JobStore, harness: Harness) -> None:
    store.enqueue(new())
    stale = claim_one(store, worker="slow")
    harness.expire_lease(stale.id)
    fresh = claim_one(store, worker="fast")  # the claim reclaims the expired lease itself
    assert fresh.id == stale.id and fresh.attempts == 2
    before = store.get(stale.id)
    assert WorkerCalls(store).complete(stale.id, token(stale)) is False
    assert WorkerCalls(store).fail(stale.id, token(stale), "x", timedelta(0)).ok is False
    assert not WorkerCalls(store).heartbeat([(stale.id, token(stale))], LEASE)[stale.id].held
    assert WorkerCalls(store).release(stale.id, token(stale)) is False
    assert store.get(stale.id) == before
    assert WorkerCalls(store).complete(fresh.id, token(fresh)) is True


def test_results_and_progress(store: JobStore, harness: Harness) -> None:
    store.enqueue_many([new(), new(), new(), new()])
    a, b, c = WorkerCalls(store).claim(["embed"], "w1", LEASE, 3)
    assert WorkerCalls(store).progress(
        [(a.id, token(a), 0.25, "a quarter"), (b.id, token(b), 0.5, None)]
    ) == {
        a.id: True,
        b.id: True,
    }
    seen = store.get(a.id)
    assert seen is not None and (seen.progress, seen.progress_message) == (0.25, "a quarter")
    assert WorkerCalls(store).complete(a.id, token(a), {"text": "héllo", "n": [1, 2.5]}) is True
    done = store.get(a.id)
    assert done is not None and (done.result, done.progress) == ({"text": "héllo", "n": [1, 2.5]}, 1.0)
    ok = WorkerCalls(store).complete_many([(b.id, token(b)), (c.id, token(c))], {b.id: [1, 2], c.id: None})
    assert ok == {b.id: True, c.id: True}
    assert [store.get(j.id).result for j in (b, c)] == [[1, 2], None]  # type: ignore[union-attr]
    [d] = WorkerCalls(store).claim(["embed"], "w1", LEASE, 1)
    store.enqueue(new())
    ok, [e] = WorkerCalls(store).complete_and_claim(
        [(d.id, token(d))], ["embed"], "w1", LEASE, 1, {d.id: "done"}
    )
    assert ok == {d.id: True} and store.get(d.id).result == "done"  # type: ignore[union-attr]
    assert WorkerCalls(store).progress([(a.id, token(a), 0.9, None)]) == {a.id: False}  # finished: fenced off
    with pytest.raises(InvalidArgument):
        WorkerCalls(store).progress([(e.id, token(e), 1.5, None)])
    WorkerCalls(store).progress([(e.id, token(e), 0.5, "first attempt")])
    harness.expire_lease(e.id)
    again = claim_one(store)
    assert again.id == e.id and (again.progress, again.progress_message) == (
        None,
        None,
    )  # each attempt its own


def _deep(levels: int) -> list[object]:
    value: list[object] = []
    for _ in range(levels - 1):
        value = [value]
    return value


@pytest.mark.parametrize("result", [10**400, _deep(101), "x" * 70_000], ids=["number", "depth", "size"])
def test_a_result_no_client_could_read_completes_nothing(store: JobStore, result: object) -> None:
    """A result past the bounds (a double's range, 100 levels, 64 KiB) fails the whole call, on every
    store, as the SQL domain's CHECK fails the statement; the batch is still the worker's to complete."""
    store.enqueue_many([new(), new()])
    a, b = WorkerCalls(store).claim(["embed"], "w1", LEASE, 2)
    with pytest.raises(InvalidArgument):
        WorkerCalls(store).complete_many([(a.id, token(a)), (b.id, token(b))], {a.id: result})
    with pytest.raises(InvalidArgument):
        WorkerCalls(store).complete_and_claim([(a.id, token(a))], ["embed"], "w1", LEASE, 1, {a.id: result})
    assert WorkerCalls(store).complete_many([(a.id, token(a)), (b.id, token(b))]) == {a.id: True, b.id: True}


def test_cancel(store: JobStore, harness: Harness) -> None:
    queued = store.enqueue(new(idempotency_key="k"))
    store.enqueue(new(priority=1))
    running = claim_one(store)
    finished = store.enqueue(new(type="other"))
    WorkerCalls(store).complete(finished.id, token(claim_one(store, "other")))
    missing = uuid4()
    results = store.cancel([queued.id, running.id, finished.id, missing], reason="user asked")
    assert [(r.id, r.cancelled, r.status) for r in results] == [
        (queued.id, True, JobStatus.CANCELLED),
        (running.id, True, JobStatus.CANCELLED),
        (finished.id, False, JobStatus.SUCCEEDED),
        (missing, False, None),
    ]
    after = store.get(running.id)
    assert after is not None and (after.status, after.error, after.lease_token) == (
        JobStatus.CANCELLED,
        "user asked",
        None,
    )
    assert (
        WorkerCalls(store).complete(running.id, token(running)) is False
    )  # the worker's later completion: nothing
    assert (
        WorkerCalls(store).heartbeat([(running.id, token(running))], LEASE)[running.id].status
        == JobStatus.CANCELLED
    )
    assert store.enqueue(new(idempotency_key="k")).inserted  # a cancelled job frees its key
    assert harness.running() == 0 and store.stats().count(JobStatus.CANCELLED) == 2


def test_heartbeat_extends_held_leases_and_reports_lost_ones(store: JobStore, harness: Harness) -> None:
    store.enqueue_many([new(), new()])
    a, b = WorkerCalls(store).claim(["embed"], "w1", timedelta(seconds=2), 2)
    harness.expire_lease(b.id)
    c = claim_one(store, worker="w2")  # b, reclaimed
    beats = WorkerCalls(store).heartbeat([(a.id, token(a)), (b.id, token(b))], timedelta(minutes=10))
    assert beats[a.id].held and close_to(beats[a.id].lease_until, datetime.now(UTC) + timedelta(minutes=10))
    assert (beats[b.id].held, beats[b.id].status, beats[b.id].lease_until) == (False, JobStatus.RUNNING, None)
    fresh = WorkerCalls(store).heartbeat([(c.id, token(c))], LEASE)[
        c.id
    ]  # 30 s left of 30: read, not extended
    assert fresh.held and fresh.lease_until == store.get(c.id).lease_until  # type: ignore[union-attr]


def test_release_gives_the_attempt_back(store: JobStore) -> None:
    store.enqueue(new())
    c = claim_one(store)
    assert WorkerCalls(store).release(c.id, token(c)) is True
    got = store.get(c.id)
    assert got is not None and (got.status, got.attempts, got.lease_token) == (JobStatus.QUEUED, 0, None)
    assert claim_one(store).attempts == 1


# --- reclaim / requeue / prune ---------------------------------------------------------------------------------
def test_reclaim_expired(store: JobStore, harness: Harness) -> None:
    keep = store.enqueue(new(max_attempts=3))
    poison = store.enqueue(new("poison", max_attempts=1))
    claim_one(store)
    claim_one(store, "poison")
    harness.expire_lease(keep.id)
    harness.expire_lease(poison.id)
    got = {r.id: r.status for r in WorkerCalls(store).reclaim_expired()}
    assert got == {keep.id: JobStatus.RETRYING, poison.id: JobStatus.DEAD}
    kept = store.get(keep.id)
    assert kept is not None and kept.error is not None and "lease expired" in kept.error
    assert WorkerCalls(store).reclaim_expired() == []
    with pytest.raises(InvalidArgument):
        WorkerCalls(store).reclaim_expired(0)


def test_poison_job_ends_dead(store: JobStore, harness: Harness) -> None:
    job = store.enqueue(new(max_attempts=3))
    for attempt in (1, 2, 3):
        c = claim_one(store)
        assert c.attempts == attempt
        harness.expire_lease(job.id)
    assert WorkerCalls(store).claim(["embed"], "w", LEASE, 1) == []
    got = store.get(job.id)
    assert got is not None and got.status == JobStatus.DEAD


def test_requeue(store: JobStore) -> None:
    a = store.enqueue(new("a", max_attempts=1))
    b = store.enqueue(new("b", max_attempts=1))
    for t in ("a", "b"):
        c = claim_one(store, t)
        WorkerCalls(store).fail(c.id, token(c), "x", timedelta(0))
    back = store.requeue([a.id])
    assert [(j.id, j.status, j.attempts) for j in back] == [(a.id, JobStatus.QUEUED, 0)]
    assert store.requeue([a.id]) == []  # no longer dead
    assert [j.id for j in store.requeue(type="b")] == [b.id]
    with pytest.raises(JobNotFound):
        store.requeue([uuid4()])


def test_requeue_respects_live_key(store: JobStore) -> None:
    store.enqueue(new(idempotency_key="k", max_attempts=1))
    c = claim_one(store)
    WorkerCalls(store).fail(c.id, token(c), "x", timedelta(0))
    assert store.enqueue(new(idempotency_key="k")).inserted
    assert store.requeue() == []


def test_prune(store: JobStore, harness: Harness) -> None:
    done = store.enqueue(new())
    live = store.enqueue(new("other"))
    c = claim_one(store)
    WorkerCalls(store).complete(c.id, token(c))
    assert store.prune(timedelta(hours=1)) == 0
    harness.age(done.id, timedelta(hours=2))
    harness.age(live.id, timedelta(hours=2))
    assert store.prune(timedelta(hours=1), statuses=[JobStatus.DEAD]) == 0
    assert store.prune(timedelta(hours=1)) == 1
    assert store.get(done.id) is None and store.get(live.id) is not None
    with pytest.raises(InvalidArgument):
        store.prune(timedelta(hours=1), statuses=[JobStatus.QUEUED])


# --- reads ------------------------------------------------------------------------------------------------------
def test_stats(store: JobStore) -> None:
    store.enqueue_many([new(), new(), new("t2", delay=timedelta(minutes=10))])
    claim_one(store)
    stats = store.stats()
    assert stats.count(JobStatus.QUEUED, "embed") == 1
    assert stats.count(JobStatus.RUNNING) == 1
    assert stats.count() == 3
    rows = {(r.type, r.status): r for r in stats.rows}
    assert rows[("t2", JobStatus.QUEUED)].oldest_runnable_seconds is None
    age = rows[("embed", JobStatus.QUEUED)].oldest_runnable_seconds
    assert age is not None and 0 <= age < 5


def test_list_filters_and_keyset_pages(store: JobStore) -> None:
    store.enqueue_many([new("a")] * 5 + [new("b")] * 2)  # one created_at for the whole batch
    store.enqueue(new("a"))
    assert len(store.list_jobs(type="a")) == 6
    assert len(store.list_jobs(status=JobStatus.QUEUED, type="b")) == 2
    pages, before = [], None
    while page := store.list_jobs(limit=3, before=before):
        pages.append(page)
        before = (page[-1].created_at, page[-1].id)
    seen = [j.id for p in pages for j in p]
    assert len(seen) == len(set(seen)) == 8
    assert [len(p) for p in pages] == [3, 3, 2]
    assert store.get(uuid4()) is None
    with pytest.raises(InvalidArgument):
        store.list_jobs(limit=0)


def test_complete_and_claim_in_one_call(store: JobStore) -> None:
    store.enqueue_many([new()] * 3)
    first = WorkerCalls(store).claim(["embed"], "w", LEASE, 2)
    stale = (uuid4(), uuid4())
    ok, claimed = WorkerCalls(store).complete_and_claim(
        [(j.id, token(j)) for j in first] + [stale], ["embed"], "w", LEASE, 5
    )
    assert ok == {**{j.id: True for j in first}, stale[0]: False}
    assert len(claimed) == 1 and claimed[0].id not in {j.id for j in first}
    assert claimed[0].status == JobStatus.RUNNING
    for j in first:
        got = store.get(j.id)
        assert got is not None and got.status == JobStatus.SUCCEEDED
    ok, none = WorkerCalls(store).complete_and_claim(
        [(claimed[0].id, token(claimed[0]))], ["embed"], "w", LEASE, 5
    )
    assert ok == {claimed[0].id: True} and none == []


def test_completing_with_delete_removes_ownerless_jobs_only(store: JobStore, harness: Harness) -> None:
    owner = harness.new_user()
    made = store.enqueue_many(
        [new(idempotency_key="a"), new(idempotency_key="b"), new(user_id=owner), new(), new()]
    )
    first = WorkerCalls(store).claim(["embed"], "w", LEASE, 3)
    stale = (uuid4(), uuid4())
    ok = WorkerCalls(store).complete_many(
        [(j.id, token(j)) for j in first] + [stale], {j.id: {"r": 1} for j in first}, delete=True
    )
    assert ok == {**{j.id: True for j in first}, stale[0]: False}
    rest = WorkerCalls(store).claim(["embed"], "w", LEASE, 5)
    ok, none = WorkerCalls(store).complete_and_claim(
        [(j.id, token(j)) for j in rest], ["embed"], "w", LEASE, 5, delete=True
    )
    assert ok == {j.id: True for j in rest} and none == []
    # What a completion keeps: the user's job, succeeded with its result where it had one; nothing else.
    [kept] = [job for r in made if (job := store.get(r.id)) is not None]
    assert (kept.user_id, kept.status) == (owner, JobStatus.SUCCEEDED)
    assert kept.result == ({"r": 1} if kept.id in {j.id for j in first} else None)
    assert WorkerCalls(store).complete_many([(j.id, token(j)) for j in first + rest], delete=True) == {
        j.id: False for j in first + rest
    }
    # A deleted job's idempotency key is free again.
    assert store.enqueue(new(idempotency_key="a")).inserted


# --- more than PostgREST's max-rows (1000) in one call ----------------------------------------------------
BIG = 1500


def claim_all(store: JobStore, type: str = "embed") -> list[Job]:
    """Claim until nothing is runnable (a claim takes at most 999)."""
    jobs: list[Job] = []
    while got := WorkerCalls(store).claim([type], "w", LEASE, 999):
        jobs += got
    return jobs


def test_enqueue_many_beyond_max_rows_returns_every_result(store: JobStore) -> None:
    keyed = [new(idempotency_key=f"k{i}", payload={"i": i}) for i in range(BIG)]
    out = store.enqueue_many(keyed)
    assert len(out) == BIG and all(o.inserted for o in out)
    assert [store.get(o.id).payload["i"] for o in out] == list(range(BIG))  # type: ignore[union-attr]
    assert len({o.id for o in out}) == BIG
    again = store.enqueue_many(keyed[::-1])
    assert [o.id for o in again] == [o.id for o in out][::-1] and not any(o.inserted for o in again)
    assert store.stats().count() == BIG


def test_complete_and_claim_beyond_max_rows_leases_nothing_unseen(store: JobStore, harness: Harness) -> None:
    store.enqueue_many([new()] * (2 * 999))
    first = WorkerCalls(store).claim(["embed"], "w", LEASE, 999)
    ok, claimed = WorkerCalls(store).complete_and_claim(
        [(j.id, token(j)) for j in first], ["embed"], "w", LEASE, 999
    )
    assert len(ok) == 999 and all(ok.values())
    assert harness.running() == len(claimed) > 0  # every job leased is one the caller holds
    rest = claim_all(store)
    ok, none = WorkerCalls(store).complete_and_claim(
        [(j.id, token(j)) for j in claimed + rest], ["embed"], "w", LEASE, 999
    )
    assert len(ok) == 999 and all(ok.values()) and none == []
    assert harness.running() == 0 and store.stats().count(JobStatus.SUCCEEDED) == 2 * 999


def test_complete_many_beyond_max_rows(store: JobStore, harness: Harness) -> None:
    store.enqueue_many([new()] * BIG)
    jobs = claim_all(store)
    assert len(jobs) == BIG
    ok = WorkerCalls(store).complete_many([(j.id, token(j)) for j in jobs])
    assert ok == {j.id: True for j in jobs}
    assert harness.running() == 0 and store.stats().count(JobStatus.SUCCEEDED) == BIG


def test_reclaim_and_requeue_beyond_max_rows(store: JobStore, harness: Harness) -> None:
    store.enqueue_many([new(max_attempts=1)] * BIG)
    jobs = claim_all(store)
    harness.expire_lease(*(j.id for j in jobs))
    reclaimed = WorkerCalls(store).reclaim_expired(limit=2 * BIG)
    assert len(reclaimed) == BIG and {r.status for r in reclaimed} == {JobStatus.DEAD}
    assert harness.running() == 0
    back = store.requeue()
    assert sorted(j.id for j in back) == sorted(j.id for j in jobs)
    assert store.stats().count(JobStatus.QUEUED) == BIG
    assert store.requeue() == []


def test_stats_beyond_max_rows(store: JobStore) -> None:
    types = [f"t{i:04}" for i in range(1001)]
    store.enqueue_many([new(t) for t in types])
    stats = store.stats()
    assert [r.type for r in stats.rows] == types and stats.count() == 1001
