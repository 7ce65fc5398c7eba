"""Flow control on every store: per-type limits in the claim, fairness between keys, schedules."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from pgjobkit.core.models import NewJob
from pgjobkit.core.schedules import Schedule
from pgjobkit.errors import InvalidArgument, JobNotFound
from pgjobkit.stores.base import JobStore
from pgjobkit.stores.base_async import AsyncJobStore
from pgjobkit.stores.memory import MemoryStore
from pgjobkit.worker.calls import WorkerCalls
from pgjobkit.worker.scheduler import Scheduler
from tests.contract.conftest import Harness

LEASE = timedelta(seconds=30)
HOUR = timedelta(hours=1)


def _enqueue(store: JobStore, type_: str, n: int, **fields: object) -> None:
    store.enqueue_many([NewJob(type=type_, payload={"i": i}, **fields) for i in range(n)])  # type: ignore[arg-type]


def test_max_running_holds_across_claims_and_frees_on_finish(store: JobStore) -> None:
    store.set_limit("embed", max_running=2)
    _enqueue(store, "embed", 5)
    first = WorkerCalls(store).claim(["embed"], "w1", LEASE, 5)
    assert len(first) == 2
    assert WorkerCalls(store).claim(["embed"], "w2", LEASE, 5) == []
    assert WorkerCalls(store).complete(first[0].id, first[0].lease_token)  # type: ignore[arg-type]
    assert len(WorkerCalls(store).claim(["embed"], "w2", LEASE, 5)) == 1
    [lim] = store.list_limits()
    assert (lim.type, lim.max_running, lim.running) == ("embed", 2, 2)


def test_a_paused_type_is_left_out_and_others_still_claim(store: JobStore) -> None:
    store.set_limit("embed", max_running=0)
    _enqueue(store, "embed", 2, priority=5)
    _enqueue(store, "mail", 2)
    assert {j.type for j in WorkerCalls(store).claim(["embed", "mail"], "w", LEASE, 10)} == {"mail"}
    assert store.delete_limit("embed") is True and store.delete_limit("embed") is False
    assert len(WorkerCalls(store).claim(["embed", "mail"], "w", LEASE, 10)) == 2


def test_a_limited_type_capped_mid_claim_leaves_room_for_others(store: JobStore) -> None:
    store.set_limit("embed", max_running=3)
    _enqueue(store, "embed", 10, priority=1)  # ahead of mail in the claim order
    _enqueue(store, "mail", 4)
    claimed = WorkerCalls(store).claim(["embed", "mail"], "w", LEASE, 6)
    assert sorted(j.type for j in claimed) == ["embed"] * 3 + ["mail"] * 3


def test_expired_leases_give_their_slots_back(store: JobStore, harness: Harness) -> None:
    store.set_limit("embed", max_running=1)
    _enqueue(store, "embed", 2)
    [held] = WorkerCalls(store).claim(["embed"], "lost-worker", LEASE, 5)
    assert WorkerCalls(store).claim(["embed"], "w", LEASE, 5) == []
    harness.expire_lease(held.id)
    [again] = WorkerCalls(store).claim(
        ["embed"], "w", LEASE, 5
    )  # the reclaimed job, or the other: one at a time
    assert again.claimed_by == "w" and harness.running() == 1


def test_rate_limit_counts_every_start_in_the_window(store: JobStore, harness: Harness) -> None:
    store.set_limit("embed", max_starts=3, per=HOUR)
    _enqueue(store, "embed", 5)
    claimed = WorkerCalls(store).claim(["embed"], "w", LEASE, 5)
    assert len(claimed) == 3 and all(j.started_at is not None for j in claimed)
    WorkerCalls(store).fail(claimed[0].id, claimed[0].lease_token, "429", timedelta(0))  # type: ignore[arg-type]
    assert WorkerCalls(store).claim(["embed"], "w", LEASE, 5) == []  # a retry is a start too
    [lim] = store.list_limits()
    assert (lim.max_starts, lim.per, lim.started) == (3, HOUR, 3)
    harness.age_flow(HOUR + timedelta(seconds=1))  # the window passes
    assert len(WorkerCalls(store).claim(["embed"], "w", LEASE, 5)) == 3


def test_per_key_cap_passes_over_a_busy_key(store: JobStore) -> None:
    store.set_limit("embed", max_running_per_key=1)
    _enqueue(store, "embed", 3, fair_key="tenant-a")
    _enqueue(store, "embed", 1, fair_key="tenant-b")
    first = WorkerCalls(store).claim(["embed"], "w", LEASE, 10)
    assert sorted(j.fair_key or "" for j in first) == ["tenant-a", "tenant-b"]
    assert WorkerCalls(store).claim(["embed"], "w", LEASE, 10) == []
    WorkerCalls(store).complete(first[0].id, first[0].lease_token)  # type: ignore[arg-type]
    assert len(WorkerCalls(store).claim(["embed"], "w", LEASE, 10)) == 1


def test_limits_refuse_bad_input(store: JobStore) -> None:
    for kwargs, field in [
        ({}, "at least one limit"),
        ({"max_running": -1}, "max_running"),
        ({"max_starts": 10}, "per together"),
        ({"max_starts": 0, "per": HOUR}, "max_starts"),
        ({"max_starts": 5, "per": timedelta(0)}, "per must"),
        ({"max_running_per_key": 0}, "max_running_per_key"),
    ]:
        with pytest.raises(InvalidArgument, match=field):
            store.set_limit("embed", **kwargs)  # type: ignore[arg-type]
    assert store.list_limits() == []


def test_a_key_with_one_job_waits_behind_one_job_of_a_burst(store: JobStore) -> None:
    _enqueue(store, "embed", 200, fair_key="big-tenant")
    store.enqueue(NewJob(type="embed", fair_key="small-tenant"))
    order = [WorkerCalls(store).claim(["embed"], "w", LEASE, 1)[0] for _ in range(3)]
    assert [j.fair_key for j in order] == ["big-tenant", "small-tenant", "big-tenant"]
    assert [j.payload.get("i") for j in order if j.fair_key == "big-tenant"] == [0, 1]  # FIFO per key


def test_turns_continue_after_single_enqueues(store: JobStore) -> None:
    for i in range(4):
        store.enqueue(NewJob(type="embed", payload={"i": i}, fair_key="a"))
    store.enqueue(NewJob(type="embed", fair_key="b"))
    store.enqueue(NewJob(type="embed", payload={"i": 9}))  # no key: the turn being served
    claimed = WorkerCalls(store).claim(["embed"], "w", LEASE, 6)
    assert [(j.fair_key, j.payload.get("i")) for j in claimed] == [
        ("a", 0),
        ("b", None),
        (None, 9),
        ("a", 1),
        ("a", 2),
        ("a", 3),
    ]


def test_jobs_without_keys_stay_first_in_first_out(store: JobStore) -> None:
    for batch in range(3):
        store.enqueue_many([NewJob(type="embed", payload={"batch": batch}) for _ in range(4)])
    claimed = WorkerCalls(store).claim(["embed"], "w", LEASE, 12)
    assert [j.payload["batch"] for j in claimed] == [0] * 4 + [1] * 4 + [2] * 4


def test_schedules_are_stored_listed_and_deleted(store: JobStore) -> None:
    stored = store.set_schedule(
        Schedule(name="nightly", cron="0 3 * * *", type="reindex", timezone="Europe/Berlin")
    )
    assert stored.last_due_at is not None and stored.misfire == "skip" and stored.enabled
    again = store.set_schedule(stored.model_copy(update={"payload": {"full": True}}))
    assert again.last_due_at == stored.last_due_at  # an edit that keeps the cron keeps the position
    assert [s.name for s in store.list_schedules()] == ["nightly"]
    assert store.delete_schedule("nightly") is True and store.delete_schedule("nightly") is False


def test_fire_enqueues_each_due_time_once(store: JobStore, harness: Harness) -> None:
    store.set_schedule(Schedule(name="tick", cron="* * * * * *", type="tick", misfire="catch_up"))
    harness.age_flow(timedelta(seconds=5))
    [s] = store.list_schedules()
    assert s.last_due_at is not None
    due = s.due(datetime.now(UTC) - timedelta(seconds=1))
    assert 3 <= len(due) <= 5
    fired = WorkerCalls(store).fire_schedule("tick", s.last_due_at, due)
    assert (fired.fired, fired.enqueued, fired.last_due_at) == (True, len(due), due[-1])
    late = WorkerCalls(store).fire_schedule(
        "tick", s.last_due_at, due
    )  # a second scheduler with the same view
    assert (late.fired, late.enqueued) == (False, 0)
    jobs = store.list_jobs(type="tick")
    assert sorted(j.run_after for j in jobs) == due
    assert all(j.idempotency_key and j.idempotency_key.startswith("jobkit:schedule:tick:") for j in jobs)


def test_fire_refuses_bad_due_times(store: JobStore, harness: Harness) -> None:
    store.set_schedule(Schedule(name="tick", cron="* * * * * *", type="tick"))
    harness.age_flow(timedelta(seconds=5))
    [s] = store.list_schedules()
    assert s.last_due_at is not None
    with pytest.raises(InvalidArgument, match="p_due"):
        WorkerCalls(store).fire_schedule("tick", s.last_due_at, [s.last_due_at])  # not after last_due_at
    with pytest.raises(InvalidArgument, match="p_due"):
        WorkerCalls(store).fire_schedule("tick", s.last_due_at, [datetime.now(UTC) + HOUR])  # not yet due
    with pytest.raises(JobNotFound):
        WorkerCalls(store).fire_schedule("nothing", s.last_due_at, [s.last_due_at + timedelta(seconds=1)])
    assert store.list_jobs(type="tick") == []


def test_a_scheduler_fires_through_every_store(store: JobStore, harness: Harness) -> None:
    store.set_schedule(Schedule(name="tick", cron="* * * * * *", type="tick", misfire="catch_up"))
    harness.age_flow(timedelta(seconds=3))
    blocking: AsyncJobStore | None = getattr(store, "store", None)  # async stores run through Blocking

    async def tick() -> tuple[int, float]:
        own = blocking is None
        async_store = store.as_async() if blocking is None else blocking
        try:
            return await Scheduler(async_store).atick()
        finally:
            if own and not isinstance(store, MemoryStore):
                await async_store.close()

    if blocking is None:
        enqueued, wait = asyncio.run(tick())
    else:
        enqueued, wait = store.loop.run_until_complete(tick())  # type: ignore[attr-defined]
    assert 2 <= enqueued <= 4 and 0 <= wait <= 1
    assert len(store.list_jobs(type="tick")) == enqueued
