"""The Worker driven by tick() on the memory store: every outcome a handler can produce."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import pytest
from pydantic import BaseModel

from pgjobkit import (
    AsyncMemoryStore,
    Enqueued,
    InvalidArgument,
    Job,
    JobStatus,
    MemoryStore,
    NewJob,
    Permanent,
    Retry,
    Worker,
    current,
)
from pgjobkit.ops import Call
from pgjobkit.worker.exchange import AHEAD, RESCAN, ClaimCursor


class Embed(BaseModel):
    doc_id: int


def make(store: MemoryStore | None = None, **kw: Any) -> tuple[MemoryStore, Worker]:
    store = store or MemoryStore()
    return store, Worker(store, name="test-worker", jitter=0.0, **kw)


def status_of(store: MemoryStore, job: Job | Enqueued) -> Job:
    got = store.get(job.id)
    assert got is not None
    return got


def test_success_with_payload_model() -> None:
    store, worker = make()
    seen: list[int] = []

    @worker.handler("embed", payload=Embed)
    def embed(payload: Embed) -> None:
        seen.append(payload.doc_id)

    job = store.enqueue(NewJob(type="embed", payload={"doc_id": 7}))
    result = worker.tick()
    assert (result.claimed, result.count("succeeded")) == (1, 1)
    assert seen == [7]
    assert status_of(store, job).status == JobStatus.SUCCEEDED
    assert worker.tick().claimed == 0
    worker.close()


def test_handler_gets_the_job_when_it_asks() -> None:
    store, worker = make()
    got: list[tuple[dict[str, Any], int]] = []
    worker.register("t", lambda payload, job: got.append((payload, job.attempts)))
    store.enqueue(NewJob(type="t", payload={"a": 1}))
    worker.tick()
    assert got == [({"a": 1}, 1)]
    worker.close()


def test_exception_retries_with_backoff_then_dies() -> None:
    store, worker = make()

    @worker.handler("flaky")
    def flaky(payload: dict[str, Any]) -> None:
        raise RuntimeError("upstream 502")

    job = store.enqueue(NewJob(type="flaky", max_attempts=2))
    before = datetime.now(UTC)
    r = worker.tick()
    assert r.results[0].outcome == "retrying" and r.results[0].error == "RuntimeError: upstream 502"
    j = status_of(store, job)
    assert j.status == JobStatus.RETRYING
    assert 0.9 <= (j.run_after - before).total_seconds() <= 2  # backoff(1) = 1 s
    assert worker.tick().claimed == 0  # not yet runnable
    store._put(j.model_copy(update={"run_after": datetime.now(UTC)}))
    assert worker.tick().results[0].outcome == "dead"
    assert status_of(store, job).error == "RuntimeError: upstream 502"
    worker.close()


def test_retry_after_and_permanent() -> None:
    store, worker = make()

    @worker.handler("later")
    def later(payload: dict[str, Any]) -> None:
        raise Retry("rate limited", after=120)

    @worker.handler("never")
    def never(payload: dict[str, Any]) -> None:
        raise Permanent("document deleted")

    a = store.enqueue(NewJob(type="later", max_attempts=5))
    b = store.enqueue(NewJob(type="never", max_attempts=5))
    before = datetime.now(UTC)
    outcomes = {r.job_id: r.outcome for r in worker.tick().results} | {
        r.job_id: r.outcome for r in worker.tick().results
    }
    assert outcomes == {a.id: "retrying", b.id: "dead"}
    assert 119 <= (status_of(store, a).run_after - before).total_seconds() <= 122
    assert status_of(store, b).error == "Permanent: document deleted"
    worker.close()


def test_rejected_payload_is_permanent() -> None:
    store, worker = make()
    calls: list[Embed] = []
    worker.register("embed", calls.append, payload=Embed)
    job = store.enqueue(NewJob(type="embed", payload={"doc_id": "not a number"}, max_attempts=5))
    assert worker.tick().results[0].outcome == "dead"
    assert calls == []
    assert "payload rejected by Embed" in (status_of(store, job).error or "")
    worker.close()


def test_handler_max_attempts_caps_the_job() -> None:
    store, worker = make()

    @worker.handler("capped", max_attempts=1)
    def capped(payload: dict[str, Any]) -> None:
        raise RuntimeError("x")

    job = store.enqueue(NewJob(type="capped", max_attempts=10))
    assert worker.tick().results[0].outcome == "dead"
    assert status_of(store, job).attempts == 1
    worker.close()


def test_unknown_types_are_not_claimed() -> None:
    store, worker = make()
    worker.register("mine", lambda p: None)
    other = store.enqueue(NewJob(type="theirs"))
    assert worker.tick().claimed == 0
    assert status_of(store, other).status == JobStatus.QUEUED
    worker.close()


def test_async_handler() -> None:
    store, worker = make()
    done: list[int] = []

    @worker.handler("a")
    async def handler(payload: dict[str, Any]) -> None:
        await asyncio.sleep(0)
        done.append(payload["n"])

    store.enqueue_many([NewJob(type="a", payload={"n": i}) for i in range(3)])
    worker.configure(batch_size=3)
    assert worker.tick().count("succeeded") == 3
    assert sorted(done) == [0, 1, 2]
    worker.close()


def test_concurrency_bounds_async_jobs_in_flight_whatever_the_batch() -> None:
    store, worker = make(concurrency=3, batch_size=20)
    now, most = 0, 0

    @worker.handler("a")
    async def handler(payload: dict[str, Any]) -> None:
        nonlocal now, most
        now += 1
        most = max(most, now)
        await asyncio.sleep(0.01)
        now -= 1

    store.enqueue_many([NewJob(type="a")] * 20)
    assert worker.tick().count("succeeded") == 20
    assert most == 3
    worker.close()


def test_tick_runs_a_batch_concurrently() -> None:
    store, worker = make(concurrency=4, batch_size=4)
    barrier = threading.Barrier(4, timeout=5)
    worker.register("t", lambda p: barrier.wait())  # deadlocks unless all four run at once
    store.enqueue_many([NewJob(type="t")] * 4)
    assert worker.tick().count("succeeded") == 4
    worker.close()


def test_logs_carry_id_type_attempt(caplog: pytest.LogCaptureFixture) -> None:
    store, worker = make()
    worker.register("t", lambda p: None)
    job = store.enqueue(NewJob(type="t", payload={"secret": "do-not-log"}))
    with caplog.at_level(logging.INFO, logger="pgjobkit.worker"):
        worker.tick()
    [record] = [r for r in caplog.records if "succeeded" in r.getMessage()]
    assert (
        str(job.id) in record.getMessage()
        and "type=t" in record.getMessage()
        and "attempt=1" in record.getMessage()
    )
    assert record.__dict__["job_id"] == str(job.id)
    assert "do-not-log" not in caplog.text
    worker.close()


def test_lost_lease_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    store, worker = make()

    @worker.handler("t")
    def steal(payload: dict[str, Any], job: Job) -> None:
        store.reset()  # the job vanishes under the worker (as if pruned or reclaimed elsewhere)

    store.enqueue(NewJob(type="t"))
    with caplog.at_level(logging.WARNING, logger="pgjobkit.worker"):
        assert worker.tick().results[0].outcome == "lost"
    assert "lease was lost" in caplog.text
    worker.close()


def test_bad_configuration() -> None:
    store = MemoryStore()
    with pytest.raises(InvalidArgument, match="concurrency"):
        Worker(store, concurrency=0)
    with pytest.raises(InvalidArgument, match="lease"):
        Worker(store, lease=timedelta(0))
    worker = Worker(store)
    worker.register("t", lambda p: None)
    with pytest.raises(InvalidArgument, match="already registered"):
        worker.register("t", lambda p: None)
    with pytest.raises(InvalidArgument, match="payload"):
        worker.register("u", lambda: None)
    with pytest.raises(InvalidArgument, match="register a handler"):
        Worker(store).tick()


def test_run_processes_until_stopped_and_drains() -> None:
    store, worker = make(concurrency=2, poll_interval=0.05)
    started = threading.Event()
    release = threading.Event()
    finished: list[int] = []

    @worker.handler("slow")
    def slow(payload: dict[str, Any]) -> None:
        started.set()
        release.wait(5)
        finished.append(payload["n"])

    store.enqueue_many([NewJob(type="slow", payload={"n": i}) for i in range(2)])
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    assert started.wait(5)
    worker.stop()  # graceful: in-flight jobs finish
    time.sleep(0.1)
    release.set()
    thread.join(5)
    assert not thread.is_alive()
    assert sorted(finished) == [0, 1]
    assert {j.status for j in store.jobs()} == {JobStatus.SUCCEEDED}


def test_run_abandon_gives_jobs_back() -> None:
    store, worker = make(poll_interval=0.05)
    started = threading.Event()
    block = threading.Event()

    @worker.handler("slow")
    def slow(payload: dict[str, Any]) -> None:
        started.set()
        block.wait(5)

    job = store.enqueue(NewJob(type="slow"))
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    assert started.wait(5)
    worker.stop(abandon=True)
    thread.join(5)
    assert not thread.is_alive()
    back = status_of(store, job)
    assert (back.status, back.attempts, back.lease_token) == (JobStatus.QUEUED, 0, None)
    block.set()
    time.sleep(0.05)
    assert status_of(store, job).status == JobStatus.QUEUED  # the abandoned result is dropped


def test_run_wakes_on_enqueue() -> None:
    store, worker = make(poll_interval=30)  # polling alone would take 30 s
    done = threading.Event()
    worker.register("t", lambda p: done.set())
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    time.sleep(0.1)
    store.enqueue(NewJob(type="t"))
    assert done.wait(5)
    worker.stop()
    thread.join(5)
    assert store.jobs()[0].status == JobStatus.SUCCEEDED


def test_run_until_empty_works_off_what_is_runnable_and_says_what_it_did() -> None:
    store, worker = make(batch_size=3, poll_interval=30)  # returns without waiting for a poll

    @worker.handler("t")
    def handler(payload: dict[str, Any]) -> None:
        if payload.get("fail"):
            raise Permanent("bad input")

    store.enqueue_many([NewJob(type="t")] * 7 + [NewJob(type="t", payload={"fail": True})] * 2)
    later = store.enqueue(NewJob(type="t", delay=timedelta(hours=1)))
    started = time.monotonic()
    summary = worker.run(install_signals=False, until_empty=True)
    assert time.monotonic() - started < 5
    assert (summary.claimed, summary.succeeded, summary.dead, summary.retrying, summary.lost) == (
        9,
        7,
        2,
        0,
        0,
    )
    assert summary.seconds > 0
    assert status_of(store, later).status == JobStatus.QUEUED  # not runnable yet: left alone


def test_delete_succeeded_leaves_failures_and_users_jobs() -> None:
    store, worker = make(batch_size=4, poll_interval=30, delete_succeeded=True)
    user = UUID(int=7)  # the memory store keeps no users table

    @worker.handler("t")
    def handler(payload: dict[str, Any]) -> int:
        if payload.get("fail"):
            raise Permanent("bad input")
        return 1

    store.enqueue_many(
        [NewJob(type="t")] * 9 + [NewJob(type="t", payload={"fail": True}), NewJob(type="t", user_id=user)]
    )
    summary = worker.run(install_signals=False, until_empty=True)
    assert (summary.succeeded, summary.dead) == (10, 1)
    left = {(j.status, j.user_id, j.result) for j in store.jobs()}
    assert left == {(JobStatus.DEAD, None, None), (JobStatus.SUCCEEDED, user, 1)}


def test_an_abandoned_async_handler_is_cancelled() -> None:
    store, worker = make(poll_interval=0.05)
    started, cancelled = threading.Event(), threading.Event()

    @worker.handler("slow")
    async def slow(payload: dict[str, Any]) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    job = store.enqueue(NewJob(type="slow"))
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    assert started.wait(5)
    worker.stop(abandon=True)
    thread.join(5)
    assert not thread.is_alive() and cancelled.is_set()
    assert status_of(store, job).status == JobStatus.QUEUED


def test_on_stop_hooks_run_on_the_workers_loop_after_its_jobs(caplog: pytest.LogCaptureFixture) -> None:
    store, worker = make()
    seen: list[str] = []
    loops: set[asyncio.AbstractEventLoop] = set()

    @worker.handler("t")
    async def handler(payload: dict[str, Any]) -> None:
        loops.add(asyncio.get_running_loop())
        seen.append("job")

    @worker.on_stop
    async def close_clients() -> None:
        loops.add(asyncio.get_running_loop())
        seen.append("async hook")

    @worker.on_stop
    def broken() -> None:
        raise RuntimeError("boom")

    worker.on_stop(lambda: seen.append("sync hook"))
    store.enqueue_many([NewJob(type="t")] * 3)
    with caplog.at_level(logging.ERROR, logger="pgjobkit.worker"):
        summary = worker.run(install_signals=False, until_empty=True)
    assert summary.succeeded == 3
    assert seen == ["job"] * 3 + ["async hook", "sync hook"]
    assert len(loops) == 1  # the jobs' loop
    assert "on_stop hook broken failed" in caplog.text and "boom" in caplog.text


def test_async_callers_await_arun_and_atick_on_their_own_loop() -> None:
    memory = MemoryStore()
    worker = Worker(AsyncMemoryStore(memory), name="w", batch_size=1, jitter=0.0)
    worker.register("t", lambda p: None)
    memory.enqueue_many([NewJob(type="t")] * 4)

    async def main() -> tuple[int, int]:
        with pytest.raises(InvalidArgument, match="await worker"):
            worker.tick()
        ticked = (await worker.atick()).claimed
        summary = await worker.arun(install_signals=False, until_empty=True)
        await worker.aclose()
        return ticked, summary.succeeded

    assert asyncio.run(main()) == (1, 3)


def test_a_long_sync_job_never_holds_up_jobs_claimed_after_it() -> None:
    store, worker = make(concurrency=2, batch_size=1, poll_interval=0.05)
    quick_done = threading.Event()

    @worker.handler("t")
    def handler(payload: dict[str, Any]) -> None:
        if payload.get("long"):
            if not quick_done.wait(5):  # the quick job, claimed later, must run meanwhile
                raise RuntimeError("held up")
        else:
            quick_done.set()

    store.enqueue(NewJob(type="t", payload={"long": True}, priority=1))
    store.enqueue(NewJob(type="t"))
    summary = worker.run(install_signals=False, until_empty=True)
    assert (summary.succeeded, summary.retrying) == (2, 0)


def test_a_sync_jobs_outcome_reaches_the_store_while_the_job_after_it_runs() -> None:
    """Sync outcomes are handed to the loop in groups, but a group never waits on a slow job: with one
    runner, the quick job ahead of a slow one is completed in the store while the slow one still runs."""
    store, worker = make(concurrency=1, batch_size=2, poll_interval=0.05)
    seen_completed = threading.Event()
    quick = store.enqueue(NewJob(type="t", payload={"quick": True}, priority=1))

    @worker.handler("t")
    def handler(payload: dict[str, Any]) -> None:
        if payload.get("quick"):
            return
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if status_of(store, quick).status == JobStatus.SUCCEEDED:
                seen_completed.set()
                return
            time.sleep(0.01)

    store.enqueue(NewJob(type="t"))
    summary = worker.run(install_signals=False, until_empty=True)
    assert summary.succeeded == 2 and seen_completed.is_set()


def _run_in_thread(worker: Worker) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(worker.run(install_signals=False, until_empty=True)))
    thread.start()
    return thread, out


def test_a_cancelled_async_job_stops_within_one_heartbeat() -> None:
    store, worker = make(poll_interval=0.05, lease=timedelta(seconds=0.6))  # a beat every 0.1 s
    started, stopped = threading.Event(), threading.Event()

    @worker.handler("slow")
    async def slow(payload: dict[str, Any]) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.set()
            raise

    job = store.enqueue(NewJob(type="slow"))
    thread, out = _run_in_thread(worker)
    assert started.wait(5)
    cancelled_at = time.monotonic()
    assert store.cancel([job.id])[0].cancelled
    assert stopped.wait(5)
    assert time.monotonic() - cancelled_at < 0.5  # one beat is 0.1 s
    thread.join(5)
    assert not thread.is_alive() and out[0].lost == 1
    assert status_of(store, job).status == JobStatus.CANCELLED


def test_an_async_job_cancelled_while_it_waits_for_a_slot_never_runs() -> None:
    store, worker = make(concurrency=1, batch_size=3, poll_interval=0.05, lease=timedelta(seconds=0.6))
    started: list[int] = []
    first = threading.Event()

    @worker.handler("a")
    async def handler(payload: dict[str, Any]) -> None:
        started.append(payload["n"])
        if payload["n"] == 0:
            first.set()
            await asyncio.sleep(0.5)  # holds the one slot while job 1 is cancelled

    jobs = store.enqueue_many([NewJob(type="a", payload={"n": i}) for i in range(3)])
    thread, out = _run_in_thread(worker)
    assert first.wait(5)
    assert store.cancel([jobs[1].id])[0].cancelled
    thread.join(5)
    assert not thread.is_alive()
    assert started == [0, 2]
    assert (out[0].succeeded, out[0].lost) == (2, 1)
    assert [status_of(store, j).status for j in jobs] == [
        JobStatus.SUCCEEDED,
        JobStatus.CANCELLED,
        JobStatus.SUCCEEDED,
    ]


def test_a_sync_handlers_awaitable_waits_for_a_slot_and_runs_on_the_loop() -> None:
    store, worker = make(concurrency=2, batch_size=6)
    now, most = 0, 0

    async def later(n: int) -> int:
        nonlocal now, most
        now += 1
        most = max(most, now)
        await asyncio.sleep(0.01)
        now -= 1
        return n

    worker.register("t", lambda payload: later(payload["n"]))  # a plain def returning a coroutine
    jobs = store.enqueue_many([NewJob(type="t", payload={"n": i}) for i in range(6)])
    assert worker.tick().count("succeeded") == 6
    assert most <= 2
    assert [status_of(store, j).result for j in jobs] == list(range(6))
    worker.close()


def test_a_cancelled_sync_job_sees_the_flag_and_its_completion_changes_nothing() -> None:
    store, worker = make(poll_interval=0.05, lease=timedelta(seconds=0.6))
    started = threading.Event()
    steps: list[int] = []

    @worker.handler("steps")
    def steps_handler(payload: dict[str, Any]) -> None:
        started.set()
        for step in range(100):
            if current().cancelled:
                return  # returns normally: the completion is fenced off
            steps.append(step)
            time.sleep(0.02)

    job = store.enqueue(NewJob(type="steps"))
    thread, out = _run_in_thread(worker)
    assert started.wait(5)
    store.cancel([job.id], reason="no longer needed")
    thread.join(5)
    assert not thread.is_alive()
    assert 0 < len(steps) < 50 and out[0].lost == 1 and out[0].succeeded == 0
    final = status_of(store, job)
    assert (final.status, final.error) == (JobStatus.CANCELLED, "no longer needed")


def test_current_is_only_for_handlers() -> None:
    with pytest.raises(InvalidArgument, match="inside a jobkit handler"):
        current()


def test_a_handlers_return_value_is_the_jobs_result() -> None:
    store, worker = make(batch_size=3)
    worker.register("sync", lambda p: {"words": p["n"] * 10})

    @worker.handler("async")
    async def transcribe(payload: dict[str, Any]) -> str:
        return "hello world"

    jobs = [store.enqueue(NewJob(type=t, payload={"n": 4})) for t in ("sync", "async")]
    worker.run(install_signals=False, until_empty=True)
    assert [status_of(store, j).result for j in jobs] == [{"words": 40}, "hello world"]
    assert [status_of(store, j).progress for j in jobs] == [1.0, 1.0]


def test_a_result_that_cannot_be_stored_fails_the_job_saying_why() -> None:
    store, worker = make()
    worker.register("bad", lambda p: {"vector": [float("nan")]})
    worker.register("big", lambda p: "x" * 70_000)
    bad, big = (store.enqueue(NewJob(type=t)) for t in ("bad", "big"))
    summary = worker.run(install_signals=False, until_empty=True)
    assert summary.dead == 2
    assert "must be JSON (no NaN" in (status_of(store, bad).error or "")
    assert "at most 65536 bytes" in (status_of(store, big).error or "")


class CountingStore(MemoryStore):
    """The memory store, counting the progress rows written."""

    def __init__(self) -> None:
        super().__init__()
        self.progress_rows = 0

    def _execute(self, call: Call, conn: Any = None) -> Any:
        if call.fn == "jobkit_progress":
            self.progress_rows += len(call.args["p_ids"][1])
        return super()._execute(call, conn)


def test_progress_is_visible_while_running_and_written_at_most_once_a_second() -> None:
    store = CountingStore()
    worker = Worker(store, name="w", jitter=0.0, poll_interval=0.05)
    halfway, seen = threading.Event(), threading.Event()

    @worker.handler("chatty")
    async def chatty(payload: dict[str, Any]) -> None:
        for i in range(1, 1001):
            current().progress(i / 2000, f"step {i}")  # a report per step
            await asyncio.sleep(0.001)
        halfway.set()
        while not seen.is_set():
            await asyncio.sleep(0.01)

    job = store.enqueue(NewJob(type="chatty"))
    thread, out = _run_in_thread(worker)
    assert halfway.wait(10)
    deadline = time.monotonic() + 3
    while (status_of(store, job).progress_message or "") != "step 1000" and time.monotonic() < deadline:
        time.sleep(0.05)
    running = status_of(store, job)
    assert (running.status, running.progress, running.progress_message) == (
        JobStatus.RUNNING,
        0.5,
        "step 1000",
    )
    seen.set()
    thread.join(5)
    assert out[0].succeeded == 1
    seconds = out[0].seconds
    assert store.progress_rows <= seconds / 1.0 + 2, (store.progress_rows, seconds)  # 1,000 reports


def test_progress_input_is_checked() -> None:
    store, worker = make()
    errors: list[str] = []

    @worker.handler("t")
    def handler(payload: dict[str, Any]) -> None:
        for bad in (1.5, -0.1):
            try:
                current().progress(bad)
            except InvalidArgument as exc:
                errors.append(str(exc))
        try:
            current().progress(0.5, "x" * 201)
        except InvalidArgument as exc:
            errors.append(str(exc))

    store.enqueue(NewJob(type="t"))
    worker.tick()
    worker.close()
    assert len(errors) == 3 and "from 0 to 1" in errors[0] and "at most 200 characters" in errors[2]


class RoundTripStore(AsyncMemoryStore):
    """The async memory store with each claim taking a round trip's time, counting the claims in flight at
    once and the most jobs running (claimed, unfinished) at any claim."""

    def __init__(self, round_trip: float = 0.005) -> None:
        super().__init__()
        self.round_trip = round_trip
        self.in_flight = self.most_in_flight = self.most_running = 0

    async def _execute(self, call: Call, conn: Any = None) -> Any:
        if call.fn != "jobkit_claim":
            return await super()._execute(call, conn)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.round_trip)
            answer = await super()._execute(call, conn)
        finally:
            self.in_flight -= 1
        running = sum(j.status == JobStatus.RUNNING for j in self.sync.jobs())
        self.most_running = max(self.most_running, running)
        return answer


def test_quick_jobs_are_claimed_ahead_with_round_trips_in_flight_at_once() -> None:
    store = RoundTripStore()
    worker = Worker(store, name="w", concurrency=1, batch_size=5, poll_interval=30)
    worker.register("t", lambda payload: None)
    store.sync.enqueue_many([NewJob(type="t")] * 60)
    summary = worker.run(install_signals=False, until_empty=True)
    assert (summary.claimed, summary.succeeded) == (60, 60)
    assert {j.status for j in store.sync.jobs()} == {JobStatus.SUCCEEDED}
    assert store.most_in_flight == 1 + AHEAD
    assert store.most_running <= 5 + AHEAD * 5  # max(concurrency, batch_size), and AHEAD batches more


def test_slow_jobs_are_never_claimed_ahead() -> None:
    store = RoundTripStore()
    worker = Worker(store, name="w", concurrency=1, batch_size=3, poll_interval=30)
    worker.register("t", lambda payload: time.sleep(0.03))  # longer than QUICK
    store.sync.enqueue_many([NewJob(type="t")] * 9)
    summary = worker.run(install_signals=False, until_empty=True)
    assert summary.succeeded == 9
    assert (store.most_in_flight, store.most_running) == (1, 3)


def test_no_batch_is_claimed_ahead_while_a_job_runs_long() -> None:
    store = RoundTripStore()
    worker = Worker(store, name="w", concurrency=2, batch_size=2, poll_interval=30)
    held_while_slow: list[int] = []

    @worker.handler("t")
    def handler(payload: dict[str, Any]) -> None:
        if payload.get("slow"):  # one slot busy for long while the other runs quick jobs
            time.sleep(0.05)  # past the jobs claimed ahead before it started
            for _ in range(20):
                time.sleep(0.005)
                held_while_slow.append(sum(j.status == JobStatus.RUNNING for j in store.sync.jobs()))

    store.sync.enqueue_many([NewJob(type="t", priority=1)] * 20)
    store.sync.enqueue(NewJob(type="t", payload={"slow": True}))
    store.sync.enqueue_many([NewJob(type="t", priority=-1)] * 200)
    summary = worker.run(install_signals=False, until_empty=True)
    assert summary.succeeded == 221
    assert store.most_in_flight == 1 + AHEAD  # quick batches were claimed ahead, before and after it
    assert 0 < max(held_while_slow) <= 2  # max(concurrency, batch_size): nothing ahead


def test_a_stop_runs_the_jobs_of_round_trips_still_in_flight_and_leaves_none_running() -> None:
    store = RoundTripStore(round_trip=0.05)  # long beside a job, so claims overlap on a loaded machine too
    worker = Worker(store, name="w", concurrency=1, batch_size=5, poll_interval=30)
    ran: list[int] = []

    @worker.handler("t")
    def handler(payload: dict[str, Any]) -> None:
        ran.append(payload["n"])
        if len(ran) == 23:
            worker.stop()

    store.sync.enqueue_many([NewJob(type="t", payload={"n": i}) for i in range(200)])
    summary = worker.run(install_signals=False)
    statuses = [j.status for j in store.sync.jobs()]
    assert store.most_in_flight == 1 + AHEAD
    assert JobStatus.RUNNING not in statuses
    assert summary.claimed == summary.succeeded == len(ran) == statuses.count(JobStatus.SUCCEEDED) < 200
    assert len(set(ran)) == len(ran)


class CursorStore(AsyncMemoryStore):
    """The async memory store, recording each claim's p_after."""

    def __init__(self) -> None:
        super().__init__()
        self.afters: list[UUID | None] = []

    async def _execute(self, call: Call, conn: Any = None) -> Any:
        if call.fn == "jobkit_claim":
            self.afters.append(call.args["p_after"][1] if "p_after" in call.args else None)
        return await super()._execute(call, conn)


def test_a_worker_claims_after_its_last_job_and_from_the_front_every_rescan() -> None:
    store = CursorStore()
    worker = Worker(store, name="w", concurrency=1, batch_size=5, poll_interval=30)
    ran: list[int] = []
    urgent: list[int] = []

    def handle(payload: dict[str, Any]) -> None:
        ran.append(payload["n"])
        if payload["n"] == 7:  # enqueued once the worker works through the backlog
            store.sync.enqueue(NewJob(type="t", priority=10, payload={"n": -1}))
        if payload["n"] == -1:
            urgent.append(len(ran))

    worker.register("t", handle)
    store.sync.enqueue_many([NewJob(type="t", payload={"n": n}) for n in range(200)])
    summary = worker.run(install_signals=False, until_empty=True)
    assert summary.succeeded == 201 and [n for n in ran if n >= 0] == list(range(200))
    afters = store.afters
    assert afters[0] is None and all(a is not None for a in afters[1 : RESCAN - 1])
    assert afters[RESCAN - 1] is None  # every RESCAN-th claim looks from the front
    # the urgent job waited for the front, at most RESCAN claims of 5 (and those already claimed ahead)
    assert urgent and urgent[0] <= 8 + (RESCAN + 1 + AHEAD) * 5, urgent


def test_a_claim_cut_to_a_lowered_max_rows_still_counts_as_full() -> None:
    """A Supabase project with Max Rows lowered below the batch: each claim asks for max-rows - 1 jobs and
    gets them, so the next one starts at the last job (it used to count every claim as short)."""
    store = CursorStore()
    store.dialect = dataclasses.replace(store.dialect, max_rows=4)
    worker = Worker(store, name="w", concurrency=5, batch_size=5, poll_interval=30)
    worker.register("t", lambda payload: None)
    store.sync.enqueue_many([NewJob(type="t") for _ in range(60)])
    assert worker.run(install_signals=False, until_empty=True).succeeded == 60
    assert sum(a is not None for a in store.afters) >= len(store.afters) // 2, store.afters


def test_a_short_claim_sends_the_next_one_to_the_front() -> None:
    cursor = ClaimCursor()
    job = Job.model_validate(
        {
            "id": uuid4(),
            "type": "t",
            "status": "running",
            "payload": {},
            "attempts": 1,
            "max_attempts": 3,
            "priority": 0,
            "run_after": datetime.now(UTC),
            "created_at": datetime.now(UTC),
            "updated_at": datetime.now(UTC),
        }
    )
    assert cursor.after() is None
    cursor.claimed(1, [job])
    assert cursor.after() == job.id
    cursor.claimed(2, [job])  # fewer than asked: the queue ran short
    assert cursor.after() is None
