"""The JetStream store's figures (``--only nats``): enqueue and processing at batch 50 on a stream of 1 and
of 3 replicas of one 3-node loopback cluster (``pgjobkit.natscluster``, fsync on every write), on a queue
of 1 partition and, at 3 replicas, of 3 partitions (3 streams, their leaders placed by the cluster),
beside PostgresStore doing the same in the same run; and the projection's lag into the bench database
(``pgjobkit.stores.jetstream.projector``, running as ``pgjobkit nats project`` does).

Each figure is jobkit's everyday API: ``enqueue`` one per call, ``enqueue_many`` in batches of 333 (the
store's atomic batch), and the real ``Worker`` (async store, no-op async handler) until the queue is empty.
"""

from __future__ import annotations

import asyncio
import functools
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from pgjobkit import NewJob, Worker
from pgjobkit.natscluster import LocalCluster
from pgjobkit.stores.jetstream import MAX_ATOMIC_JOBS, AsyncJetStreamStore
from pgjobkit.stores.postgres import PostgresStore
from pgjobkit.worker.options import WorkerOptions


async def _noop(payload: dict[str, Any]) -> None:
    pass


def _fresh(cluster: LocalCluster, partitions: int = 1) -> AsyncJetStreamStore:
    name = uuid.uuid4().hex[:10]
    return AsyncJetStreamStore(cluster.url, prefix=f"b{name}", stream=f"B{name}", partitions=partitions)


def jetstream_enqueue(
    cluster: LocalCluster, replicas: int, jobs: int, *, batch: int, partitions: int = 1, writers: int = 1
) -> float:
    """jobs/s enqueued on a fresh queue of ``replicas`` and ``partitions``: ``batch`` 1 is ``enqueue`` per
    call, else ``enqueue_many`` of ``batch``, ``writers`` calls at a time (one writer's calls wait for each
    other's round trip: more partitions only pay with writers enough to keep their leaders busy)."""

    async def main() -> float:
        async with _fresh(cluster, partitions) as store:
            await store.migrate(replicas)
            start = time.perf_counter()
            if batch == 1:
                for _ in range(jobs):
                    await store.enqueue(NewJob(type="noop"))
            else:
                calls = [min(batch, jobs - first) for first in range(0, jobs, batch)]
                for n in range(0, len(calls), writers):
                    await asyncio.gather(
                        *(store.enqueue_many([NewJob(type="noop")] * size) for size in calls[n : n + writers])
                    )
            return jobs / (time.perf_counter() - start)

    return asyncio.run(main())


def jetstream_process(
    cluster: LocalCluster, replicas: int, jobs: int, *, batch: int = 50, partitions: int = 1
) -> float:
    """jobs/s through the real Worker (concurrency 50, ``batch``) on a fresh queue, until it is empty."""

    async def main() -> float:
        async with _fresh(cluster, partitions) as store:
            await store.migrate(replicas)
            for first in range(0, jobs, MAX_ATOMIC_JOBS):
                await store.enqueue_many([NewJob(type="noop")] * min(MAX_ATOMIC_JOBS, jobs - first))
            options = WorkerOptions(poll_interval=0.05, schedules=False, batch_size=batch)
            worker = Worker(store, options=options)
            worker.register("noop", _noop)
            start = time.perf_counter()
            summary = await worker.arun(install_signals=False, until_empty=True)
            seconds = time.perf_counter() - start
            assert summary.succeeded == jobs, summary
            return jobs / seconds

    return asyncio.run(main())


def projection_lag(cluster: LocalCluster, url: str, jobs: int = 50) -> float:
    """The median ms from an enqueue on JetStream (R3) until its job is in ``url``'s jobkit_jobs, one job
    at a time (each looked for every 2 ms), with a projector running."""
    import psycopg

    from pgjobkit.stores.jetstream.projector import Projector
    from pgjobkit.stores.postgres import AsyncPostgresStore

    async def main() -> float:
        async with _fresh(cluster) as source, AsyncPostgresStore(url, max_size=2) as target:
            await source.migrate(3)
            projector, stop = Projector(source, target), asyncio.Event()
            running = asyncio.create_task(projector.run(stop))
            lags = []
            try:
                async with await psycopg.AsyncConnection.connect(url, autocommit=True) as pg:
                    for _ in range(jobs):
                        job = await source.enqueue(NewJob(type="noop"))
                        start = time.perf_counter()
                        while not await (
                            await pg.execute("select 1 from public.jobkit_jobs where id = %s", (job.id,))
                        ).fetchone():
                            await asyncio.sleep(0.002)
                        lags.append((time.perf_counter() - start) * 1000)
                        await asyncio.sleep(0.02)
            finally:
                stop.set()
                await running
                await projector.close()
                await source.drop()
            return statistics.median(lags)

    return asyncio.run(main())


def postgres_enqueue(url: str, jobs: int, *, batch: int) -> float:
    """The same enqueues on PostgresStore (``batch`` 1: ``enqueue`` per call)."""
    store = PostgresStore(url, max_size=2)
    try:
        start = time.perf_counter()
        if batch == 1:
            for _ in range(jobs):
                store.enqueue(NewJob(type="noop"))
        else:
            for first in range(0, jobs, batch):
                store.enqueue_many([NewJob(type="noop")] * min(batch, jobs - first))
        return jobs / (time.perf_counter() - start)
    finally:
        store.close()


def figures(
    url: str, jobs: int, measure: Callable[[str, Callable[[], float], str], float]
) -> dict[str, float]:
    """Every figure of the section, measured with ``measure(name, fn, unit)`` (which resets ``url``'s
    queue before each run); the ratios JetStream / PostgreSQL."""
    from bench import scenarios

    ratios: dict[str, float] = {}
    one = max(jobs // 10, 200)
    with LocalCluster(3) as cluster:
        pg_one = measure(
            "PostgresStore: enqueue, one per call", lambda: postgres_enqueue(url, one, batch=1), "jobs/s"
        )
        pg_many = measure(
            f"PostgresStore: enqueue_many, batches of {MAX_ATOMIC_JOBS}",
            lambda: postgres_enqueue(url, jobs, batch=MAX_ATOMIC_JOBS),
            "jobs/s",
        )
        pg_process = measure(
            "PostgresStore: Worker, batch 50", lambda: scenarios.process(url, jobs, batch=50), "jobs/s"
        )
        for replicas in (1, 3):
            at = f"JetStream R{replicas}"
            js_one = measure(
                f"{at}: enqueue, one per call",
                functools.partial(jetstream_enqueue, cluster, replicas, one, batch=1),
                "jobs/s",
            )
            js_many = measure(
                f"{at}: enqueue_many, batches of {MAX_ATOMIC_JOBS}",
                functools.partial(jetstream_enqueue, cluster, replicas, jobs, batch=MAX_ATOMIC_JOBS),
                "jobs/s",
            )
            js_process = measure(
                f"{at}: Worker, batch 50",
                functools.partial(jetstream_process, cluster, replicas, jobs),
                "jobs/s",
            )
            ratios[f"{at} / PostgresStore: enqueue one"] = js_one / pg_one
            ratios[f"{at} / PostgresStore: enqueue_many"] = js_many / pg_many
            ratios[f"{at} / PostgresStore: Worker batch 50"] = js_process / pg_process
        many_p1 = measure(
            f"JetStream R3, 1 partition: enqueue_many, batches of {MAX_ATOMIC_JOBS}, 4 at a time",
            functools.partial(jetstream_enqueue, cluster, 3, jobs, batch=MAX_ATOMIC_JOBS, writers=4),
            "jobs/s",
        )
        at = "JetStream R3, 3 partitions"
        many_p3 = measure(
            f"{at}: enqueue_many, batches of {MAX_ATOMIC_JOBS}, 4 at a time",
            functools.partial(
                jetstream_enqueue, cluster, 3, jobs, batch=MAX_ATOMIC_JOBS, partitions=3, writers=4
            ),
            "jobs/s",
        )
        process_p3 = measure(
            f"{at}: Worker, batch 50",
            functools.partial(jetstream_process, cluster, 3, jobs, partitions=3),
            "jobs/s",
        )
        ratios[f"{at} / PostgresStore: enqueue_many"] = many_p3 / pg_many
        ratios[f"{at} / PostgresStore: Worker batch 50"] = process_p3 / pg_process
        ratios[f"{at} / 1 partition: enqueue_many, 4 at a time"] = many_p3 / many_p1
        ratios[f"{at} / 1 partition: Worker batch 50"] = process_p3 / js_process
        measure(
            "JetStream R3 -> jobkit_jobs: the projection's lag, one job at a time (median)",
            functools.partial(projection_lag, cluster, url),
            "ms",
        )
    return ratios
