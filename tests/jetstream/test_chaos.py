"""The chaos tests. On a cluster of its own: workers process N jobs while the stream's leader node is
SIGKILLed and one worker (run alone first) dies holding its first batch; and worker processes SIGKILLed
at random, the stream's leader node among them (the last test). 0 jobs lost, none left running, each completed once, and
no job run twice except those the dead worker held. CI runs 200 jobs; JOBKIT_CHAOS_FULL=1 runs 5,000 (the
same flag as tests/chaos).

The surviving workers' lease (15 s) outlasts the pause a leader election makes (4 to 9 s): a lease shorter
than the pause expires while its worker waits to complete, the job is reclaimed, and it runs twice, which
at-least-once allows (a lost lease) and this test would report. The dead worker's lease is 2 s, so its
batch comes back soon."""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import Counter
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest

from pgjobkit.core.models import JobStatus, NewJob
from pgjobkit.errors import JobkitError, TransientError
from pgjobkit.natscluster import LocalCluster
from pgjobkit.stores.jetstream import AsyncJetStreamStore
from pgjobkit.worker.calls_async import AsyncWorkerCalls
from tests.chaos.conftest import CHAOS_TABLE, Fleet
from tests.jetstream.store_helpers import fresh_store

JOBS = 5000 if os.environ.get("JOBKIT_CHAOS_FULL") == "1" else 200
LEASE = timedelta(seconds=15)
VICTIM_LEASE = timedelta(seconds=2)
WORKERS = 3
BATCH = 10


class Run:
    def __init__(self) -> None:
        self.runs: Counter[UUID] = Counter()  # handler executions per job
        self.completed: Counter[UUID] = Counter()  # completions that won, per job
        self.victim_held: set[UUID] = set()
        self.stop = asyncio.Event()


async def work(store: AsyncJetStreamStore, name: str, run: Run, die_after: int | None = None) -> None:
    """A worker's loop: claim a batch, run each (a short sleep), complete them together. ``die_after``:
    on that batch, stop dead holding it (its connection closed, nothing completed), as a crash does."""
    calls = AsyncWorkerCalls(store)
    lease = LEASE if die_after is None else VICTIM_LEASE
    batches = 0
    while not run.stop.is_set():
        try:
            jobs = await calls.claim(["chaos"], name, lease, BATCH)
        except TransientError:
            continue
        if not jobs:
            await asyncio.sleep(0.02)
            continue
        batches += 1
        for job in jobs:
            run.runs[job.id] += 1
        if die_after is not None and batches == die_after:
            run.victim_held = {j.id for j in jobs}
            await store.close()
            return
        await asyncio.sleep(0.005)
        done = [(j.id, j.lease_token) for j in jobs if j.lease_token is not None]
        while True:
            try:
                won = await calls.complete_many(done)
                break
            except TransientError:
                continue
        for job_id, ok in won.items():
            if ok:
                run.completed[job_id] += 1


async def stream_leader(store: AsyncJetStreamStore) -> str:
    info = await store.functions.wire.js.stream_info(store.layout.stream)
    assert info.cluster is not None and info.cluster.leader
    return info.cluster.leader


@pytest.mark.timeout(240)
def test_the_stream_leader_killed_mid_run_loses_nothing() -> None:
    try:
        nodes = LocalCluster(3).start()
    except JobkitError as exc:
        pytest.fail(f"the chaos test needs a 3-node nats-server cluster: {exc}", pytrace=False)

    async def main() -> tuple[Run, dict[JobStatus, int], str, float]:
        run = Run()
        admin = fresh_store(nodes, ack_wait=5.0)
        await admin.open()
        await admin.migrate()
        for start in range(0, JOBS, 300):
            await admin.enqueue_many(
                [
                    NewJob(type="chaos", payload={"n": n}, max_attempts=20)
                    for n in range(start, min(JOBS, start + 300))
                ]
            )
        stores = [admin]
        try:
            for _ in range(WORKERS + 1):
                s = AsyncJetStreamStore(
                    nodes.url, prefix=admin.layout.prefix, stream=admin.layout.stream, ack_wait=5.0
                )
                await s.open()
                stores.append(s)
            # The victim runs alone first, so the batch it dies holding is certain, not a race it may
            # lose to the other workers on a loaded machine; they start once it is dead.
            await asyncio.wait_for(work(stores[-1], "victim", run, die_after=1), timeout=60)
            tasks = [asyncio.create_task(work(s, f"w{i}", run)) for i, s in enumerate(stores[1:-1])]
            started = time.monotonic()
            while sum(run.completed.values()) < JOBS * 0.3:
                assert time.monotonic() - started < 60, f"the workers completed {len(run.completed)}"
                await asyncio.sleep(0.01)
            leader = await stream_leader(admin)
            nodes.kill(leader)
            killed_at = time.monotonic()
            deadline = time.monotonic() + 150
            while len(run.completed) < JOBS and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            took = time.monotonic() - killed_at
            run.stop.set()
            await asyncio.gather(*tasks)
            stats = await admin.stats()
            counts = {s: stats.count(s) for s in JobStatus}
        finally:
            run.stop.set()
            for s in stores:
                await s.close()
        return run, counts, leader, took

    try:
        run, counts, leader, took = asyncio.run(main())
    finally:
        nodes.stop()
    print(f"{JOBS} jobs; stream leader {leader} killed; the rest took {took:.1f}s")
    assert run.victim_held, "the victim worker never died holding a batch"
    assert counts[JobStatus.SUCCEEDED] == JOBS, counts  # none lost
    assert counts[JobStatus.RUNNING] == 0, counts
    assert set(run.completed) == set(run.runs) and len(run.completed) == JOBS
    assert max(run.completed.values()) == 1  # each completed once
    twice = {job_id for job_id, n in run.runs.items() if n > 1}
    assert twice <= run.victim_held, twice - run.victim_held


@pytest.mark.timeout(240)
def test_sigkilled_worker_processes_and_the_stream_leader_lose_nothing(
    db_url: str, pg: psycopg.Connection[Any]
) -> None:
    """Worker processes on JetStream (tests/chaos/worker_proc.py, the same as the PostgreSQL crash test's)
    SIGKILLed at random while they work, and the stream's leader node killed among them, on a cluster of
    its own: every job succeeded, none left running, and each ran once except those a killed worker held
    (at most 4 a kill: concurrency 4, batch 4, 40 ms jobs). The lease (15 s) outlasts the election."""
    try:
        nodes = LocalCluster(3).start()
    except JobkitError as exc:
        pytest.fail(f"the chaos test needs a 3-node nats-server cluster: {exc}", pytrace=False)
    total = 5 * JOBS  # CI 1,000; JOBKIT_CHAOS_FULL=1 25,000
    queue = fresh_store(nodes, ack_wait=5.0)

    def reopened() -> AsyncJetStreamStore:
        return AsyncJetStreamStore(nodes.url, prefix=queue.layout.prefix, stream=queue.layout.stream)

    async def prepare() -> None:
        async with queue:
            await queue.migrate()
            for start in range(0, total, 300):
                size = min(300, total - start)
                await queue.enqueue_many([NewJob(type="chaos", max_attempts=20) for _ in range(size)])

    async def counts() -> dict[JobStatus, int]:
        async with reopened() as q:
            stats = await q.stats()
            return {s: stats.count(s) for s in JobStatus}

    async def leader() -> str:
        async with reopened() as q:
            return await stream_leader(q)

    def done() -> bool:
        runs = pg.execute("select count(distinct job_id) as n from chaos_runs").fetchone()
        return runs is not None and runs["n"] == total and asyncio.run(counts())[JobStatus.SUCCEEDED] == total

    fleet = Fleet(
        db_url,
        CHAOS_LEASE="15",
        CHAOS_WORK_SECONDS="0.04",
        CHAOS_NATS_URL=nodes.url,
        CHAOS_NATS_PREFIX=queue.layout.prefix,
        CHAOS_NATS_STREAM=queue.layout.stream,
        CHAOS_NATS_ACK_WAIT="5",  # a worker killed between its claim's write and the lease's schedule
    )
    try:
        asyncio.run(prepare())
        pg.execute(CHAOS_TABLE)
        for _ in range(3):
            fleet.start()
        rng = random.Random(44)
        fleet.churn(rng, done, seconds=4)
        killed = asyncio.run(leader())
        nodes.kill(killed)
        fleet.churn(rng, done, seconds=4)
        deadline = time.monotonic() + 120  # the killed workers' jobs: back after their lease
        while not done() and time.monotonic() < deadline:
            time.sleep(0.5)
        statuses = asyncio.run(counts())
    finally:
        fleet.stop_all()
        nodes.stop()
    runs = pg.execute("select count(*) as runs, count(distinct job_id) as jobs from chaos_runs").fetchone()
    assert runs is not None
    extra, bound = runs["runs"] - runs["jobs"], fleet.kills * 4
    print(f"\njetstream chaos: {total} jobs, leader {killed} and {fleet.kills} workers killed, {extra} extra")
    assert fleet.kills >= 3, "the run was too short to be chaos"
    assert statuses[JobStatus.SUCCEEDED] == total and statuses[JobStatus.RUNNING] == 0, statuses
    assert runs["jobs"] == total, "every job ran"
    assert extra <= bound, "each job ran once, except jobs held by a killed worker"
