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
import functools
import logging
import os
import random
import signal
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, TypeVar

from jobkit import core
from jobkit.errors import InvalidArgument, JobkitError, TransientError
from jobkit.handlers import JobResult, Permanent, Registry, Retry, Running, RunSummary, TickResult, describe
from jobkit.held import FLUSH_AFTER, Backoff, Claim, Held
from jobkit.models import Job
from jobkit.rounds import Rounds
from jobkit.scheduler import Scheduler
from jobkit.settings import DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY, Settings
from jobkit.stores import open_store
from jobkit.stores.base import AsyncJobStore, JobStore

__all__ = ["JobResult", "Permanent", "Retry", "RunSummary", "TickResult", "Worker"]
log = logging.getLogger("jobkit.worker")
T = TypeVar("T")


def _close_idle(loop: asyncio.AbstractEventLoop) -> None:
    if not loop.is_running() and not loop.is_closed():
        loop.close()


class Worker(Registry):
    """Runs the handlers registered on it against any JobStore or AsyncJobStore (a blocking store is worked
    through its ``as_async()`` twin; ``worker.store`` stays the one given).

    ``concurrency`` jobs are in flight at once; ``batch_size`` are claimed per round trip, and the worker
    holds up to max(concurrency, batch_size) claimed jobs (two batches more while its jobs run quick: see
    ``jobkit.rounds``); ``lease`` is the default lease; failures retry after ``backoff_base``·2^(attempt-1)
    seconds, capped at ``backoff_cap``, scaled by up to ±``jitter``; ``heartbeat`` extends the leases of
    handlers running past a third of theirs; ``schedules`` runs a ``Scheduler`` alongside, which enqueues
    the store's schedules' jobs when due (any number may run); ``delete_succeeded`` deletes succeeded jobs
    that have no ``user_id`` instead of keeping them (faster; their results and idempotency keys are not
    kept; see ``JobStore.complete_many``).
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
        schedules: bool = False,
        delete_succeeded: bool = False,
    ) -> None:
        super().__init__()
        self.store = store
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        core.check_worker(self.name)
        self.concurrency, self.batch_size, self.poll_interval, self.lease = 1, 1, 1.0, lease
        self.configure(
            concurrency=concurrency, batch_size=batch_size, poll_interval=poll_interval, lease=lease
        )
        self.backoff = Backoff(backoff_base, backoff_cap, jitter, random_source or random.Random().random)
        self.backoff.delay(1)  # validates the policy now
        self.heartbeat = heartbeat
        self.schedules = schedules
        self.delete_succeeded = delete_succeeded
        self._on_stop: list[Callable[[], Awaitable[None] | None]] = []
        self._astore: AsyncJobStore | None = store if isinstance(store, AsyncJobStore) else None
        self._loop: asyncio.AbstractEventLoop | None = None  # the worker's own, for tick() and run()
        self._executor: ThreadPoolExecutor | None = None
        self._held: Held | None = None  # the jobs of the run in progress
        self._stop = threading.Event()  # set from any thread by stop()
        self._abandon = threading.Event()
        self._wake: asyncio.Event | None = None
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
            "schedules": settings.schedules,
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

    def on_stop(self, fn: Callable[[], Awaitable[None] | None]) -> Callable[[], Awaitable[None] | None]:
        """Register ``fn`` (async or not) to run on the worker's loop when run() or arun() has finished its
        jobs, in registration order: close the clients and pools handlers share. A decorator."""
        self._on_stop.append(fn)
        return fn

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
        """close() for async callers (the loop is theirs)."""
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

    def _hold(self, record: Callable[[JobResult], None]) -> Held:
        """The held jobs of a run or tick starting now, on this loop."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix="jobkit-handler")
        self._wake = asyncio.Event()
        self._held = Held(
            self._store(),
            concurrency=self.concurrency,
            batch_size=self.batch_size,
            backoff=self.backoff,
            lease_of=self._lease,
            executor=self._executor,
            record=record,
            wake=self._wake,
            delete=self.delete_succeeded,
        )
        return self._held

    def _heartbeat(self, held: Held) -> asyncio.Task[None]:
        leases = [self._lease(h) for h in self._handlers.values()] or [self.lease]
        return held.heartbeat(leases, beat=self.heartbeat)

    # --- one batch ----------------------------------------------------------------------------------
    async def atick(self) -> TickResult:
        """tick() for async callers."""
        results: list[JobResult] = []
        held = self._hold(results.append)
        jobs = await self._claim(self.batch_size)
        self._start(held, jobs)
        beat = self._heartbeat(held)
        try:
            while held.running:
                await held.wake.wait()
                held.wake.clear()
            await held.complete()
            await held.wind_down()
        finally:
            beat.cancel()
        by_id = {r.job_id: r for r in results}
        return TickResult(tuple(by_id[j.id] for j in jobs if j.id in by_id))

    async def _claim(self, limit: int) -> list[Job]:
        jobs: list[Job] = []
        for lease, types in self._groups().items():
            if len(jobs) >= limit:
                break
            jobs.extend(await self._store().claim(types, self.name, lease, limit - len(jobs)))
        return jobs

    async def _complete_and_claim(self, held: Held, want: int, done: list[Running]) -> list[Job]:
        """Complete ``done`` and claim ``want`` more: one round trip when all types share a lease."""
        groups = self._groups() if want else {}
        if len(groups) == 1:
            [(lease, types)] = groups.items()
            return await held.complete(Claim(types, self.name, lease, want), done)
        await held.complete(None, done)
        return await self._claim(want) if want else []

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
        summary = RunSummary()
        held = self._hold(summary.add)
        self._wake_loop = loop
        signals = []
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self._on_signal, sig)
                signals.append(sig)
        started = time.monotonic()
        subscription = await self._store().listen(held.wake.set)
        log.info(
            "worker %s started: types=%s concurrency=%d", self.name, ",".join(self.types), self.concurrency
        )
        beat = self._heartbeat(held)
        scheduler_stop = asyncio.Event()
        scheduler = (
            asyncio.create_task(Scheduler(self._store()).arun(scheduler_stop), name="jobkit-scheduler")
            if self.schedules
            else None
        )
        try:
            summary.claimed = await self._loop_until_stopped(held, max_jobs, until_empty)
            await self._drain(held)
            await held.wind_down()
        finally:
            beat.cancel()
            scheduler_stop.set()
            if scheduler is not None:
                await scheduler
            await subscription.close()
            for sig in signals:
                loop.remove_signal_handler(sig)
            self._wake_loop = None
            await self._stopped()
        summary.seconds = time.monotonic() - started
        log.info("worker %s stopped: %s", self.name, summary)
        return summary

    async def _stopped(self) -> None:
        for fn in self._on_stop:
            try:
                result = fn()
                if result is not None:
                    await result
            except Exception:
                log.exception("on_stop hook %s failed", getattr(fn, "__name__", fn))

    async def _loop_until_stopped(self, held: Held, max_jobs: int | None, until_empty: bool) -> int:
        """Claim and complete through ``Rounds`` until stopped (or out of work, or ``max_jobs`` claimed)."""
        claimed_total, fault_delay, rest = 0, 0.0, False
        rounds = Rounds(
            held,
            concurrency=self.concurrency,
            batch_size=self.batch_size,
            claim=self._claim,
            complete=functools.partial(self._complete_and_claim, held),
        )
        try:
            while not self._stop.is_set():
                held.wake.clear()
                fault: TransientError | None = None
                empty = False
                for answer in rounds.finished():  # any error but a transient one ends run()
                    if isinstance(answer, TransientError):
                        fault = answer
                        continue
                    fault_delay = 0.0
                    self._start(held, answer)
                    claimed_total += len(answer)
                    rest = rest or rounds.drained  # the queue is drained, or every slot is busy: wait
                    empty = until_empty and not answer and not rounds and not held.running and not held.done
                if empty:
                    break  # nothing was runnable and nothing is left to settle
                if fault is not None:
                    fault_delay = min(max(fault_delay * 2, 0.1), 5.0)
                    log.warning("store error (%s); retrying in %.1fs", describe(fault), fault_delay)
                    await self._sleep(held, fault_delay)
                    continue
                if max_jobs is not None and claimed_total >= max_jobs:
                    break
                if not rest and rounds.send(None if max_jobs is None else max_jobs - claimed_total):
                    continue
                rest = False
                await self._sleep(held, FLUSH_AFTER if held.done else self.poll_interval)
        except BaseException:  # ending run(): jobs claimed by round trips still in flight are not started
            await rounds.settle()  # (their leases expire)
            raise
        # stopping: the jobs claimed by round trips still in flight run (the drain waits for them), or are
        # given back unstarted
        jobs = await rounds.settle()
        if self._abandon.is_set():
            await held.release(jobs)
        else:
            self._start(held, jobs)
        return claimed_total + len(jobs)

    def _start(self, held: Held, jobs: list[Job]) -> None:
        for job in jobs:
            held.start(job, self._handlers[job.type])

    @staticmethod
    async def _sleep(held: Held, seconds: float) -> None:
        """Wait ``seconds``, or less when woken (a LISTEN notify, a finished job, stop())."""
        if held.wake.is_set():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):  # no task per wait, as wait_for would make
                await held.wake.wait()

    async def _drain(self, held: Held) -> None:
        """After stop: finish (or give back) in-flight jobs, then complete them."""
        while held.running and not self._abandon.is_set():
            await self._sleep(held, 0.05)
            held.wake.clear()
        if self._abandon.is_set():
            await held.give_back()
        for attempt in range(1, 6):
            try:
                await held.complete()
                break
            except JobkitError as exc:
                log.warning("final complete failed (%s); attempt %d of 5", describe(exc), attempt)
                await asyncio.sleep(0.2 * attempt)
        if self._abandon.is_set() and self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)  # their threads cannot be stopped
            self._executor = None
