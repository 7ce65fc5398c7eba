"""A JetStream queue of several partitions (``pgjobkit.stores.jetstream.partitions``) on the real 3-node
cluster: its jobs spread over its streams by the stated rule, every call that names a job finds it on its
stream, a key unique across all of them, and a store opened with another number of partitions stopped at its first call."""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest

from pgjobkit.core.models import Job, JobStatus, NewJob
from pgjobkit.errors import ConfigurationError, JobNotFound, Retry
from pgjobkit.natscluster import LocalCluster
from pgjobkit.stores.jetstream import AsyncJetStreamStore
from pgjobkit.stores.jetstream.partitions import id_partition, key_partition
from pgjobkit.version import SCHEMA_VERSION
from pgjobkit.worker import Worker
from pgjobkit.worker.calls_async import AsyncWorkerCalls
from tests.jetstream.store_helpers import claim_until, fresh_store

LEASE = timedelta(seconds=30)
Scenario = Callable[[AsyncJetStreamStore, AsyncWorkerCalls], Awaitable[Any]]


def run(cluster: LocalCluster, scenario: Scenario, partitions: int = 3) -> Any:
    async def main() -> Any:
        async with fresh_store(cluster, partitions=partitions) as store:
            await store.migrate()
            return await scenario(store, AsyncWorkerCalls(store))

    return asyncio.run(main())


def held(jobs: list[Job]) -> list[tuple[UUID, UUID]]:
    tokens = [j.lease_token for j in jobs]
    assert None not in tokens
    return [(j.id, t) for j, t in zip(jobs, tokens, strict=True) if t is not None]


async def records_per_stream(store: AsyncJetStreamStore) -> list[set[Any]]:
    return [{job.id for job, _ in await part.scan()} for part in store._parts]


def test_jobs_spread_over_the_streams_and_every_call_finds_its_job(cluster: LocalCluster) -> None:
    async def scenario(store: AsyncJetStreamStore, calls: AsyncWorkerCalls) -> None:
        names = [p.layout.stream for p in store._parts]
        assert len(set(names)) == 3
        for part in store._parts:  # each stream names the queue's partitions
            assert (await part.wire.metadata())["jobkit_partitions"] == "3"
        assert await store.schema_version() == SCHEMA_VERSION
        results = await store.enqueue_many([NewJob(type="t", payload={"n": n}) for n in range(30)])
        stored = [await store.get(r.id) for r in results]
        assert [j.payload["n"] for j in stored if j is not None] == list(range(30))  # the call's order
        assert all(r.inserted for r in results)
        streams = await records_per_stream(store)
        assert [len(ids) for ids in streams] == [10, 10, 10]  # unkeyed jobs go to the partitions in turn
        for k, ids in enumerate(streams):
            assert {id_partition(i, 3) for i in ids} == {k}  # where a job lives follows from its id
        one = await store.enqueue(NewJob(type="t", payload={"n": 30}))
        assert one.id in (await records_per_stream(store))[id_partition(one.id, 3)]

        claimed = await claim_until(calls, ["t"], 31)
        assert sorted(j.payload["n"] for j in claimed) == list(range(31))
        beats = await calls.heartbeat(held(claimed), LEASE)
        assert len(beats) == 31 and all(state.held for state in beats.values())
        assert all((await calls.progress([(i, t, 0.5, "half") for i, t in held(claimed)])).values())
        first, second, third, *rest = claimed
        assert await calls.release(*held([first])[0])
        failed = await calls.fail(*held([second])[0], "no", timedelta(0), permanent=True)
        assert failed.status == JobStatus.DEAD
        [cancelled] = await store.cancel([third.id])
        assert cancelled.cancelled
        done = await calls.complete_many(held(rest), {rest[0].id: {"ok": 1}})
        assert len(done) == 28 and all(done.values())
        assert not any((await calls.complete_many(held(rest[:3]))).values())

        stats = await store.stats()
        assert stats.count(JobStatus.SUCCEEDED) == 28
        assert stats.count(JobStatus.DEAD) == 1 and stats.count(JobStatus.CANCELLED) == 1
        assert stats.count(JobStatus.QUEUED) + stats.count(JobStatus.RETRYING) == 1
        got = await store.get(rest[0].id)
        assert got is not None and got.status == JobStatus.SUCCEEDED and got.result == {"ok": 1}
        [requeued] = await store.requeue(type="t")  # the dead job, found on its own stream
        assert requeued.id == second.id and requeued.status == JobStatus.QUEUED
        with pytest.raises(JobNotFound):
            await store.requeue([first.id, UUID(int=second.id.int + 3)])  # no such job, on its stream

    run(cluster, scenario)


def test_a_key_is_unique_across_every_partition(cluster: LocalCluster) -> None:
    """A keyed job lives on its key's partition, so its key and record are one atomic batch of one stream:
    a key held by a live job of any type answers that job, and is free again once it is cancelled."""

    async def scenario(store: AsyncJetStreamStore, _: AsyncWorkerCalls) -> None:
        keys = [f"doc-{n}" for n in range(12)]
        assert len({key_partition(k, 3) for k in keys}) == 3  # these keys reach every partition
        first = await store.enqueue_many([NewJob(type="a", idempotency_key=k) for k in keys])
        for r, key in zip(first, keys, strict=True):
            assert id_partition(r.id, 3) == key_partition(key, 3)
        again = await store.enqueue_many(
            [
                NewJob(type="b", idempotency_key=keys[0]),
                NewJob(type="b"),
                NewJob(type="b", idempotency_key="new"),
                NewJob(type="b", idempotency_key="new"),
            ]
        )
        assert [r.inserted for r in again] == [False, True, True, False]
        assert again[0].id == first[0].id and again[3].id == again[2].id
        one = await store.enqueue(NewJob(type="c", idempotency_key=keys[5]))
        assert not one.inserted and one.id == first[5].id
        await store.cancel([first[5].id])
        freed = await store.enqueue(NewJob(type="c", idempotency_key=keys[5]))
        assert freed.inserted and freed.id != first[5].id

    run(cluster, scenario)


def test_a_claim_takes_its_limit_from_jobs_all_on_one_partition(cluster: LocalCluster) -> None:
    """Keys may send every job to one partition: a claim still takes as many as it asks (each partition is
    first asked for its share, then the ones that gave all of it for the rest), and no more."""

    async def scenario(store: AsyncJetStreamStore, calls: AsyncWorkerCalls) -> None:
        keys = [k for k in (f"doc-{n}" for n in range(100)) if key_partition(k, 3) == 1][:8]
        await store.enqueue_many([NewJob(type="t", idempotency_key=k) for k in keys])
        await asyncio.sleep(0.3)  # every dispatch reached its consumer: the claim below finds all 8
        claimed = await calls.claim(["t"], "w", LEASE, 6)
        assert len(claimed) == 6 and {j.idempotency_key for j in claimed} <= set(keys)
        rest = await calls.claim(["t"], "w", LEASE, 6)
        assert len(rest) == 2 and not {j.id for j in claimed} & {j.id for j in rest}

    run(cluster, scenario)


def test_a_worker_drains_every_partition_with_retries(cluster: LocalCluster) -> None:
    async def scenario(store: AsyncJetStreamStore, _: AsyncWorkerCalls) -> None:
        await store.enqueue_many([NewJob(type="flaky", payload={"n": n}) for n in range(40)])
        seen: Counter[int] = Counter()

        async def flaky(payload: dict[str, Any]) -> None:
            seen[payload["n"]] += 1
            if seen[payload["n"]] == 1:
                raise Retry(after=timedelta(milliseconds=50))

        worker = Worker(store, poll_interval=0.05, schedules=False, batch_size=10)
        worker.register("flaky", flaky)
        running = asyncio.create_task(worker.arun(install_signals=False))
        deadline = time.monotonic() + 60
        while (await store.stats()).count(JobStatus.SUCCEEDED) < 40 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        worker.stop()
        summary = await asyncio.wait_for(running, 30)
        assert summary.succeeded == 40 and summary.retrying == 40
        assert set(seen.values()) == {2}

    run(cluster, scenario)


def test_a_store_opened_with_another_number_of_partitions_is_told_which(cluster: LocalCluster) -> None:
    async def main() -> None:
        made = fresh_store(cluster, partitions=2)
        async with made:
            await made.migrate()
            for partitions in (1, 3):
                other = AsyncJetStreamStore(
                    cluster.url, prefix=made.layout.prefix, stream=made.layout.stream, partitions=partitions
                )
                async with other:  # every call, not only the worker's schema check
                    for call in (
                        other.schema_version,
                        functools.partial(other.enqueue, NewJob(type="t")),
                        other.stats,
                    ):
                        with pytest.raises(
                            ConfigurationError, match=r"JOBKIT_NATS_PARTITIONS\): set it to 2"
                        ):
                            await call()
            assert (await made.stats()).count() == 0  # nothing was written by the others
            await made.drop()

    asyncio.run(main())
    with pytest.raises(ConfigurationError, match="JOBKIT_NATS_PARTITIONS must be 1 to 64"):
        AsyncJetStreamStore(cluster.url, partitions=65)
