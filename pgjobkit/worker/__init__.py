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
import dataclasses
import logging
import os
import signal
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any, TypeVar, Unpack

from pgjobkit.core.models import Job
from pgjobkit.core.observe import Activity
from pgjobkit.errors import ConfigurationError, InvalidArgument, JobkitError, Permanent, Retry, TransientError
from pgjobkit.observe import http as metrics_http
from pgjobkit.observe import otel
from pgjobkit.settings import Settings
from pgjobkit.stores import open_store
from pgjobkit.stores.base import JobStore
from pgjobkit.stores.base_async import AsyncJobStore
from pgjobkit.version import __version__, check_schema
from pgjobkit.worker.calls_async import AsyncWorkerCalls
from pgjobkit.worker.exchange import FLUSH_AFTER, Exchange
from pgjobkit.worker.executor import Backoff, JobExecutor
from pgjobkit.worker.leases import Leases
from pgjobkit.worker.options import WorkerOptions
from pgjobkit.worker.presence import Presence
from pgjobkit.worker.registry import Handler, HandlerOptions, Registry
from pgjobkit.worker.results import JobResult, RunSummary, TickResult, describe
from pgjobkit.worker.scheduler import Scheduler
from pgjobkit.worker.telemetry import OtelMetrics, Prometheus, Telemetry, otel_metrics_configured

__all__ = ["JobResult", "Permanent", "Retry", "RunSummary", "TickResult", "Worker", "WorkerOptions"]
log = logging.getLogger("pgjobkit.worker")
T = TypeVar("T")


def _close_idle(loop: asyncio.AbstractEventLoop) -> None:
    if not loop.is_running() and not loop.is_closed():
        loop.close()


class Worker:
    """Runs the handlers registered on it (``handler()``, ``register()``; ``worker.handlers`` holds them)
    against any JobStore or AsyncJobStore, as ``options`` say (``WorkerOptions``; keyword ``overrides``
    change single options: ``Worker(store, concurrency=8)``).

    The worker runs on an async store: a blocking ``store`` is worked through its async twin
    (``store.as_async()``), made on first use and closed with the worker, on the same database or project.
    Its pool is the only one the worker opens: the blocking store's own opens only if your code uses it
    (a sync handler enqueueing follow-up jobs, say). Inside, one direction: the exchange
    (``pgjobkit.worker.exchange``) makes every round trip, the executor (``pgjobkit.worker.executor``) runs
    the jobs it claimed and hands back how each ended, and the leases (``pgjobkit.worker.leases``) keep the
    running jobs' leases and progress.
    """

    def __init__(
        self, store: JobStore | AsyncJobStore, *, options: WorkerOptions | None = None, **overrides: Any
    ) -> None:
        self.store = store
        self.handlers = Registry()
        self.options = dataclasses.replace(options or WorkerOptions(), **overrides)
        self.name = self.options.name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._on_stop: list[Callable[[], Awaitable[None] | None]] = []
        self._astore: AsyncJobStore | None = store if isinstance(store, AsyncJobStore) else None
        self._loop: asyncio.AbstractEventLoop | None = None  # the worker's own, for tick() and run()
        self._threads: ThreadPoolExecutor | None = None
        self._stop = threading.Event()  # set from any thread by stop()
        self._abandon = threading.Event()
        self._wake: asyncio.Event | None = None
        self._wake_loop: asyncio.AbstractEventLoop | None = None
        self._schema_checked = False
        self._telemetry: Telemetry | None = None  # the run's (arun)
        self.metrics_port: int | None = None  # the port metrics are served on, while run() runs

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides: Any) -> Worker:
        """A Worker on the store the settings describe (SUPABASE_URL: SupabaseStore; JOBKIT_DATABASE_URL:
        PostgresStore; both: JOBKIT_STORE chooses), with the JOBKIT_* options; keyword ``overrides`` win over
        the settings."""
        settings = settings or Settings.load()
        return cls(open_store(settings), options=WorkerOptions.from_settings(settings), **overrides)

    def __repr__(self) -> str:
        return f"Worker(name={self.name!r}, types={self.types}, concurrency={self.options.concurrency})"

    # --- handlers -----------------------------------------------------------------------------------
    def handler(
        self, type: str, **options: Unpack[HandlerOptions]
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register the decorated function for jobs of ``type`` (see ``Registry.handler``)."""
        return self.handlers.handler(type, **options)

    def register(self, type: str, fn: Callable[..., Any], **options: Unpack[HandlerOptions]) -> None:
        """Non-decorator form of ``handler``."""
        self.handlers.register(type, fn, **options)

    @property
    def types(self) -> list[str]:
        """The job types this worker claims: the registered ones (only ``options.types``, when given)."""
        chosen = self.options.types
        return sorted(t for t in self.handlers.types if chosen is None or t in chosen)

    def _lease(self, h: Handler) -> timedelta:
        return h.lease or self.options.lease

    def _groups(self) -> dict[timedelta, list[str]]:
        """The claimed types, grouped by lease: one claim call per group."""
        if not self.handlers.types:
            raise InvalidArgument("jobkit: register a handler before claiming jobs")
        groups: dict[timedelta, list[str]] = {}
        for t in self.types:
            groups.setdefault(self._lease(self.handlers[t]), []).append(t)
        return groups

    def configure(self, **changes: Any) -> None:
        """Change options (``WorkerOptions`` fields) between runs: the CLI's flags. ``types`` must name
        registered handlers."""
        options = dataclasses.replace(self.options, **changes)
        unknown = sorted(set(options.types or ()) - set(self.handlers.types))
        if unknown:
            raise InvalidArgument(
                f"jobkit: no handler for type(s) {', '.join(unknown)}; "
                f"registered: {', '.join(self.handlers.types)}"
            )
        self.options = options

    @property
    def abandoned(self) -> bool:
        """True once a stop with ``abandon`` gave in-flight jobs back (their threads may still run)."""
        return self._abandon.is_set()

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
        if self._threads is not None:
            self._threads.shutdown(wait=not self._abandon.is_set(), cancel_futures=True)
            self._threads = None

    def _store(self) -> AsyncJobStore:
        if self._astore is None:
            assert isinstance(self.store, JobStore)
            self._astore = self.store.as_async()
        return self._astore

    async def _check_schema(self, *, retry: bool = False) -> None:
        """Refuse, once per worker, a database whose jobkit schema is not this jobkit's (what to run is in
        the error), before anything is claimed. With ``retry``, a store that cannot be reached is asked
        again (backing off, as the loop does) until it answers or the worker is stopped."""
        delay = 0.0
        while not self._schema_checked:
            try:
                check_schema(await self._store().schema_version())
                self._schema_checked = True
            except TransientError as exc:
                if not retry:
                    raise
                delay = _backoff(exc, delay)
                deadline = time.monotonic() + delay
                while time.monotonic() < deadline and not self._stop.is_set():
                    await asyncio.sleep(0.05)
                if self._stop.is_set():
                    return

    def _parts(self, record: Callable[[JobResult], None]) -> tuple[JobExecutor, Exchange, asyncio.Task[None]]:
        """The executor, the exchange and the running heartbeat of a run or tick starting now, on this
        loop (cancel the heartbeat when it ends)."""
        o = self.options
        tracing = otel.configured() if o.tracing is None else o.tracing and otel.configured()
        if self._threads is None:
            self._threads = ThreadPoolExecutor(o.concurrency, thread_name_prefix="jobkit-handler")
        self._wake = asyncio.Event()
        store = self._store()
        executor = JobExecutor(
            concurrency=o.concurrency,
            batch_size=o.batch_size,
            backoff=Backoff(o.backoff_base, o.backoff_cap, o.jitter, o.random),
            threads=self._threads,
            wake=self._wake,
            dependencies=AsyncWorkerCalls(store).dependencies,
            tracing=tracing,
        )
        exchange = Exchange(
            store,
            executor,
            worker=self.name,
            groups=self._groups(),
            concurrency=o.concurrency,
            batch_size=o.batch_size,
            record=record,
            delete=o.delete_succeeded,
            tracing=tracing,
        )
        leases = [self._lease(h) for h in self.handlers.values()] or [o.lease]
        beat = Leases(store, executor, self._lease).run(leases, extend=o.heartbeat)
        return executor, exchange, beat

    def _start(self, executor: JobExecutor, exchange: Exchange, jobs: list[Job]) -> None:
        contexts = exchange.contexts
        for job in jobs:
            executor.start(job, self.handlers[job.type], contexts.pop(job.id, None) if contexts else None)

    # --- one batch ----------------------------------------------------------------------------------
    async def atick(self) -> TickResult:
        """tick() for async callers."""
        await self._check_schema()
        results: list[JobResult] = []
        executor, exchange, beat = self._parts(results.append)
        try:
            jobs = await exchange.claim(self.options.batch_size)
            self._start(executor, exchange, jobs)
            while executor.running or executor.outcomes:
                exchange.settle()
                if executor.running:
                    await executor.wake.wait()
                    executor.wake.clear()
            exchange.settle()
            await exchange.complete()
            await exchange.wind_down()
            await executor.wind_down()
        finally:
            beat.cancel()
        by_id = {r.job_id: r for r in results}
        return TickResult(tuple(by_id[j.id] for j in jobs if j.id in by_id))

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
        if not self.handlers.types:
            raise InvalidArgument("jobkit: register a handler before running the worker")
        loop = asyncio.get_running_loop()
        self._stop.clear()
        self._abandon.clear()
        await self._check_schema(retry=True)
        summary = RunSummary()
        telemetry = self._telemetry = self._telemetry_for_run()

        def record(result: JobResult) -> None:
            summary.add(result)
            telemetry.ended(result)

        executor, exchange, beat = self._parts(record)
        if otel_metrics_configured():
            telemetry.otel = OtelMetrics.get().observe(
                lambda: [r.job.type for r in executor.running.values()], lambda: telemetry.depth
            )
        self._wake_loop = loop
        signals = []
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, self._on_signal, sig)
                signals.append(sig)
        started = time.monotonic()
        metrics: metrics_http.MetricsServer | None = None
        try:
            metrics = await self._serve_metrics(telemetry, executor)
            subscription = await self._store().listen(executor.wake.set)
        except BaseException:
            beat.cancel()
            if metrics is not None:
                await metrics.close()
                self.metrics_port = None
            raise
        presence_stop = asyncio.Event()
        presence = (
            asyncio.create_task(
                Presence(
                    self._store(),
                    self.name,
                    types=self.types,
                    concurrency=self.options.concurrency,
                    telemetry=telemetry,
                    activity=telemetry.activity,
                    interval=self.options.beat,
                ).run(presence_stop),
                name="jobkit-presence",
            )
            if telemetry.activity is not None
            else None
        )
        log.info(
            "worker %s started: types=%s concurrency=%d",
            self.name,
            ",".join(self.types),
            self.options.concurrency,
        )
        scheduler_stop = asyncio.Event()
        scheduler = (
            asyncio.create_task(Scheduler(self._store()).arun(scheduler_stop), name="jobkit-scheduler")
            if self.options.schedules
            else None
        )
        try:
            summary.claimed = await self._loop_until_stopped(executor, exchange, max_jobs, until_empty)
            await self._drain(executor, exchange)
            await exchange.wind_down()
            await executor.wind_down()
        finally:
            beat.cancel()
            scheduler_stop.set()
            if scheduler is not None:
                await scheduler
            await subscription.close()
            presence_stop.set()
            if presence is not None:
                await presence
            if metrics is not None:
                await metrics.close()
                self.metrics_port = None
            for sig in signals:
                loop.remove_signal_handler(sig)
            self._wake_loop = None
            await self._stopped()
        summary.seconds = time.monotonic() - started
        log.info("worker %s stopped: %s", self.name, summary)
        return summary

    def _telemetry_for_run(self) -> Telemetry:
        """What this run keeps for the outside: activity for its beats when it beats; Prometheus metrics when
        they are served (OpenTelemetry's, when the app set a meter provider, are added by arun)."""
        telemetry = Telemetry(
            activity=Activity() if self.options.beat > 0 else None,
            prometheus=Prometheus() if self.options.metrics_port is not None else None,
        )
        if telemetry.prometheus is not None:
            telemetry.prometheus.info.labels(self.name, __version__).set(1)
        return telemetry

    async def _serve_metrics(
        self, telemetry: Telemetry, executor: JobExecutor
    ) -> metrics_http.MetricsServer | None:
        """Serve ``telemetry``'s Prometheus metrics, if asked: running jobs counted and the queue's depth
        read (``Telemetry.read_depth``) at each scrape."""
        prometheus, o = telemetry.prometheus, self.options
        if prometheus is None or o.metrics_port is None:
            return None
        store = self._store()

        async def before_scrape() -> None:
            prometheus.set_running(r.job.type for r in executor.running.values())
            prometheus.set_depth(await telemetry.read_depth(store))

        try:
            server = await metrics_http.serve(
                prometheus.registry, host=o.metrics_host, port=o.metrics_port, before_scrape=before_scrape
            )
        except OSError as exc:
            raise ConfigurationError(
                f"jobkit: cannot serve metrics on {o.metrics_host}:{o.metrics_port} ({exc.strerror or exc}); "
                "choose another --metrics-port"
            ) from None
        self.metrics_port = server.port
        return server

    async def _stopped(self) -> None:
        for fn in self._on_stop:
            try:
                result = fn()
                if result is not None:
                    await result
            except Exception:
                log.exception("on_stop hook %s failed", getattr(fn, "__name__", fn))

    async def _loop_until_stopped(
        self, executor: JobExecutor, exchange: Exchange, max_jobs: int | None, until_empty: bool
    ) -> int:
        """Claim and complete through the exchange until stopped (or out of work, or ``max_jobs`` claimed)."""
        claimed_total, fault_delay, rest = 0, 0.0, False
        wake = executor.wake
        try:
            while not self._stop.is_set():
                wake.clear()
                exchange.settle()
                fault: TransientError | None = None
                empty = False
                for answer in exchange.finished():  # any error but a transient one ends run()
                    if isinstance(answer, TransientError):
                        fault = answer
                        if self._telemetry is not None:
                            self._telemetry.fault(answer)
                        continue
                    fault_delay = 0.0
                    self._start(executor, exchange, answer)
                    claimed_total += len(answer)
                    rest = rest or exchange.drained  # the queue is drained, or every slot is busy: wait
                    empty = until_empty and not answer and not exchange and not executor.running
                    empty = empty and not exchange.busy
                if empty:
                    break  # nothing was runnable and nothing is left to settle
                if fault is not None:
                    fault_delay = _backoff(fault, fault_delay)
                    await self._sleep(wake, fault_delay)
                    continue
                if max_jobs is not None and claimed_total >= max_jobs:
                    break
                if not rest and exchange.send(None if max_jobs is None else max_jobs - claimed_total):
                    continue
                rest = False
                await self._sleep(wake, FLUSH_AFTER if executor.done else self.options.poll_interval)
        except BaseException:  # ending run(): jobs claimed by round trips still in flight are not started
            await exchange.in_flight()  # (their leases expire)
            raise
        # stopping: the jobs claimed by round trips still in flight run (the drain waits for them), or are
        # given back unstarted
        jobs = await exchange.in_flight()
        if self._abandon.is_set():
            await exchange.release(jobs)
        else:
            self._start(executor, exchange, jobs)
        return claimed_total + len(jobs)

    @staticmethod
    async def _sleep(wake: asyncio.Event, seconds: float) -> None:
        """Wait ``seconds``, or less when woken (a LISTEN notify, a finished job, stop())."""
        if wake.is_set():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):  # no task per wait, as wait_for would make
                await wake.wait()

    async def _drain(self, executor: JobExecutor, exchange: Exchange) -> None:
        """After stop: finish (or give back) in-flight jobs, then write how each ended. Finished jobs are
        completed as they are in a run, in batches within FLUSH_AFTER, not held until the longest job ends:
        a job that finished is not left running for others to see, nor reclaimed should this process
        die before the rest end."""
        fault_delay, retry_at = 0.0, 0.0
        while executor.running and not self._abandon.is_set():
            await self._sleep(executor.wake, FLUSH_AFTER if executor.done else 0.05)
            executor.wake.clear()
            exchange.settle()
            if exchange.complete_due() and time.monotonic() >= retry_at:
                try:
                    await exchange.complete()
                    fault_delay = 0.0
                except JobkitError as exc:  # the jobs stay done, for the next try (or the final one)
                    fault_delay = min(max(fault_delay * 2, 0.1), 5.0)
                    retry_at = time.monotonic() + fault_delay
                    log.warning("complete failed (%s); retrying in %.1fs", describe(exc), fault_delay)
        if self._abandon.is_set():
            await exchange.give_back()
        exchange.settle()
        await exchange.wind_down()
        for attempt in range(1, 6):
            try:
                await exchange.complete()
                break
            except JobkitError as exc:
                log.warning("final complete failed (%s); attempt %d of 5", describe(exc), attempt)
                await asyncio.sleep(0.2 * attempt)
        if self._abandon.is_set() and self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)  # their threads cannot be stopped
            self._threads = None


def _backoff(fault: TransientError, delay: float) -> float:
    """The wait after a store fault, ``delay`` the one before (0 for the first): doubling from 0.1 s to
    5 s, and logged."""
    delay = min(max(delay * 2, 0.1), 5.0)
    log.warning("store error (%s); retrying in %.1fs", describe(fault), delay)
    return delay
