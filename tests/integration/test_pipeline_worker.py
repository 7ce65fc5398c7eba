"""A Worker running pipelines, on every kind of store: a handler fans out (its jobs exist once it has
completed), a fan-in is handed every result in order, sync and async handlers alike; a fan-out the store
refuses fails its job alone, for good, saying why."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest

from pgjobkit import JobStatus, MemoryStore, NewJob, TransientError, Worker, current
from pgjobkit.core.pipelines import Pipeline
from pgjobkit.ops import Call
from pgjobkit.stores.base import JobStore
from tests.integration.stores import open_store


@pytest.fixture(params=["memory", "postgres", "supabase"])
def store(request: pytest.FixtureRequest) -> Iterator[JobStore]:
    s = open_store(request.param, request)
    try:
        yield s
    finally:
        s.close()


def _pipeline_worker(store: JobStore, chunks: int, ran: Counter[str], seen: list[Any]) -> Worker:
    worker = Worker(store, schedules=False, poll_interval=0.05, batch_size=8, concurrency=4)

    @worker.handler("sync")
    def sync(payload: dict[str, Any]) -> dict[str, Any]:
        ran["sync"] += 1
        return {"documents": 1}

    @worker.handler("transcribe")
    async def transcribe(payload: dict[str, Any]) -> dict[str, Any]:
        ran["transcribe"] += 1
        [dep] = await current().adependencies()
        assert dep.result == {"documents": 1}
        return {"text": "words " * chunks}

    @worker.handler("chunk")
    def chunk(payload: dict[str, Any]) -> None:
        ran["chunk"] += 1
        [dep] = current().dependencies()
        words = dep.result["text"].split()
        ctx = current()
        embeds = [ctx.add("embed", {"n": n, "word": w}) for n, w in enumerate(words)]
        ctx.add("reindex", {}, after=embeds)

    @worker.handler("embed")
    async def embed(payload: dict[str, Any]) -> dict[str, Any]:
        ran["embed"] += 1
        return {"n": payload["n"], "vector": [payload["n"], 1]}

    @worker.handler("reindex")
    def reindex(payload: dict[str, Any]) -> dict[str, Any]:
        ran["reindex"] += 1
        deps = current().dependencies()
        seen.extend(d.result["n"] for d in deps)
        return {"indexed": len(deps)}

    return worker


def test_a_pipeline_fans_out_and_in_with_its_results_handed_on(store: JobStore) -> None:
    p = Pipeline()
    s = p.add("sync", {"source": "drive"})
    t = p.add("transcribe", after=s)
    p.add("chunk", after=t)
    e = store.enqueue_pipeline(p)
    assert e.pipeline_id is not None
    ran: Counter[str] = Counter()
    seen: list[Any] = []
    _pipeline_worker(store, 30, ran, seen).run(until_empty=True, install_signals=False)
    assert ran == Counter({"sync": 1, "transcribe": 1, "chunk": 1, "embed": 30, "reindex": 1})
    assert seen == list(range(30))  # every result, in the order the chunk job added them
    progress = store.pipeline_progress(e.pipeline_id)
    assert progress is not None and progress.finished and (progress.total, progress.succeeded) == (34, 34)
    tree = store.get_pipeline(e.pipeline_id)
    [chunk_job] = [j for j in tree if j.type == "chunk"]
    assert all(j.parent_id == chunk_job.id for j in tree if j.type in ("embed", "reindex"))
    [reindex_job] = [j for j in tree if j.type == "reindex"]
    done = store.get(reindex_job.id)
    assert done is not None and done.result == {"indexed": 30}


def test_a_fan_out_the_store_refuses_fails_its_job_alone(store: JobStore) -> None:
    worker = Worker(store, schedules=False, poll_interval=0.05)

    @worker.handler("chunk")
    def chunk(payload: dict[str, Any]) -> None:
        current().add("embed", {"n": 1}, after=[UUID("00000000-0000-4000-8000-000000000000")])

    @worker.handler("other")
    def other(payload: dict[str, Any]) -> str:
        return "fine"

    bad = store.enqueue_pipeline(_one("chunk")).jobs[0].id
    fine = store.enqueue_pipeline(_one("other")).jobs[0].id
    summary = worker.run(until_empty=True, install_signals=False)
    assert (summary.dead, summary.succeeded) == (1, 1)
    failed = store.get(bad)
    assert failed is not None and failed.status == JobStatus.DEAD and failed.error is not None
    assert "jobs its handler added were refused" in failed.error and "does not exist" in failed.error
    assert store.list_jobs(type="embed") == []  # nothing of it was added
    ok = store.get(fine)
    assert ok is not None and ok.status == JobStatus.SUCCEEDED


def _one(type: str) -> Pipeline:
    p = Pipeline()
    p.add(type)
    return p


def test_an_async_handler_asking_for_the_blocking_read_is_told_which_to_use(store: JobStore) -> None:
    worker = Worker(store, schedules=False, poll_interval=0.05)

    @worker.handler("x")
    async def x(payload: dict[str, Any]) -> None:
        current().dependencies()

    job = store.enqueue_pipeline(_one("x")).jobs[0].id
    worker.run(until_empty=True, install_signals=False)
    failed = store.get(job)
    assert (
        failed is not None and failed.error is not None and "await current().adependencies()" in failed.error
    )


def test_a_cancelled_pipeline_stops_within_one_heartbeat(store: JobStore) -> None:
    """Lease 1.2 s, so a heartbeat every 0.2 s: the running handlers (one async, one sync that checks
    ``cancelled``) stop at the next beat, and nothing of the pipeline is left queued, waiting or running."""
    worker = Worker(store, schedules=False, poll_interval=0.05, lease=timedelta(seconds=1.2), concurrency=4)
    started: list[str] = []
    stopped_at: list[float] = []

    @worker.handler("slow_async")
    async def slow_async(payload: dict[str, Any]) -> None:
        started.append("async")
        try:
            await asyncio.sleep(30)
        finally:
            stopped_at.append(time.monotonic())

    @worker.handler("slow_sync")
    def slow_sync(payload: dict[str, Any]) -> None:
        started.append("sync")
        while not current().cancelled:
            time.sleep(0.01)
        stopped_at.append(time.monotonic())

    p = Pipeline()
    a, b = p.add("slow_async"), p.add("slow_sync")
    later = p.add("after", after=[a, b])
    p.add("after", after=later)
    e = store.enqueue_pipeline(p)
    assert e.pipeline_id is not None
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while len(started) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(started) == ["async", "sync"]
        cancelled_at = time.monotonic()
        assert store.cancel_pipeline(e.pipeline_id) == 4
        while len(stopped_at) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        worker.stop()
        thread.join(10)
    # a beat is 0.2 s; bounded by the lease, so that a slow machine passes and a missed beat does not
    assert len(stopped_at) == 2 and max(stopped_at) - cancelled_at < 1.2
    progress = store.pipeline_progress(e.pipeline_id)
    assert progress is not None and (
        progress.cancelled,
        progress.running,
        progress.queued,
        progress.waiting,
    ) == (
        4,
        0,
        0,
        0,
    )


class FlakyAddingStore(MemoryStore):
    """The memory store, whose first ``jobkit_complete_adding`` fails as a dropped connection would."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def _execute(self, call: Call, conn: Any = None) -> Any:
        if call.fn == "jobkit_complete_adding" and not self.failed:
            self.failed = True
            raise TransientError("jobkit: database connection failed: gone")
        return super()._execute(call, conn)


def test_a_store_fault_on_a_completion_that_adds_loses_nothing_of_the_batch() -> None:
    """The fault comes while the fan-out's job and plain jobs finished together wait to be completed:
    all of them are completed at the next round trip, once each, and the fan-out is added once."""
    store = FlakyAddingStore()
    worker = Worker(store, schedules=False, poll_interval=0.05, batch_size=8, concurrency=8)
    ran: Counter[str] = Counter()

    @worker.handler("fan")
    def fan(payload: dict[str, Any]) -> None:
        ran["fan"] += 1
        current().add("leaf", {})

    @worker.handler("plain")
    def plain(payload: dict[str, Any]) -> None:
        ran["plain"] += 1

    @worker.handler("leaf")
    def leaf(payload: dict[str, Any]) -> None:
        ran["leaf"] += 1

    store.enqueue_pipeline(_one("fan"))
    store.enqueue_many([NewJob(type="plain") for _ in range(5)])
    summary = worker.run(until_empty=True, install_signals=False)
    assert store.failed and ran == Counter({"fan": 1, "plain": 5, "leaf": 1})
    assert summary.succeeded == 7 and summary.lost == 0
    assert {j.status for j in store.list_jobs()} == {JobStatus.SUCCEEDED}
