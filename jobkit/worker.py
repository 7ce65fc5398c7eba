"""The Worker: handlers by job type; one tick = claim a batch, run the handlers, complete or fail each.

``tick()`` does one batch and returns what happened, without sleeping (tests drive it by hand).
``run()`` loops: claims while it has free slots, waits for a LISTEN wake-up or the poll interval, runs
up to ``concurrency`` handlers at once (sync ones in threads, async ones in an event loop of their
thread), extends leases of long handlers, batches completions into one round trip, rides out transient
store faults with backoff (any other store error, such as a key without service rights, ends it at
once), and stops gracefully on SIGINT/SIGTERM (a second signal gives in-flight jobs back).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from datetime import timedelta
from types import FrameType
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from jobkit import core
from jobkit.errors import InvalidArgument, JobkitError, TransientError
from jobkit.models import Job, JobStatus
from jobkit.settings import Settings
from jobkit.stores import open_store
from jobkit.stores.base import JobStore

log = logging.getLogger("jobkit.worker")
Outcome = Literal["succeeded", "retrying", "dead", "lost", "released"]


class Retry(Exception):
    """Raise from a handler to retry after ``after`` (default: the backoff schedule)."""

    def __init__(self, message: str = "retry requested", *, after: timedelta | float | None = None) -> None:
        super().__init__(message)
        self.after = timedelta(seconds=after) if isinstance(after, int | float) else after


class Permanent(Exception):
    """Raise from a handler for a failure no retry can fix: the job goes dead at once."""


@dataclass(frozen=True)
class JobResult:
    """How one job ended in this worker."""

    job_id: uuid.UUID
    type: str
    attempt: int
    outcome: Outcome
    error: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class TickResult:
    """What one ``tick()`` did."""

    results: tuple[JobResult, ...] = ()

    @property
    def claimed(self) -> int:
        return len(self.results)

    def count(self, outcome: Outcome) -> int:
        return sum(1 for r in self.results if r.outcome == outcome)


@dataclass(frozen=True)
class _Handler:
    name: str
    fn: Callable[..., Any]
    lease: timedelta
    max_attempts: int | None
    payload: type[BaseModel] | None
    wants_job: bool


@dataclass(eq=False)
class _Running:
    job: Job
    handler: _Handler
    started: float
    extended: float
    lease_token: uuid.UUID = field(init=False)
    lost: bool = False
    abandoned: bool = False

    def __post_init__(self) -> None:
        assert self.job.lease_token is not None
        self.lease_token = self.job.lease_token


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Worker:
    """Runs handlers for the job types registered on it, against any JobStore."""

    def __init__(
        self,
        store: JobStore,
        *,
        name: str | None = None,
        concurrency: int = 1,
        batch_size: int | None = None,
        poll_interval: float = 1.0,
        lease: timedelta = timedelta(seconds=30),
        backoff_base: float = 1.0,
        backoff_cap: float = 300.0,
        jitter: float = 0.1,
        random_source: Callable[[], float] | None = None,
        heartbeat: bool = True,
    ) -> None:
        if concurrency < 1:
            raise InvalidArgument("jobkit: concurrency must be >= 1")
        if batch_size is not None and batch_size < 1:
            raise InvalidArgument("jobkit: batch_size must be >= 1")
        if poll_interval <= 0:
            raise InvalidArgument("jobkit: poll_interval must be > 0 seconds")
        core.check_lease(lease)
        core.backoff(1, base=backoff_base, cap=backoff_cap)  # validates base and cap
        self.store = store
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        core.check_worker(self.name)
        self.concurrency = concurrency
        self.batch_size = batch_size or concurrency
        self.poll_interval = poll_interval
        self.lease = lease
        self.backoff_base, self.backoff_cap, self.jitter = backoff_base, backoff_cap, jitter
        self._random = random_source or random.Random().random
        self.heartbeat = heartbeat
        self._handlers: dict[str, _Handler] = {}
        self._lock = threading.Lock()
        self._running: dict[uuid.UUID, _Running] = {}
        self._done: list[_Running] = []  # succeeded, awaiting one batched complete
        self._executor: ThreadPoolExecutor | None = None
        self._stop = threading.Event()
        self._abandon = threading.Event()
        self._wake = threading.Event()

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
        return f"Worker(name={self.name!r}, types={sorted(self._handlers)}, concurrency={self.concurrency})"

    # --- registration -----------------------------------------------------------------------------------
    def handler(
        self,
        type: str,
        *,
        lease: timedelta | None = None,
        max_attempts: int | None = None,
        payload: type[BaseModel] | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register the decorated function for jobs of ``type``.

        It is called as ``fn(payload)`` or ``fn(payload, job)``; ``payload`` is an instance of the given
        pydantic model (a payload that fails it makes the job dead at once) or the raw dict. It may be
        ``async``. ``max_attempts`` caps attempts for this type (a failure at or past it is final).
        """

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.register(type, fn, lease=lease, max_attempts=max_attempts, payload=payload)
            return fn

        return register

    def register(
        self,
        type: str,
        fn: Callable[..., Any],
        *,
        lease: timedelta | None = None,
        max_attempts: int | None = None,
        payload: type[BaseModel] | None = None,
    ) -> None:
        """Non-decorator form of ``handler``."""
        core.check_types([type])
        if type in self._handlers:
            raise InvalidArgument(f"jobkit: a handler for {type!r} is already registered")
        lease = lease or self.lease
        core.check_lease(lease)
        if max_attempts is not None and max_attempts < 1:
            raise InvalidArgument("jobkit: max_attempts must be >= 1")
        positional = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
        ]
        if not positional:
            raise InvalidArgument(f"jobkit: handler for {type!r} must take (payload) or (payload, job)")
        wants_job = len(positional) >= 2 or positional[0].kind is positional[0].VAR_POSITIONAL
        self._handlers[type] = _Handler(type, fn, lease, max_attempts, payload, wants_job)

    @property
    def types(self) -> list[str]:
        return sorted(self._handlers)

    # --- one batch --------------------------------------------------------------------------------------
    def tick(self) -> TickResult:
        """Claim up to ``batch_size`` jobs, run them (``concurrency`` at a time), settle each; no sleeping."""
        jobs = self._claim(self.batch_size)
        futures = [self._submit(job) for job in jobs]
        with self._heartbeat():
            wait_futures(futures)
        by_id = {r.job_id: r for f in futures if (r := f.result()) is not None}
        by_id.update({r.job_id: r for r in self._flush()})
        return TickResult(tuple(by_id[j.id] for j in jobs if j.id in by_id))

    def _claim(self, limit: int) -> list[Job]:
        if not self._handlers:
            raise InvalidArgument("jobkit: register a handler before claiming jobs")
        groups: dict[timedelta, list[str]] = {}
        for h in self._handlers.values():
            groups.setdefault(h.lease, []).append(h.name)
        jobs: list[Job] = []
        for lease, types in groups.items():
            if len(jobs) >= limit:
                break
            jobs.extend(self.store.claim(types, self.name, lease, limit - len(jobs)))
        return jobs

    def _submit(self, job: Job) -> Future[JobResult | None]:
        now = time.monotonic()
        run = _Running(job, self._handlers[job.type], started=now, extended=now)
        with self._lock:
            self._running[job.id] = run
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix="jobkit-handler")
        future = self._executor.submit(self._execute, run)
        future.add_done_callback(lambda _: self._wake.set())
        return future

    def _call(self, run: _Running) -> None:
        h, job = run.handler, run.job
        payload: Any = job.payload
        if h.payload is not None:
            try:
                payload = h.payload.model_validate(job.payload)
            except ValidationError as exc:
                raise Permanent(f"payload rejected by {h.payload.__name__}: {exc}") from exc
        result = h.fn(payload, job) if h.wants_job else h.fn(payload)
        if inspect.isawaitable(result):
            asyncio.run(_await(result))

    def _execute(self, run: _Running) -> JobResult | None:
        """In a pool thread: run the handler; settle a failure now, queue a success for a batched complete."""
        job = run.job
        extra = {"job_id": str(job.id), "job_type": job.type, "attempt": job.attempts}
        try:
            self._call(run)
        except Exception as exc:  # every handler failure is recorded, none escapes
            if run.abandoned:
                return None
            return self._settle_failure(run, exc, extra)
        finally:
            with self._lock:
                self._running.pop(job.id, None)
        if run.abandoned:
            return None
        with self._lock:
            self._done.append(run)
        return None

    def _settle_failure(self, run: _Running, exc: Exception, extra: dict[str, Any]) -> JobResult:
        job, h = run.job, run.handler
        permanent = isinstance(exc, Permanent) or (
            h.max_attempts is not None and job.attempts >= h.max_attempts
        )
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
        error = _describe(exc)
        seconds = time.monotonic() - run.started
        result = self.store.fail(job.id, run.lease_token, error, delay, permanent)
        if not result.ok:
            log.warning(
                "job %s type=%s attempt=%d failed but its lease was lost: %s",
                job.id,
                job.type,
                job.attempts,
                error,
                extra=extra,
            )
            return JobResult(job.id, job.type, job.attempts, "lost", error, seconds)
        outcome: Outcome = "dead" if result.status == JobStatus.DEAD else "retrying"
        log.warning(
            "job %s type=%s attempt=%d %s: %s",
            job.id,
            job.type,
            job.attempts,
            "dead" if outcome == "dead" else f"retrying in {delay.total_seconds():.1f}s",
            error,
            extra=extra,
        )
        return JobResult(job.id, job.type, job.attempts, outcome, error, seconds)

    def _flush(self) -> list[JobResult]:
        """Complete every finished job in one round trip; a lost lease is logged, not raised."""
        with self._lock:
            done, self._done = self._done, []
        if not done:
            return []
        try:
            ok = self.store.complete_many([(r.job.id, r.lease_token) for r in done])
        except BaseException:
            with self._lock:
                self._done[:0] = done  # try again on the next flush; the leases still guard them
            raise
        now = time.monotonic()
        results = []
        for r in done:
            job = r.job
            extra = {"job_id": str(job.id), "job_type": job.type, "attempt": job.attempts}
            if ok.get(job.id):
                log.info(
                    "job %s type=%s attempt=%d succeeded in %.3fs",
                    job.id,
                    job.type,
                    job.attempts,
                    now - r.started,
                    extra=extra,
                )
                results.append(JobResult(job.id, job.type, job.attempts, "succeeded", None, now - r.started))
            else:
                log.warning(
                    "job %s type=%s attempt=%d finished, but its lease was lost: not completed",
                    job.id,
                    job.type,
                    job.attempts,
                    extra=extra,
                )
                results.append(JobResult(job.id, job.type, job.attempts, "lost", None, now - r.started))
        return results

    # --- lease heartbeat --------------------------------------------------------------------------------
    def _beat(self) -> None:
        """Extend every lease whose handler has run past a third of it."""
        now = time.monotonic()
        with self._lock:
            due = [
                r
                for r in self._running.values()
                if not r.lost and now - r.extended >= r.handler.lease.total_seconds() / 3
            ]
        for r in due:
            try:
                until = self.store.extend_lease(r.job.id, r.lease_token, r.handler.lease)
            except JobkitError as exc:
                log.warning("job %s lease extension failed (%s); will try again", r.job.id, _describe(exc))
                continue
            if until is None:
                r.lost = True
                log.warning(
                    "job %s type=%s attempt=%d lost its lease while running",
                    r.job.id,
                    r.job.type,
                    r.job.attempts,
                )
            else:
                r.extended = now

    def _heartbeat(self) -> _Heartbeat:
        leases = [h.lease.total_seconds() for h in self._handlers.values()] or [self.lease.total_seconds()]
        return _Heartbeat(
            self._beat if self.heartbeat else None, interval=min(5.0, max(0.05, min(leases) / 6))
        )

    def close(self) -> None:
        """Shut down the handler threads (after ``tick()`` use; ``run()`` does this itself)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # --- the loop ---------------------------------------------------------------------------------------
    def stop(self, *, abandon: bool = False) -> None:
        """Stop claiming and let in-flight jobs finish; with ``abandon``, give them back instead."""
        self._stop.set()
        if abandon:
            self._abandon.set()
        self._wake.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stop.is_set():
            log.warning("second %s: giving in-flight jobs back", signal.Signals(signum).name)
            self.stop(abandon=True)
        else:
            log.warning(
                "%s: finishing in-flight jobs (send again to give them back)", signal.Signals(signum).name
            )
            self.stop()

    def run(self, *, install_signals: bool = True, max_jobs: int | None = None) -> None:
        """Process jobs until ``stop()`` (or SIGINT/SIGTERM). ``max_jobs``: stop after that many claims."""
        if not self._handlers:
            raise InvalidArgument("jobkit: register a handler before running the worker")
        previous: dict[signal.Signals, Any] = {}
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self._on_signal)
        self._stop.clear()
        self._abandon.clear()
        subscription = self.store.listen(self._wake.set)
        log.info(
            "worker %s started: types=%s concurrency=%d", self.name, ",".join(self.types), self.concurrency
        )
        claimed_total = 0
        fault_delay = 0.0
        try:
            with self._heartbeat():
                while not self._stop.is_set():
                    self._wake.clear()
                    try:
                        self._flush()
                        free = self.concurrency - len(self._running) - len(self._done)
                        if max_jobs is not None:
                            free = min(free, max_jobs - claimed_total)
                        jobs = self._claim(min(free, self.batch_size)) if free > 0 else []
                        fault_delay = 0.0
                    except TransientError as exc:  # anything else (bad key, no migrations) ends run()
                        fault_delay = min(max(fault_delay * 2, 0.1), 5.0)
                        log.warning("store error (%s); retrying in %.1fs", _describe(exc), fault_delay)
                        self._stop.wait(fault_delay)
                        continue
                    for job in jobs:
                        self._submit(job)
                    claimed_total += len(jobs)
                    if max_jobs is not None and claimed_total >= max_jobs:
                        self._stop.set()
                    elif jobs and len(jobs) == min(free, self.batch_size):
                        continue  # the queue may hold more: claim again while there are free slots
                    self._wake.wait(self.poll_interval)
                self._drain()
        finally:
            subscription.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            log.info("worker %s stopped", self.name)

    def _drain(self) -> None:
        """After stop: finish (or give back) in-flight jobs, then flush completions."""
        while True:
            with self._lock:
                running = list(self._running.values())
            if not running:
                break
            if self._abandon.is_set():
                for r in running:
                    r.abandoned = True
                    try:
                        self.store.release(r.job.id, r.lease_token)
                        log.warning(
                            "job %s type=%s attempt=%d given back", r.job.id, r.job.type, r.job.attempts
                        )
                    except JobkitError as exc:
                        log.warning(
                            "job %s could not be given back (%s); its lease will expire",
                            r.job.id,
                            _describe(exc),
                        )
                    with self._lock:
                        self._running.pop(r.job.id, None)
                break
            self._wake.wait(0.05)
            self._wake.clear()
        for attempt in range(5):
            try:
                self._flush()
                break
            except JobkitError as exc:
                log.warning("final complete failed (%s); attempt %d of 5", _describe(exc), attempt + 1)
                time.sleep(0.2 * (attempt + 1))
        if self._executor is not None:
            self._executor.shutdown(wait=not self._abandon.is_set(), cancel_futures=True)
            self._executor = None


async def _await(awaitable: Any) -> Any:
    return await awaitable


class _Heartbeat:
    """A daemon thread calling ``beat`` every ``interval`` seconds while the context is open (None: off)."""

    def __init__(self, beat: Callable[[], None] | None, interval: float) -> None:
        self._beat, self._interval = beat, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jobkit-heartbeat", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if self._beat is not None:
                self._beat()

    def __enter__(self) -> _Heartbeat:
        if self._beat is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
