"""The Worker: handlers by job type; one tick = claim a batch, run the handlers, complete or fail each.

``tick()`` does one batch and returns what happened, without sleeping (tests drive it by hand).
``run()`` loops: claims while it has free slots, waits for a LISTEN wake-up or the poll interval, runs
up to ``concurrency`` handlers at once (sync ones in threads, async ones in an event loop of their
thread), extends leases of long handlers, batches completions into one round trip, rides out transient
store faults with backoff (any other store error, such as a key without service rights, ends it at
once), and stops gracefully on SIGINT/SIGTERM (a second signal gives in-flight jobs back).
"""

from __future__ import annotations

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
from datetime import timedelta
from types import FrameType
from typing import Any

from jobkit import core
from jobkit.errors import InvalidArgument, JobkitError, TransientError
from jobkit.handlers import (
    Heartbeat,
    JobResult,
    Outcome,
    Permanent,
    Registry,
    Retry,
    Running,
    TickResult,
    describe,
)
from jobkit.models import Job, JobStatus
from jobkit.settings import Settings
from jobkit.stores import open_store
from jobkit.stores.base import JobStore

__all__ = ["JobResult", "Permanent", "Retry", "TickResult", "Worker"]
log = logging.getLogger("jobkit.worker")


FLUSH_AFTER = 0.02  # seconds a finished job may wait for its batched completion


def _log(level: int, job: Job, message: str, *args: Any) -> None:
    """A log line about one job: always its id, type and attempt, in the text and as ``extra``."""
    if log.isEnabledFor(level):
        extra = {"job_id": str(job.id), "job_type": job.type, "attempt": job.attempts}
        log.log(
            level, "job %s type=%s attempt=%d " + message, job.id, job.type, job.attempts, *args, extra=extra
        )


class Worker(Registry):
    """Runs the handlers registered on it against any JobStore.

    ``concurrency`` handlers run at once; ``batch_size`` jobs (default: concurrency) are claimed per
    round trip, and the worker holds up to max(concurrency, batch_size) claimed jobs, completing a
    finished batch and claiming the next in the same call; ``lease`` is the default lease; failures retry after ``backoff_base``·2^(attempt-1)
    seconds, capped at ``backoff_cap``, scaled by up to ±``jitter``; ``heartbeat`` extends leases of
    handlers running past a third of theirs.
    """

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
        super().__init__()
        self.store = store
        self.name = name or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        core.check_worker(self.name)
        self.concurrency, self.batch_size, self.poll_interval, self.lease = 1, 1, 1.0, lease
        self.configure(
            concurrency=concurrency,
            batch_size=batch_size or concurrency,
            poll_interval=poll_interval,
            lease=lease,
        )
        core.backoff(1, base=backoff_base, cap=backoff_cap, jitter=jitter, random=lambda: 0.0)  # validates
        self.backoff_base, self.backoff_cap, self.jitter = backoff_base, backoff_cap, jitter
        self._random = random_source or random.Random().random
        self.heartbeat = heartbeat
        self._lock = threading.Lock()
        self._running: dict[uuid.UUID, Running] = {}
        self._done: list[Running] = []  # succeeded, awaiting one batched complete
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
        return f"Worker(name={self.name!r}, types={self.types}, concurrency={self.concurrency})"

    # --- settings ----------------------------------------------------------------------------------------
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

    # --- one batch ----------------------------------------------------------------------------------
    def tick(self) -> TickResult:
        """Claim up to ``batch_size`` jobs, run them (``concurrency`` at a time), settle each; no sleeping."""
        jobs = self._claim(self.batch_size)
        futures = [self._submit(job) for job in jobs]
        with self._heartbeat():
            wait_futures(futures)
        by_id = {r.job_id: r for f in futures if (r := f.result()) is not None}
        by_id.update({r.job_id: r for r in self._flush()[0]})
        return TickResult(tuple(by_id[j.id] for j in jobs if j.id in by_id))

    def _claim(self, limit: int) -> list[Job]:
        jobs: list[Job] = []
        for lease, types in self._groups().items():
            if len(jobs) >= limit:
                break
            jobs.extend(self.store.claim(types, self.name, lease, limit - len(jobs)))
        return jobs

    def _submit(self, job: Job) -> Future[JobResult | None]:
        now = time.monotonic()
        run = Running(job, self._handlers[job.type], started=now, extended=now)
        with self._lock:
            self._running[job.id] = run
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix="jobkit-handler")
        return self._executor.submit(self._execute, run)

    def _execute(self, run: Running) -> JobResult | None:
        """In a pool thread: run the handler; settle a failure now, queue a success for a batched complete."""
        result: JobResult | None = None
        succeeded = False
        try:
            run.handler(run.job)
            succeeded = True
        except Exception as exc:  # every handler failure is recorded, none escapes
            if not run.abandoned:
                result = self._settle_failure(run, exc)
        finally:
            with self._lock:
                self._running.pop(run.job.id, None)
                if succeeded and not run.abandoned:
                    run.finished = time.monotonic()
                    self._done.append(run)
                # Wake the loop only when there is work for it: a batch to flush, or a slot freed
                # by a failure or by the last running job. (It also wakes every FLUSH_AFTER.)
                due = not succeeded or len(self._done) >= self.batch_size or not self._running
            if due:
                self._wake.set()
        return result

    def _settle_failure(self, run: Running, exc: Exception) -> JobResult:
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
            result = self.store.fail(job.id, run.lease_token, error, delay, run.handler.is_final(job, exc))
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

    def _flush(self, claim: int = 0) -> tuple[list[JobResult], list[Job]]:
        """Complete every finished job in one round trip, and claim up to ``claim`` more in the same one
        when all types share a lease. A lost lease is logged, not raised."""
        with self._lock:
            done, self._done = self._done, []
        if not done:
            return [], self._claim(claim)
        pairs = [(r.job.id, r.lease_token) for r in done]
        groups = self._groups() if claim else {}
        jobs: list[Job] = []
        try:
            if len(groups) == 1:
                [(lease, types)] = groups.items()
                ok, jobs = self.store.complete_and_claim(pairs, types, self.name, lease, claim)
            else:
                ok = self.store.complete_many(pairs)
        except BaseException:
            with self._lock:
                self._done[:0] = done  # try again on the next flush; the leases still guard them
            raise
        if claim and len(groups) != 1:
            jobs = self._claim(claim)
        now = time.monotonic()
        results = []
        for r in done:
            job, seconds = r.job, now - r.started
            if ok.get(job.id):
                _log(logging.INFO, job, "succeeded in %.3fs", seconds)
            else:
                _log(logging.WARNING, job, "finished, but its lease was lost: not completed")
            outcome: Outcome = "succeeded" if ok.get(job.id) else "lost"
            results.append(JobResult(job.id, job.type, job.attempts, outcome, None, seconds))
        return results, jobs

    def close(self) -> None:
        """Shut down the handler threads (after ``tick()`` use; ``run()`` does this itself)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    # --- lease heartbeat ----------------------------------------------------------------------------
    def _beat(self) -> None:
        """Extend every lease whose handler has run past a third of it."""
        now = time.monotonic()
        with self._lock:
            due = [
                r
                for r in self._running.values()
                if not r.lost and now - r.extended >= self._lease(r.handler).total_seconds() / 3
            ]
        for r in due:
            try:
                until = self.store.extend_lease(r.job.id, r.lease_token, self._lease(r.handler))
            except JobkitError as exc:
                _log(logging.WARNING, r.job, "lease extension failed (%s); will try again", describe(exc))
                continue
            if until is None:
                r.lost = True
                _log(logging.WARNING, r.job, "lost its lease while running")
            else:
                r.extended = now

    def _heartbeat(self) -> Heartbeat:
        leases = [self._lease(h).total_seconds() for h in self._handlers.values()] or [
            self.lease.total_seconds()
        ]
        return Heartbeat(
            self._beat if self.heartbeat else None, interval=min(5.0, max(0.05, min(leases) / 6))
        )

    # --- the loop -----------------------------------------------------------------------------------
    def stop(self, *, abandon: bool = False) -> None:
        """Stop claiming and let in-flight jobs finish; with ``abandon``, give them back instead."""
        self._stop.set()
        if abandon:
            self._abandon.set()
        self._wake.set()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self._stop.is_set():
            log.warning("second %s: giving in-flight jobs back", name)
            self.stop(abandon=True)
        else:
            log.warning("%s: finishing in-flight jobs (send again to give them back)", name)
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
        try:
            with self._heartbeat():
                self._loop(max_jobs)
                self._drain()
        finally:
            subscription.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            log.info("worker %s stopped", self.name)

    def _flush_due(self) -> bool:
        """Complete in batches: when a batch is done, when nothing else runs, or after FLUSH_AFTER."""
        with self._lock:
            if not self._done:
                return False
            return (
                len(self._done) >= self.batch_size
                or not self._running
                or time.monotonic() - self._done[0].finished >= FLUSH_AFTER
            )

    def _loop(self, max_jobs: int | None) -> None:
        """Hold up to max(concurrency, batch_size) jobs; claim when half a batch of room is free."""
        claimed_total = 0
        fault_delay = 0.0
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
                jobs = self._flush(claim=want)[1] if flush else self._claim(want)
                fault_delay = 0.0
            except TransientError as exc:  # anything else (bad key, no migrations) ends run()
                fault_delay = min(max(fault_delay * 2, 0.1), 5.0)
                log.warning("store error (%s); retrying in %.1fs", describe(exc), fault_delay)
                self._stop.wait(fault_delay)
                continue
            for job in jobs:
                self._submit(job)
            claimed_total += len(jobs)
            if max_jobs is not None and claimed_total >= max_jobs:
                return
            if not jobs or len(jobs) < want:  # the queue is drained, or every slot is busy: wait
                self._wake.wait(FLUSH_AFTER if self._done else self.poll_interval)

    def _drain(self) -> None:
        """After stop: finish (or give back) in-flight jobs, then flush completions."""
        while True:
            with self._lock:
                running = list(self._running.values())
            if not running:
                break
            if self._abandon.is_set():
                self._give_back(running)
                break
            self._wake.wait(0.05)
            self._wake.clear()
        for attempt in range(1, 6):
            try:
                self._flush()
                break
            except JobkitError as exc:
                log.warning("final complete failed (%s); attempt %d of 5", describe(exc), attempt)
                time.sleep(0.2 * attempt)
        if self._executor is not None:
            self._executor.shutdown(wait=not self._abandon.is_set(), cancel_futures=True)
            self._executor = None

    def _give_back(self, running: list[Running]) -> None:
        for r in running:
            r.abandoned = True
            try:
                self.store.release(r.job.id, r.lease_token)
                _log(logging.WARNING, r.job, "given back")
            except JobkitError as exc:
                _log(
                    logging.WARNING,
                    r.job,
                    "could not be given back (%s); its lease will expire",
                    describe(exc),
                )
            with self._lock:
                self._running.pop(r.job.id, None)
