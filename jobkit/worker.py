"""The Worker: handlers by job type, run on one long-lived asyncio event loop per worker.

``concurrency`` is the number of jobs in flight. Async handlers run as tasks on the loop, so one process
can await hundreds of embedding or transcription calls, sharing one client across jobs; sync handlers run
in a thread pool, off the loop. ``tick()`` does one batch and returns what happened, without sleeping
(tests drive it by hand). ``run()`` loops: claims while it has room, wakes on LISTEN or the poll interval,
extends the leases of long handlers, completes finished jobs in batches (folded into the next claim),
rides out transient store faults with backoff (any other store error, such as a wrong key or a missing
migration, ends it at once), and stops gracefully on SIGINT/SIGTERM (a second signal gives in-flight jobs
back). ``run(until_empty=True)`` returns once nothing is runnable. From async code use ``atick()`` and
``arun()``; ``tick()`` and ``run()`` run those on the worker's own loop, the same one every time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, TypeVar

from jobkit import core
from jobkit.errors import InvalidArgument, JobkitError, TransientError
from jobkit.handlers import (
    JobResult,
    Outcome,
    Permanent,
    Registry,
    Retry,
    Running,
    RunSummary,
    TickResult,
    describe,
)
from jobkit.models import Job, JobStatus
from jobkit.settings import DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY, Settings
from jobkit.stores import open_store
from jobkit.stores.base import AsyncJobStore, JobStore

__all__ = ["JobResult", "Permanent", "Retry", "RunSummary", "TickResult", "Worker"]
log = logging.getLogger("jobkit.worker")
T = TypeVar("T")
FLUSH_AFTER = 0.02  # seconds a finished job may wait for its batched completion


def _log(level: int, job: Job, message: str, *args: Any) -> None:
    """A log line about one job: always its id, type and attempt, in the text and as ``extra``."""
    if log.isEnabledFor(level):
        extra = {"job_id": str(job.id), "job_type": job.type, "attempt": job.attempts}
        log.log(
            level, "job %s type=%s attempt=%d " + message, job.id, job.type, job.attempts, *args, extra=extra
        )


def _close_idle(loop: asyncio.AbstractEventLoop) -> None:
    if not loop.is_running() and not loop.is_closed():
        loop.close()


class Worker(Registry):
    """Runs the handlers registered on it against any JobStore or AsyncJobStore (a blocking store is worked
    through its ``as_async()`` twin; ``worker.store`` stays the one given).

    ``concurrency`` jobs are in flight at once; ``batch_size`` are claimed per round trip, and the worker
    holds up to max(concurrency, batch_size) claimed jobs; ``lease`` is the default lease; failures retry
    after ``backoff_base``·2^(attempt-1) seconds, capped at ``backoff_cap``, scaled by up to ±``jitter``;
    ``heartbeat`` extends the leases of handlers running past a third of theirs.
    """

    def __init__(
        self,
        store: JobStore | AsyncJobStore,
        *,
        name: str | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        batch_size: int = DEFAULT_BATCH_SIZE,
        poll_interval: float = 1.0,
        lease: timedelta = timedelta(seconds=30),
        backoff_base: float = 1.0,
        backoff_cap: float = 300.0,
        jitter: float = 0.1,
        random_source: Callable[[], float] | None = None,
        heartbeat: bool = True,
    ) -> None:
        super().__init__()
        self.store = store
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        core.check_worker(self.name)
        self.concurrency, self.batch_size, self.poll_interval, self.lease = 1, 1, 1.0, lease
        self.configure(
            concurrency=concurrency, batch_size=batch_size, poll_interval=poll_interval, lease=lease
        )
        core.backoff(1, base=backoff_base, cap=backoff_cap, jitter=jitter, random=lambda: 0.0)  # validates
        self.backoff_base, self.backoff_cap, self.jitter = backoff_base, backoff_cap, jitter
        self._random = random_source or random.Random().random
        self.heartbeat = heartbeat
        self._astore: AsyncJobStore | None = store if isinstance(store, AsyncJobStore) else None
        self._loop: asyncio.AbstractEventLoop | None = None  # the worker's own, for tick() and run()
        self._executor: ThreadPoolExecutor | None = None
        self._running: dict[uuid.UUID, Running] = {}
        self._done: list[Running] = []  # succeeded, awaiting one batched complete
        self._collect: list[JobResult] | None = None  # tick()'s results
        self._summary = RunSummary()  # run()'s counts
        self._stop = threading.Event()  # set from any thread by stop()
        self._abandon = threading.Event()
        self._wake: asyncio.Event | None = None
        self._slots = asyncio.Semaphore(concurrency)  # jobs in flight; claimed ones beyond it wait here
        self._wake_loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides: Any) -> Worker:
        """A Worker on the store the settings describe (SUPABASE_URL: SupabaseStore; JOBKIT_DATABASE_URL:
        PostgresStore), with the JOBKIT_* tunables; keyword ``overrides`` win over the settings."""
        settings = settings or Settings.load()
        options: dict[str, Any] = {
            "concurrency": settings.concurrency,
            "batch_size": settings.batch_size,
            "poll_interval": settings.poll_interval,
            "lease": timedelta(seconds=settings.lease_seconds),
            "backoff_base": settings.backoff_base,
            "backoff_cap": settings.backoff_cap,
        }
        return cls(open_store(settings), **(options | overrides))

    def __repr__(self) -> str:
        return f"Worker(name={self.name!r}, types={self.types}, concurrency={self.concurrency})"

    @property
    def abandoned(self) -> bool:
        """True once a stop with ``abandon`` gave in-flight jobs back (their threads may still run)."""
        return self._abandon.is_set()

    def configure(
        self,
        *,
        types: list[str] | None = None,
        concurrency: int | None = None,
        batch_size: int | None = None,
        lease: timedelta | None = None,
        poll_interval: float | None = None,
    ) -> None:
        """Change settings (the CLI's options): ``types`` restricts the claimed types to these registered
        ones; ``lease`` applies to handlers registered without their own."""
        if types is not None:
            unknown = sorted(set(types) - set(self._handlers))
            if unknown:
                raise InvalidArgument(
                    f"jobkit: no handler for type(s) {', '.join(unknown)}; "
                    f"registered: {', '.join(sorted(self._handlers))}"
                )
            self._only = set(types)
        if concurrency is not None and concurrency < 1:
            raise InvalidArgument("jobkit: concurrency must be >= 1")
        if batch_size is not None and batch_size < 1:
            raise InvalidArgument("jobkit: batch_size must be >= 1")
        if poll_interval is not None and poll_interval <= 0:
            raise InvalidArgument("jobkit: poll_interval must be > 0 seconds")
        if lease is not None:
            core.check_lease(lease)
        self.concurrency = concurrency or self.concurrency
        self.batch_size = batch_size or self.batch_size
        self.poll_interval = poll_interval or self.poll_interval
        self.lease = lease or self.lease

    # --- the worker's own loop, for blocking callers ------------------------------------------------
    def _on_own_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coro.close()
            raise InvalidArgument("jobkit: inside a running event loop, await worker.atick() / worker.arun()")
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            weakref.finalize(self, _close_idle, self._loop)  # a worker dropped without close()
        return self._loop.run_until_complete(coro)

    def tick(self) -> TickResult:
        """Claim up to ``batch_size`` jobs, run them, settle each; no sleeping."""
        return self._on_own_loop(self.atick())

    def run(
        self, *, install_signals: bool = True, max_jobs: int | None = None, until_empty: bool = False
    ) -> RunSummary:
        """Process jobs until ``stop()`` (or SIGINT/SIGTERM), ``max_jobs`` claims, or, with ``until_empty``,
        until nothing is runnable. Returns what it did."""

        async def run_then_close() -> RunSummary:
            try:
                return await self.arun(
                    install_signals=install_signals, max_jobs=max_jobs, until_empty=until_empty
                )
            finally:
                await self.aclose()  # what this run opened; a later run opens it again

        fresh = self._loop is None
        try:
            return self._on_own_loop(run_then_close())
        finally:
            if fresh:
                self.close()  # a loop run() made ends with it; tick()'s loop lives until close()

    def close(self) -> None:
        """Release what tick() or run() opened: the async twin of a blocking store, threads, the loop."""
        if self._loop is not None:
            self._loop.run_until_complete(self.aclose())
            self._loop.close()
            self._loop = None

    async def aclose(self) -> None:
        if self._astore is not None and self._astore is not self.store:
            await self._astore.close()
            self._astore = None
        if self._executor is not None:
            self._executor.shutdown(wait=not self._abandon.is_set(), cancel_futures=True)
            self._executor = None

    def _store(self) -> AsyncJobStore:
        if self._astore is None:
            assert isinstance(self.store, JobStore)
            self._astore = self.store.as_async()
        return self._astore

    # --- one batch ----------------------------------------------------------------------------------
    async def atick(self) -> TickResult:
        """tick() for async callers."""
        results: list[JobResult] = []
        self._collect, self._wake, self._slots = results, asyncio.Event(), asyncio.Semaphore(self.concurrency)
        jobs = await self._claim(self.batch_size)
        runs = [self._start(job) for job in jobs]
        beat = self._beat_task()
        try:
            await asyncio.gather(*(r.task for r in runs if r.task is not None))
            await self._flush()
        finally:
            beat.cancel()
            self._collect = None
        by_id = {r.job_id: r for r in results}
        return TickResult(tuple(by_id[j.id] for j in jobs if j.id in by_id))

    async def _claim(self, limit: int) -> list[Job]:
        jobs: list[Job] = []
        for lease, types in self._groups().items():
            if len(jobs) >= limit:
                break
            jobs.extend(await self._store().claim(types, self.name, lease, limit - len(jobs)))
        return jobs

    def _start(self, job: Job) -> Running:
        now = time.monotonic()
        run = Running(job, self._handlers[job.type], started=now, extended=now)
        self._running[job.id] = run
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix="jobkit-handler")
        run.task = asyncio.get_running_loop().create_task(self._execute(run))
        return run

    async def _execute(self, run: Running) -> None:
        """Run the handler; settle a failure now, queue a success for a batched complete."""
        succeeded = False
        try:
            assert self._executor is not None
            async with self._slots:
                await run.handler(run.job, self._executor)
            succeeded = True
        except asyncio.CancelledError:
            if not run.abandoned:
                raise
        except Exception as exc:  # every handler failure is recorded, none escapes
            if not run.abandoned:
                self._record(await self._settle_failure(run, exc))
        finally:
            self._running.pop(run.job.id, None)
            if succeeded and not run.abandoned:
                run.finished = time.monotonic()
                self._done.append(run)
            # Wake the loop only when there is work for it: a batch to flush, or a slot freed by a failure
            # or by the last running job. (It also wakes every FLUSH_AFTER while completions wait.)
            if self._wake is not None and (
                not succeeded or len(self._done) >= self.batch_size or not self._running
            ):
                self._wake.set()

    def _record(self, result: JobResult) -> None:
        self._summary.add(result)
        if self._collect is not None:
            self._collect.append(result)

    async def _settle_failure(self, run: Running, exc: Exception) -> JobResult:
        job = run.job
        if isinstance(exc, Retry) and exc.after is not None:
            delay = exc.after
        else:
            delay = core.backoff(
                job.attempts,
                base=self.backoff_base,
                cap=self.backoff_cap,
                jitter=self.jitter,
                random=self._random,
            )
        error = describe(exc)
        seconds = time.monotonic() - run.started
        try:
            result = await self._store().fail(
                job.id, run.lease_token, error, delay, run.handler.is_final(job, exc)
            )
        except JobkitError as store_error:
            _log(
                logging.WARNING,
                job,
                "failed (%s), and recording it failed too (%s): it runs again when its lease expires",
                error,
                describe(store_error),
            )
            return JobResult(job.id, job.type, job.attempts, "lost", error, seconds)
        if not result.ok:
            _log(logging.WARNING, job, "failed but its lease was lost: %s", error)
            return JobResult(job.id, job.type, job.attempts, "lost", error, seconds)
        outcome: Outcome = "dead" if result.status == JobStatus.DEAD else "retrying"
        next_step = "dead" if outcome == "dead" else f"retrying in {delay.total_seconds():.1f}s"
        _log(logging.WARNING, job, "%s: %s", next_step, error)
        return JobResult(job.id, job.type, job.attempts, outcome, error, seconds)

    async def _flush(self, claim: int = 0) -> list[Job]:
        """Complete every finished job in one round trip, and claim up to ``claim`` more in the same one
        when all types share a lease. A lost lease is logged, not raised."""
        done, self._done = self._done, []
        if not done:
            return await self._claim(claim) if claim else []
        pairs = [(r.job.id, r.lease_token) for r in done]
        groups = self._groups() if claim else {}
        jobs: list[Job] = []
        try:
            if len(groups) == 1:
                [(lease, types)] = groups.items()
                ok, jobs = await self._store().complete_and_claim(pairs, types, self.name, lease, claim)
            else:
                ok = await self._store().complete_many(pairs)
        except BaseException:
            self._done[:0] = done  # try again on the next flush; the leases still guard them
            raise
        if claim and len(groups) != 1:
            jobs = await self._claim(claim)
        now = time.monotonic()
        for r in done:
            job, seconds, succeeded = r.job, now - r.started, bool(ok.get(r.job.id))
            if succeeded:
                _log(logging.INFO, job, "succeeded in %.3fs", seconds)
            else:
                _log(logging.WARNING, job, "finished, but its lease was lost: not completed")
            self._record(
                JobResult(job.id, job.type, job.attempts, "succeeded" if succeeded else "lost", None, seconds)
            )
        return jobs

    # --- lease heartbeat ----------------------------------------------------------------------------
    async def _beat(self) -> None:
        """Extend every lease whose handler has run past a third of it."""
        now = time.monotonic()
        due = [
            r
            for r in self._running.values()
            if not r.lost and now - r.extended >= self._lease(r.handler).total_seconds() / 3
        ]
        for r in due:
            try:
                until = await self._store().extend_lease(r.job.id, r.lease_token, self._lease(r.handler))
            except JobkitError as exc:
                _log(logging.WARNING, r.job, "lease extension failed (%s); will try again", describe(exc))
                continue
            if until is None:
                r.lost = True
                _log(logging.WARNING, r.job, "lost its lease while running")
            else:
                r.extended = now

    def _beat_task(self) -> asyncio.Task[None]:
        leases = [self._lease(h).total_seconds() for h in self._handlers.values()] or [
            self.lease.total_seconds()
        ]
        interval = min(5.0, max(0.05, min(leases) / 6))

        async def beat() -> None:
            while self.heartbeat:
                await asyncio.sleep(interval)
                await self._beat()

        return asyncio.get_running_loop().create_task(beat(), name="jobkit-heartbeat")

    # --- the loop -----------------------------------------------------------------------------------
    def stop(self, *, abandon: bool = False) -> None:
        """Stop claiming and let in-flight jobs finish; with ``abandon``, give them back instead. Safe from
        any thread and from a signal handler."""
        self._stop.set()
        if abandon:
            self._abandon.set()
        if self._wake is not None and self._wake_loop is not None and not self._wake_loop.is_closed():
            self._wake_loop.call_soon_threadsafe(self._wake.set)

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._stop.is_set():
            log.warning("second %s: giving in-flight jobs back", sig.name)
            self.stop(abandon=True)
        else:
            log.warning("%s: finishing in-flight jobs (send again to give them back)", sig.name)
            self.stop()

    async def arun(
        self, *, install_signals: bool = True, max_jobs: int | None = None, until_empty: bool = False
    ) -> RunSummary:
        """run() for async callers (signals are installed only when the loop runs in the main thread)."""
        if not self._handlers:
            raise InvalidArgument("jobkit: register a handler before running the worker")
        loop = asyncio.get_running_loop()
        self._stop.clear()
        self._abandon.clear()
        self._summary, self._wake, self._wake_loop = RunSummary(), asyncio.Event(), loop
        self._slots = asyncio.Semaphore(self.concurrency)
        signals = []
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self._on_signal, sig)
                signals.append(sig)
        started = time.monotonic()
        subscription = await self._store().listen(self._wake.set)
        log.info(
            "worker %s started: types=%s concurrency=%d", self.name, ",".join(self.types), self.concurrency
        )
        beat = self._beat_task()
        try:
            claimed = await self._loop_until_stopped(max_jobs, until_empty)
            await self._drain()
        finally:
            beat.cancel()
            await subscription.close()
            for sig in signals:
                loop.remove_signal_handler(sig)
            self._wake_loop = None
            log.info("worker %s stopped", self.name)
        self._summary.claimed, self._summary.seconds = claimed, time.monotonic() - started
        return self._summary

    def _flush_due(self) -> bool:
        """Complete in batches: when a batch is done, when nothing else runs, or after FLUSH_AFTER."""
        if not self._done:
            return False
        return (
            len(self._done) >= self.batch_size
            or not self._running
            or time.monotonic() - self._done[0].finished >= FLUSH_AFTER
        )

    async def _loop_until_stopped(self, max_jobs: int | None, until_empty: bool) -> int:
        """Hold up to max(concurrency, batch_size) jobs; claim when half a batch of room is free."""
        assert self._wake is not None
        claimed_total, fault_delay = 0, 0.0
        capacity = max(self.concurrency, self.batch_size)
        while not self._stop.is_set():
            self._wake.clear()
            try:
                flush = self._flush_due()
                held = len(self._running) + (0 if flush else len(self._done))
                free = capacity - held
                if max_jobs is not None:
                    free = min(free, max_jobs - claimed_total)
                want = min(free, self.batch_size) if held == 0 or 2 * free >= self.batch_size else 0
                jobs = await self._flush(claim=want) if flush else await self._claim(want) if want else []
                fault_delay = 0.0
            except TransientError as exc:  # anything else (a wrong key, no migration) ends run()
                fault_delay = min(max(fault_delay * 2, 0.1), 5.0)
                log.warning("store error (%s); retrying in %.1fs", describe(exc), fault_delay)
                await self._sleep(fault_delay)
                continue
            for job in jobs:
                self._start(job)
            claimed_total += len(jobs)
            if max_jobs is not None and claimed_total >= max_jobs:
                break
            if until_empty and not jobs and not self._running and not self._done:
                break  # nothing was runnable and nothing is left to settle
            if not jobs or len(jobs) < want:  # the queue is drained, or every slot is busy: wait
                await self._sleep(FLUSH_AFTER if self._done else self.poll_interval)
        return claimed_total

    async def _sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or less when woken (a LISTEN notify, a finished job, stop())."""
        assert self._wake is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def _drain(self) -> None:
        """After stop: finish (or give back) in-flight jobs, then flush completions."""
        while self._running and not self._abandon.is_set():
            await self._sleep(0.05)
            if self._wake is not None:
                self._wake.clear()
        if self._abandon.is_set():
            await self._give_back(list(self._running.values()))
        for attempt in range(1, 6):
            try:
                await self._flush()
                break
            except JobkitError as exc:
                log.warning("final complete failed (%s); attempt %d of 5", describe(exc), attempt)
                await asyncio.sleep(0.2 * attempt)
        if self._abandon.is_set() and self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)  # their threads cannot be stopped
            self._executor = None

    async def _give_back(self, running: list[Running]) -> None:
        for r in running:
            r.abandoned = True
            if r.task is not None:
                r.task.cancel()  # an async handler stops; a sync one's thread runs on, its result dropped
            try:
                await self._store().release(r.job.id, r.lease_token)
                _log(logging.WARNING, r.job, "given back")
            except JobkitError as exc:
                _log(
                    logging.WARNING,
                    r.job,
                    "could not be given back (%s); its lease will expire",
                    describe(exc),
                )
            self._running.pop(r.job.id, None)
