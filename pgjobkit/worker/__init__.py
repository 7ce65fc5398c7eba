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
import dataclasses
import logging
import os
import socket
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar, Unpack

from pgjobkit import _deprecated
from pgjobkit.errors import InvalidArgument, Permanent, Retry
from pgjobkit.settings import Settings
from pgjobkit.stores import open_store
from pgjobkit.stores.base import JobStore
from pgjobkit.stores.base_async import AsyncJobStore
from pgjobkit.worker import loop, services
from pgjobkit.worker.options import WorkerOptions
from pgjobkit.worker.parts import HandlerThreads, Parts
from pgjobkit.worker.registry import HandlerOptions, Registry
from pgjobkit.worker.results import AttemptReport, RunSummary, TickResult
from pgjobkit.worker.telemetry import Telemetry

__getattr__ = _deprecated.renamed(__name__, {"JobResult": "pgjobkit.worker.results:AttemptReport"})
__all__ = ["AttemptReport", "Permanent", "Retry", "RunSummary", "TickResult", "Worker", "WorkerOptions"]
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
    (a sync handler enqueueing follow-up jobs, say). Inside: the parts of a run (``worker.parts``), the
    loop that drives them (``worker.loop``) and the services beside it (``worker.services``).
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
        self._threads = HandlerThreads()
        self._stopping = loop.Stopping()  # requested from any thread by stop()
        self._schema_checked = False
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
        return self._stopping.abandon.is_set()

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
        """Claim up to ``batch_size`` jobs, run them, and record how each ended; no sleeping."""
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
        self._threads.close(wait=not self.abandoned)

    def _store(self) -> AsyncJobStore:
        if self._astore is None:
            assert isinstance(self.store, JobStore)
            self._astore = self.store.as_async()
        return self._astore

    async def _check_schema(self, *, retry: bool = False) -> None:
        """Refuse, once per worker, a database whose jobkit schema is not this jobkit's, before anything is
        claimed (``loop.schema_checked``)."""
        if not self._schema_checked:
            self._schema_checked = await loop.schema_checked(self._store(), self._stopping, retry=retry)

    def _parts(self, record: Callable[[AttemptReport], None]) -> Parts:
        return Parts.build(
            self._store(),
            self.handlers,
            self.options,
            worker=self.name,
            types=self.types,
            threads=self._threads.pool(self.options.concurrency),
            record=record,
        )

    # --- one batch ----------------------------------------------------------------------------------
    async def atick(self) -> TickResult:
        """tick() for async callers."""
        await self._check_schema()
        results: list[AttemptReport] = []
        parts = self._parts(results.append)
        async with parts.heartbeat():
            jobs = await loop.tick(parts.executor, parts.exchange, self.options.batch_size)
        by_id = {r.job_id: r for r in results}
        return TickResult(tuple(by_id[j.id] for j in jobs if j.id in by_id))

    # --- the run ------------------------------------------------------------------------------------
    def stop(self, *, abandon: bool = False) -> None:
        """Stop claiming and let in-flight jobs finish; with ``abandon``, give them back instead. Safe from
        any thread and from a signal handler."""
        self._stopping.request(abandon=abandon)

    async def arun(
        self, *, install_signals: bool = True, max_jobs: int | None = None, until_empty: bool = False
    ) -> RunSummary:
        """run() for async callers (signals are installed only when the loop runs in the main thread)."""
        if not self.handlers.types:
            raise InvalidArgument("jobkit: register a handler before running the worker")
        self._stopping.clear()
        await self._check_schema(retry=True)
        summary, o = RunSummary(), self.options
        telemetry = Telemetry.for_run(
            self.name, reports=o.presence_every > 0, serves_metrics=o.metrics_port is not None
        )

        def record(result: AttemptReport) -> None:
            summary.add(result)
            telemetry.ended(result)

        parts = self._parts(record)
        telemetry.watch(parts.running_types)
        started = time.monotonic()
        beside = services.for_run(self, parts, telemetry, self._stopping, install_signals=install_signals)
        running = await services.start(beside)  # they stop when the run ends, the last started first
        log.info("worker %s started: types=%s concurrency=%d", self.name, ",".join(self.types), o.concurrency)
        async with services.on_stop_hooks(self._on_stop), running:  # the hooks once the services stopped
            run = loop.Loop(
                parts.executor,
                parts.exchange,
                self._stopping,
                o.poll_interval,
                telemetry.fault,
                self._threads.let_go,
            )
            summary.claimed = await run.run(max_jobs=max_jobs, until_empty=until_empty)
        summary.seconds = time.monotonic() - started
        log.info("worker %s stopped: %s", self.name, summary)
        return summary
