"""The JetStream store's semantics on a real 3-node cluster: each test on a queue (stream) of its own."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pgjobkit.core.models import JobStatus, NewJob
from pgjobkit.core.transitions import backoff
from pgjobkit.errors import ConfigurationError, InvalidArgument, JobNotFound, Permanent, Retry
from pgjobkit.natscluster import LocalCluster
from pgjobkit.stores.jetstream import MAX_ATOMIC_JOBS, AsyncJetStreamStore, NotAvailable
from pgjobkit.version import SCHEMA_VERSION
from pgjobkit.worker import Worker
from pgjobkit.worker.calls_async import AsyncWorkerCalls
from tests.jetstream.store_helpers import claim_until, fresh_store

LEASE = timedelta(seconds=30)
Scenario = Callable[[AsyncJetStreamStore, AsyncWorkerCalls], Awaitable[Any]]


def run(cluster: LocalCluster, scenario: Scenario) -> Any:
    async def main() -> Any:
        async with fresh_store(cluster) as store:
            assert await store.migrate() == 3
            return await scenario(store, AsyncWorkerCalls(store))

    return asyncio.run(main())


def test_migrate_is_idempotent_and_replicates_three_ways(cluster: LocalCluster) -> None:
    async def scenario(store: AsyncJetStreamStore, _: AsyncWorkerCalls) -> None:
        assert await store.migrate() == 3
        info = await store.functions.wire.js.stream_info(store.layout.stream)
        assert info.config.num_replicas == 3
        assert info.config.max_msgs_per_subject == 1
        assert await store.schema_version() == SCHEMA_VERSION  # the layout this code writes: jetstream-1
        assert await store.migrate(replicas=1) == 1  # JOBKIT_NATS_REPLICAS's override updates it
        assert (await store.functions.wire.js.stream_info(store.layout.stream)).config.num_replicas == 1

    run(cluster, scenario)


def test_replicas_default_to_one_on_a_single_server_and_a_small_cluster_is_told_to_set_them() -> None:
    """The default asks the server, not the gossiped peer list (which lags a forming cluster): 1 on a
    server with no cluster, 3 on a cluster; 2 servers cannot place 3 replicas, and migrate says which
    setting to change instead of failing as a passing fault."""

    async def migrate(cluster: LocalCluster) -> int:
        store = AsyncJetStreamStore(cluster.url, prefix="tr", stream="TR", patience=1.0)
        async with store:
            return await store.migrate()

    with LocalCluster(1) as one:
        assert asyncio.run(migrate(one)) == 1
    with LocalCluster(2) as two, pytest.raises(ConfigurationError, match="set JOBKIT_NATS_REPLICAS"):
        asyncio.run(migrate(two))


def test_a_key_is_held_while_its_job_lives_and_freed_when_it_is_dead_or_cancelled(
    cluster: LocalCluster,
) -> None:
    async def scenario(store: AsyncJetStreamStore, w: AsyncWorkerCalls) -> None:
        first = await store.enqueue(NewJob(type="t", idempotency_key="order 42/é"))
        again = await store.enqueue(NewJob(type="t", idempotency_key="order 42/é"))
        assert first.inserted and not again.inserted and again.id == first.id
        [job] = await claim_until(w, ["t"], 1)
        assert not (await store.enqueue(NewJob(type="t", idempotency_key="order 42/é"))).inserted  # running
        assert await w.complete(job.id, job.lease_token or job.id)
        held = await store.enqueue(NewJob(type="t", idempotency_key="order 42/é"))
        assert (held.id, held.inserted, held.status) == (first.id, False, JobStatus.SUCCEEDED)

        dead = await store.enqueue(NewJob(type="d", idempotency_key="k", max_attempts=1))
        [job] = await claim_until(w, ["d"], 1)
        failed = await w.fail(job.id, job.lease_token or job.id, "boom", timedelta(0))
        assert failed.status == JobStatus.DEAD
        freed = await store.enqueue(NewJob(type="d", idempotency_key="k"))
        assert freed.inserted and freed.id != dead.id

        [cancelled] = await store.cancel([freed.id])
        assert cancelled.cancelled
        after = await store.enqueue(NewJob(type="d", idempotency_key="k"))
        assert after.inserted and after.id not in (dead.id, freed.id)

    run(cluster, scenario)


def test_enqueue_many_keeps_order_and_says_which_it_inserted(cluster: LocalCluster) -> None:
    async def scenario(store: AsyncJetStreamStore, w: AsyncWorkerCalls) -> None:
        old = await store.enqueue(NewJob(type="m", idempotency_key="old"))
        jobs = [
            NewJob(type="m", payload={"n": 0}),
            NewJob(type="m", payload={"n": 1}, idempotency_key="old"),
            NewJob(type="m", payload={"n": 2}, idempotency_key="new"),
            NewJob(type="m", payload={"n": 3}, idempotency_key="new"),
            NewJob(type="m", payload={"n": 4}, run_after=datetime.now(UTC) + timedelta(hours=1)),
        ]
        out = await store.enqueue_many(jobs)
        assert [e.inserted for e in out] == [True, False, True, False, True]
        assert out[1].id == old.id and out[3].id == out[2].id
        assert len({e.id for e in out}) == 4
        payloads = [(await store.get(e.id)).payload for e in out]  # type: ignore[union-attr]
        assert payloads == [{"n": 0}, {}, {"n": 2}, {"n": 2}, {"n": 4}]
        claimed = await claim_until(w, ["m"], 3, within=2)
        assert {j.id for j in claimed} == {old.id, out[0].id, out[2].id}  # the one in an hour waits

        with pytest.raises(InvalidArgument, match=f"at most {MAX_ATOMIC_JOBS} jobs per enqueue_many"):
            await store.enqueue_many([NewJob(type="m")] * (MAX_ATOMIC_JOBS + 1))
        before = (await store.stats()).count()
        with pytest.raises(InvalidArgument):  # one bad job: none is written
            await store.enqueue_many([NewJob(type="m"), NewJob.model_construct(type="", payload={})])
        assert (await store.stats()).count() == before

    run(cluster, scenario)


def test_claims_come_in_batches_each_with_a_fresh_token(cluster: LocalCluster) -> None:
    async def scenario(store: AsyncJetStreamStore, w: AsyncWorkerCalls) -> None:
        await store.enqueue_many([NewJob(type="b", payload={"i": i}) for i in range(30)])
        start = datetime.now(UTC)
        first = await w.claim(["b"], "w1", LEASE, 20)
        second = await claim_until(w, ["b"], 10, worker="w2")
        assert len(first) == 20 and len(second) == 10
        assert [j.payload["i"] for j in first + second] == list(range(30))  # dispatch order
        tokens = {j.lease_token for j in first + second}
        assert len(tokens) == 30 and None not in tokens
        for job in first:
            assert job.status == JobStatus.RUNNING and job.attempts == 1 and job.claimed_by == "w1"
            assert job.lease_until is not None and job.lease_until >= start + LEASE
        assert await w.claim(["b"], "w3", LEASE, 10) == []
        assert (await store.stats()).count(JobStatus.RUNNING) == 30

    run(cluster, scenario)


def test_a_stale_worker_changes_nothing_and_learns_it_lost(cluster: LocalCluster) -> None:
    """A's lease expires; the schedule its claim armed hands the job to B, with a new token. Every call of
    A's is refused, and the record stays B's."""

    async def scenario(store: AsyncJetStreamStore, w: AsyncWorkerCalls) -> None:
        await store.enqueue(NewJob(type="s"))
        [a] = await claim_until(w, ["s"], 1, worker="A", lease=timedelta(seconds=1))
        [b] = await claim_until(w, ["s"], 1, worker="B", within=5)
        assert b.id == a.id and b.attempts == 2 and b.lease_token != a.lease_token
        stale = a.lease_token
        assert stale is not None
        assert await w.complete(a.id, stale, {"by": "A"}) is False
        assert (await w.fail(a.id, stale, "A's error", timedelta(0))).ok is False
        beat = (await w.heartbeat([(a.id, stale)], LEASE))[a.id]
        assert beat.held is False and beat.status == JobStatus.RUNNING
        assert (await w.progress([(a.id, stale, 0.5, "A")]))[a.id] is False
        assert await w.release(a.id, stale) is False
        done, _ = await w.complete_and_claim([(a.id, stale)], ["s"], "A", LEASE, 1)
        assert done[a.id] is False
        now = await store.get(a.id)
        assert now is not None
        assert (now.status, now.lease_token, now.claimed_by, now.result) == (
            JobStatus.RUNNING,
            b.lease_token,
            "B",
            None,
        )
        assert await w.complete(b.id, b.lease_token or b.id, {"by": "B"})
        assert (await store.get(a.id)).result == {"by": "B"}  # type: ignore[union-attr]

    run(cluster, scenario)


def test_retries_back_off_then_the_job_is_dead(cluster: LocalCluster) -> None:
    async def scenario(store: AsyncJetStreamStore, w: AsyncWorkerCalls) -> None:
        await store.enqueue(NewJob(type="r", max_attempts=3))
        seen = []
        for attempt in (1, 2, 3):
            [job] = await claim_until(w, ["r"], 1, within=5)
            seen.append((job.attempts, time.monotonic()))
            delay = backoff(attempt, base=0.3)
            out = await w.fail(job.id, job.lease_token or job.id, f"failure {attempt}", delay)
            assert out.ok and out.attempts == attempt
            assert out.status == (JobStatus.DEAD if attempt == 3 else JobStatus.RETRYING)
        assert [a for a, _ in seen] == [1, 2, 3]
        assert seen[1][1] - seen[0][1] >= 0.3 and seen[2][1] - seen[1][1] >= 0.6  # never early
        dead = await store.get(job.id)
        assert dead is not None and dead.status == JobStatus.DEAD and dead.error == "failure 3"
        assert await w.claim(["r"], "w", LEASE, 1) == []

    run(cluster, scenario)


def test_permanent_is_dead_at_once_and_retry_after_waits_that_long(cluster: LocalCluster) -> None:
    async def scenario(store: AsyncJetStreamStore, w: AsyncWorkerCalls) -> None:
        await store.enqueue_many([NewJob(type="p", payload={"n": 1}), NewJob(type="p", payload={"n": 2})])
        one, two = await claim_until(w, ["p"], 2)
        out = await w.fail(one.id, one.lease_token or one.id, "bad input", timedelta(0), permanent=True)
        assert (out.status, out.attempts) == (JobStatus.DEAD, 1)
        failed_at = time.monotonic()
        out = await w.fail(two.id, two.lease_token or two.id, "later", timedelta(seconds=1.0))
        assert out.status == JobStatus.RETRYING
        assert await w.claim(["p"], "w", LEASE, 1) == []
        [again] = await claim_until(w, ["p"], 1, within=5)
        assert again.id == two.id and time.monotonic() - failed_at >= 1.0

    run(cluster, scenario)


def test_an_expired_lease_is_recovered_within_a_second_of_its_end(cluster: LocalCluster) -> None:
    async def scenario(store: AsyncJetStreamStore, w: AsyncWorkerCalls) -> None:
        await store.enqueue(NewJob(type="e", max_attempts=2))
        [first] = await claim_until(w, ["e"], 1, lease=timedelta(seconds=1))
        assert first.lease_until is not None
        [second] = await claim_until(w, ["e"], 1, lease=timedelta(seconds=1), within=5)
        late = (datetime.now(UTC) - first.lease_until).total_seconds()
        assert second.id == first.id and second.attempts == 2
        assert 0 <= late < 1.0, late
        # attempts used up: the next expiry writes it dead, and nothing claims it
        await asyncio.sleep(1.6)
        assert await w.claim(["e"], "w", LEASE, 1) == []
        dead = await store.get(first.id)
        assert dead is not None and dead.status == JobStatus.DEAD and "lease expired" in (dead.error or "")

    run(cluster, scenario)


def test_a_heartbeat_keeps_the_lease_past_its_first_end(cluster: LocalCluster) -> None:
    async def scenario(store: AsyncJetStreamStore, w: AsyncWorkerCalls) -> None:
        await store.enqueue(NewJob(type="h"))
        [job] = await claim_until(w, ["h"], 1, lease=timedelta(seconds=1))
        token = job.lease_token or job.id
        for _ in range(5):  # 2 s: twice the lease
            await asyncio.sleep(0.4)
            assert (await w.heartbeat([(job.id, token)], timedelta(seconds=1)))[job.id].held
            assert await w.claim(["h"], "other", LEASE, 1) == []
        assert (await w.progress([(job.id, token, 0.5, "half")]))[job.id]
        assert await w.complete(job.id, token)
        done = await store.get(job.id)
        assert done is not None and done.status == JobStatus.SUCCEEDED and done.attempts == 1

    run(cluster, scenario)


def test_cancel_release_and_requeue(cluster: LocalCluster) -> None:
    async def scenario(store: AsyncJetStreamStore, w: AsyncWorkerCalls) -> None:
        queued = await store.enqueue(NewJob(type="c", payload={"n": 1}))
        [c] = await store.cancel([queued.id], "not needed")
        assert (c.cancelled, c.status) == (True, JobStatus.CANCELLED)
        assert await w.claim(["c"], "w", LEASE, 1) == []
        [again] = await store.cancel([queued.id])
        assert (again.cancelled, again.status) == (False, JobStatus.CANCELLED)

        await store.enqueue(NewJob(type="c", payload={"n": 2}))
        [running] = await claim_until(w, ["c"], 1)
        [c] = await store.cancel([running.id])
        assert c.cancelled
        beat = (await w.heartbeat([(running.id, running.lease_token or running.id)], LEASE))[running.id]
        assert (beat.held, beat.status) == (False, JobStatus.CANCELLED)  # it stops at its next beat

        await store.enqueue(NewJob(type="c", payload={"n": 3}))
        [held] = await claim_until(w, ["c"], 1)
        assert await w.release(held.id, held.lease_token or held.id)
        [back] = await claim_until(w, ["c"], 1)
        assert back.id == held.id and back.attempts == 1  # a release does not count the attempt

        await w.fail(back.id, back.lease_token or back.id, "x", timedelta(0), permanent=True)
        [requeued] = await store.requeue([back.id])
        assert (requeued.status, requeued.attempts) == (JobStatus.QUEUED, 0)
        [back] = await claim_until(w, ["c"], 1)
        assert back.id == held.id
        with pytest.raises(JobNotFound):
            await store.requeue([queued.id.__class__(int=7)])

    run(cluster, scenario)


def test_stats_count_by_type_and_status(cluster: LocalCluster) -> None:
    async def scenario(store: AsyncJetStreamStore, w: AsyncWorkerCalls) -> None:
        assert (await store.stats()).rows == ()
        await store.enqueue_many([NewJob(type="x")] * 3 + [NewJob(type="y")] * 2)
        await claim_until(w, ["y"], 1)
        stats = await store.stats()
        assert stats.count(JobStatus.QUEUED, "x") == 3
        assert (stats.count(JobStatus.QUEUED, "y"), stats.count(JobStatus.RUNNING, "y")) == (1, 1)
        assert stats.oldest_runnable_seconds is not None and stats.oldest_runnable_seconds >= 0

    run(cluster, scenario)


def test_a_dispatch_wakes_a_listener(cluster: LocalCluster) -> None:
    async def scenario(store: AsyncJetStreamStore, _: AsyncWorkerCalls) -> None:
        woken = asyncio.Event()
        sub = await store.listen(woken.set)
        try:
            await store.enqueue(NewJob(type="wake"))
            await asyncio.wait_for(woken.wait(), 5)
        finally:
            await sub.close()

    run(cluster, scenario)


def test_what_this_store_cannot_do_is_refused_at_once(cluster: LocalCluster) -> None:
    async def scenario(store: AsyncJetStreamStore, w: AsyncWorkerCalls) -> None:
        for refused in (
            store.enqueue(NewJob(type="n", priority=5)),
            store.enqueue(NewJob(type="n", fair_key="tenant")),
            store.list_jobs(),
            store.set_limit("n", max_running=1),
            store.list_workers(),
        ):
            with pytest.raises(NotAvailable, match="not available on the JetStream store"):
                await refused
        assert (await store.stats()).rows == ()

    run(cluster, scenario)


def test_concurrent_enqueues_of_one_key_insert_one_job(cluster: LocalCluster) -> None:
    async def scenario(store: AsyncJetStreamStore, _: AsyncWorkerCalls) -> None:
        out = await asyncio.gather(
            *(store.enqueue(NewJob(type="k", idempotency_key="once")) for _ in range(20))
        )
        assert sum(e.inserted for e in out) == 1
        assert len({e.id for e in out}) == 1
        assert (await store.stats()).count() == 1

    run(cluster, scenario)


def test_a_dispatch_taken_by_a_worker_that_died_before_its_claim_comes_back(cluster: LocalCluster) -> None:
    """The worker fetched the dispatch and died before the record's write: JetStream delivers it again
    after ack_wait (1 s here), and the job is claimed then, on its first attempt."""

    async def main() -> None:
        async with fresh_store(cluster, ack_wait=1.0) as store:
            await store.migrate()
            calls = AsyncWorkerCalls(store)
            queued = await store.enqueue(NewJob(type="lost"))
            sub = await store.functions._subscription("lost")
            [taken] = await store.functions.wire.retrying(
                "a pull", lambda _: sub.fetch(1, timeout=2)
            )  # not acked
            assert taken.subject.endswith(str(queued.id))
            assert await calls.claim(["lost"], "w", LEASE, 1) == []
            [job] = await claim_until(calls, ["lost"], 1, within=5)
            assert (job.id, job.attempts) == (queued.id, 1)

    asyncio.run(main())


def test_the_worker_runs_its_jobs_on_this_store_with_retry_and_permanent(cluster: LocalCluster) -> None:
    """``pgjobkit.worker.Worker`` as it is, on the JetStream store: Retry(after=) retries, Permanent is dead at
    once (the worker maps them to fail's delay and permanent, as on every store)."""

    async def scenario(store: AsyncJetStreamStore, _: AsyncWorkerCalls) -> None:
        flaky = await store.enqueue(NewJob(type="wk", payload={"kind": "flaky"}))
        bad = await store.enqueue(NewJob(type="wk", payload={"kind": "bad"}))
        await store.enqueue_many([NewJob(type="wk", payload={"kind": "ok", "n": n}) for n in range(10)])
        runs: list[str] = []
        worker = Worker(store, schedules=False, concurrency=4, poll_interval=0.05)

        @worker.handler("wk")
        async def handle(payload: dict[str, Any]) -> dict[str, int]:
            runs.append(payload["kind"])
            if payload["kind"] == "bad":
                raise Permanent("cannot be done")
            if payload["kind"] == "flaky" and runs.count("flaky") == 1:
                raise Retry("once more", after=0)
            return {"n": payload.get("n", -1)}

        await asyncio.wait_for(worker.arun(install_signals=False, until_empty=True), 60)
        stats = await store.stats()
        assert (stats.count(JobStatus.SUCCEEDED), stats.count(JobStatus.DEAD)) == (11, 1), stats
        again = await store.get(flaky.id)
        dead = await store.get(bad.id)
        assert again is not None and (again.status, again.attempts) == (JobStatus.SUCCEEDED, 2)
        assert dead is not None and (dead.status, dead.attempts) == (JobStatus.DEAD, 1)
        assert runs.count("ok") == 10

    run(cluster, scenario)
