"""The jobs a worker holds during one ``run()`` or ``tick()``: each claimed job runs as a task on the worker's
loop (a sync handler in the thread pool, off it), at most ``concurrency`` at once; a failure is settled at
once, successes are completed in batches, long handlers' leases are extended, and on a forced stop the
held jobs are given back."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from jobkit import core
from jobkit.errors import JobkitError
from jobkit.handlers import Handler, JobResult, Outcome, Permanent, Retry, Running, describe, running_as
from jobkit.lanes import Slots, SyncLane
from jobkit.models import Job, JobStatus, check_result
from jobkit.stores.base import AsyncJobStore

log = logging.getLogger("jobkit.worker")
FLUSH_AFTER = 0.02  # seconds a finished job may wait for its batched completion
QUICK = FLUSH_AFTER  # seconds from start to finish under which jobs count as quick (Worker claims ahead)
PROGRESS_EVERY = 1.0  # seconds between progress writes: a chatty handler writes a row a second at most


def job_log(level: int, job: Job, message: str, *args: Any) -> None:
    """A log line about one job: always its id, type and attempt, in the text and as ``extra``."""
    if log.isEnabledFor(level):
        extra = {"job_id": str(job.id), "job_type": job.type, "attempt": job.attempts}
        log.log(
            level, "job %s type=%s attempt=%d " + message, job.id, job.type, job.attempts, *args, extra=extra
        )


def _storable(value: Any) -> Any:
    """A handler's return value, checked to be storable as the job's result: a result that cannot be
    stored is a bug no retry fixes, so the job fails permanently, saying why."""
    try:
        return check_result(value)
    except ValueError as exc:
        raise Permanent(str(exc)) from None


@dataclass(frozen=True)
class Backoff:
    """The retry delay after a failure: ``base``·2^(attempt-1) seconds, capped, scaled by ±``jitter``."""

    base: float
    cap: float
    jitter: float
    random: Callable[[], float]

    def delay(self, attempt: int) -> timedelta:
        return core.backoff(attempt, base=self.base, cap=self.cap, jitter=self.jitter, random=self.random)


@dataclass(frozen=True)
class Claim:
    """What to claim in the same round trip as a completion: ``limit`` jobs of ``types`` on one lease."""

    types: Sequence[str]
    worker: str
    lease: timedelta
    limit: int


class Held:
    """The claimed jobs of one run: ``running`` (their tasks) and ``done`` (succeeded, not yet completed).

    ``record`` receives each job's result once settled; ``wake`` is set when the run loop has work: a batch
    to complete, or a slot freed.
    """

    def __init__(
        self,
        store: AsyncJobStore,
        *,
        concurrency: int,
        batch_size: int,
        backoff: Backoff,
        lease_of: Callable[[Handler], timedelta],
        executor: Executor,
        record: Callable[[JobResult], None],
        wake: asyncio.Event,
        delete: bool = False,
    ) -> None:
        self.store, self.batch_size, self.backoff, self.lease_of = store, batch_size, backoff, lease_of
        self.delete = delete  # complete by deleting ownerless jobs (Worker's delete_succeeded)
        self.record, self.wake = record, wake
        self.running: dict[uuid.UUID, Running] = {}
        self.done: list[Running] = []
        # jobs beyond concurrency wait for a slot (their leases extended): async ones in the slots' line,
        # sync ones in the lane
        self._slots = Slots(concurrency, self._spawn)
        self._lane = SyncLane(self._slots, concurrency, executor, self._ran, self._keep)
        self._tasks: set[asyncio.Task[None]] = set()  # runners and failure settling, referenced until done
        self._quick = False  # the jobs of the latest completed batch each finished within QUICK of starting

    @property
    def quick(self) -> bool:
        """Whether the jobs here run quick: each of the latest completed batch finished within QUICK of
        being started, and none still held has been held longer."""
        oldest = next(iter(self.running.values()), None)  # dicts keep order: the first started
        return self._quick and (oldest is None or time.monotonic() - oldest.started < QUICK)

    def start(self, job: Job, handler: Handler) -> Running:
        now = time.monotonic()
        run = Running(job, handler, started=now)
        self.running[job.id] = run
        if handler.is_async:
            self._lane.yield_slots()  # the slots a lingering runner holds are this job's to take
            self._slots.run(run)
        else:
            self._lane.add(run)
        return run

    def _spawn(self, run: Running, awaitable: Awaitable[Any] | None) -> None:
        """Start ``run``'s task in the slot it holds."""
        run.slot = True
        run.task = task = asyncio.get_running_loop().create_task(self._execute(run, awaitable))
        task.add_done_callback(lambda _: self._ended(run))

    def _free_slot(self, run: Running) -> None:
        """``run`` is done with its slot (if it still holds one)."""
        if run.slot:
            run.slot = False
            self._slots.give()

    def _ended(self, run: Running) -> None:
        """A task's end: its slot and its job are let go even if it was cancelled before it began."""
        self._free_slot(run)
        if run.job.id in self.running:
            if run.lost:
                self.record(JobResult(run.job.id, run.job.type, run.job.attempts, "lost", None, 0.0))
            self._finished(run, False)

    async def _execute(self, run: Running, awaitable: Awaitable[Any] | None = None) -> None:
        """Await the handler in the slot ``run`` holds; settle a failure now, keep a success for a batched
        complete."""
        succeeded = False
        try:
            try:
                with running_as(run):
                    value = await (run.handler.invoke(run.job) if awaitable is None else awaitable)
            finally:
                self._free_slot(run)
            run.result = _storable(value)
            succeeded = True
        except asyncio.CancelledError:
            if run.lost:  # cancelled, or reclaimed: the job is no longer this worker's
                self.record(JobResult(run.job.id, run.job.type, run.job.attempts, "lost", None, 0.0))
            elif not run.abandoned:
                raise
        except Exception as exc:  # every handler failure is recorded, none escapes
            if not run.abandoned:
                self.record(await self._settle_failure(run, exc))
        finally:
            self._finished(run, succeeded)

    def _finished(self, run: Running, succeeded: bool) -> None:
        self.running.pop(run.job.id, None)
        if succeeded and not run.abandoned:
            run.finished = time.monotonic()
            self.done.append(run)
        # Wake the loop only when there is work for it: a batch to complete, or a slot freed by a failure
        # or by the last running job. (It also wakes every FLUSH_AFTER while completions wait.)
        if not succeeded or len(self.done) >= self.batch_size or not self.running:
            self.wake.set()

    def _keep(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _ran(self, run: Running, result: Any, error: BaseException | None) -> None:
        """On the loop: a sync handler returned ``result`` or raised ``error``."""
        if run.abandoned:
            return
        if error is None and inspect.isawaitable(result):
            self._slots.run(run, result)
            return
        if error is None:
            try:
                run.result = _storable(result)
            except Permanent as exc:
                error = exc
        if error is None:
            self._finished(run, True)
        else:
            self._keep(asyncio.get_running_loop().create_task(self._fail(run, error)))

    async def _fail(self, run: Running, error: BaseException) -> None:
        try:
            self.record(await self._settle_failure(run, error))
        finally:
            self._finished(run, False)

    async def _settle_failure(self, run: Running, exc: BaseException) -> JobResult:
        job = run.job
        delay = (
            min(max(exc.after, timedelta(0)), core.MAX_RETRY_DELAY)  # a handler's delay, within the bounds
            if isinstance(exc, Retry) and exc.after is not None
            else self.backoff.delay(job.attempts)
        )
        error = describe(exc)
        seconds = time.monotonic() - run.started
        try:
            result = await self.store.fail(
                job.id, run.lease_token, error, delay, run.handler.is_final(job, exc)
            )
        except JobkitError as store_error:
            job_log(
                logging.WARNING,
                job,
                "failed (%s), and recording it failed too (%s): it runs again when its lease expires",
                error,
                describe(store_error),
            )
            return JobResult(job.id, job.type, job.attempts, "lost", error, seconds)
        if not result.ok:
            job_log(logging.WARNING, job, "failed but its lease was lost: %s", error)
            return JobResult(job.id, job.type, job.attempts, "lost", error, seconds)
        outcome: Outcome = "dead" if result.status == JobStatus.DEAD else "retrying"
        next_step = "dead" if outcome == "dead" else f"retrying in {delay.total_seconds():.1f}s"
        job_log(logging.WARNING, job, "%s: %s", next_step, error)
        return JobResult(job.id, job.type, job.attempts, outcome, error, seconds)

    def complete_due(self) -> bool:
        """Complete in batches: when a batch is done, when nothing else runs, or after FLUSH_AFTER."""
        if not self.done:
            return False
        return (
            len(self.done) >= self.batch_size
            or not self.running
            or time.monotonic() - self.done[0].finished >= FLUSH_AFTER
        )

    def take_done(self) -> list[Running]:
        """The finished jobs, taken to be completed."""
        done, self.done = self.done, []
        return done

    async def complete(self, claim: Claim | None = None, done: list[Running] | None = None) -> list[Job]:
        """Complete every finished job (or ``done``, taken before) in one round trip, claiming per
        ``claim`` in the same one. A lost lease is logged, not raised; on a store error the jobs stay done,
        for the next call."""
        if done is None:
            done = self.take_done()
        if not done:
            return (
                await self.store.claim(claim.types, claim.worker, claim.lease, claim.limit) if claim else []
            )
        self._quick = all(r.finished - r.started < QUICK for r in done)
        pairs = [(r.job.id, r.lease_token) for r in done]
        results = {r.job.id: r.result for r in done if r.result is not None}
        jobs: list[Job] = []
        try:
            if claim is not None:
                ok, jobs = await self.store.complete_and_claim(
                    pairs, claim.types, claim.worker, claim.lease, claim.limit, results, delete=self.delete
                )
            else:
                ok = await self.store.complete_many(pairs, results, delete=self.delete)
        except BaseException:
            self.done[:0] = done  # the leases still guard them
            raise
        now = time.monotonic()
        for r in done:
            job, seconds, succeeded = r.job, now - r.started, bool(ok.get(r.job.id))
            if succeeded:
                job_log(logging.INFO, job, "succeeded in %.3fs", seconds)
            else:
                job_log(logging.WARNING, job, "finished, but its lease was lost: not completed")
            self.record(
                JobResult(job.id, job.type, job.attempts, "succeeded" if succeeded else "lost", None, seconds)
            )
        return jobs

    async def beat(self) -> None:
        """One heartbeat for every running job, one call per lease: leases past a third are extended, and
        a job that is no longer this worker's (cancelled, reclaimed) has its handler stopped."""
        groups: dict[timedelta, list[Running]] = {}
        for r in self.running.values():
            if not r.lost:
                groups.setdefault(self.lease_of(r.handler), []).append(r)
        for lease, runs in groups.items():
            try:
                beats = await self.store.heartbeat([(r.job.id, r.lease_token) for r in runs], lease)
            except JobkitError as exc:
                log.warning("heartbeat failed (%s); will try again", describe(exc))
                continue
            for r in runs:
                beat = beats.get(r.job.id)
                if beat is not None and not beat.held and r.job.id in self.running:
                    self._lose(r, beat.status)

    def _lose(self, run: Running, status: JobStatus | None) -> None:
        """The job is no longer this worker's: stop its handler. An async one is cancelled; a sync one
        sees ``current().cancelled``, or never starts; whatever it does later is fenced off."""
        run.lost = True
        run.stopped = True
        why = "was cancelled" if status == JobStatus.CANCELLED else f"lost its lease (now {status or 'gone'})"
        job_log(logging.WARNING, run.job, "%s: stopping its handler", why)
        if run.task is not None:
            run.task.cancel()
            return
        if self._slots.leave(run) or self._lane.remove(run):  # still waiting: it never runs
            self.record(JobResult(run.job.id, run.job.type, run.job.attempts, "lost", None, 0.0))
            self._finished(run, False)

    async def report_progress(self) -> None:
        """Write the latest progress each running job reported since the last call, in one call."""
        reports = []
        for r in self.running.values():
            if r.progress is not None and not r.lost:
                (fraction, message), r.progress = r.progress, None
                reports.append((r.job.id, r.lease_token, fraction, message))
        if not reports:
            return
        try:
            await self.store.progress(reports)
        except JobkitError as exc:
            log.warning("progress of %d job(s) not recorded (%s)", len(reports), describe(exc))

    def heartbeat(self, leases: Sequence[timedelta], beat: bool = True) -> asyncio.Task[None]:
        """A task writing progress every PROGRESS_EVERY seconds and, with ``beat``, calling ``beat`` often
        enough for the shortest of ``leases`` (every sixth of it, at most 5 s); cancel it to stop."""
        interval = min(5.0, max(0.05, min(lease.total_seconds() for lease in leases) / 6))
        tick = min(interval, PROGRESS_EVERY)

        async def loop() -> None:
            due = time.monotonic() + interval
            while True:
                await asyncio.sleep(tick)
                await self.report_progress()
                if beat and time.monotonic() >= due:
                    due += interval
                    await self.beat()

        return asyncio.get_running_loop().create_task(loop(), name="jobkit-heartbeat")

    async def wind_down(self) -> None:
        """Wait for the runners and failure settling still in flight (a runner whose thread has returned
        needs a turn of the loop to finish), so none is left pending when the loop closes."""
        self._lane.stop_lingering()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def release(self, jobs: Sequence[Job]) -> None:
        """Give back ``jobs``, claimed but never started (their attempts not counted)."""
        for job in jobs:
            assert job.lease_token is not None
            await self._release(job, job.lease_token)

    async def _release(self, job: Job, lease_token: uuid.UUID) -> None:
        try:
            await self.store.release(job.id, lease_token)
            job_log(logging.WARNING, job, "given back")
        except JobkitError as exc:
            job_log(
                logging.WARNING, job, "could not be given back (%s); its lease will expire", describe(exc)
            )

    async def give_back(self) -> None:
        """Release every running job unrun (its attempt not counted): an async handler's task is
        cancelled; a sync one's thread runs on, its result dropped."""
        given = list(self.running.values())
        for r in given:  # first, so that no slot let go below starts one of them
            r.abandoned = True
        self._lane.clear()
        self._slots.clear()
        for r in given:
            if r.task is not None:
                r.task.cancel()
            await self._release(r.job, r.lease_token)
            self.running.pop(r.job.id, None)
        for task in list(self._tasks):  # runners waiting on threads that cannot be stopped: let them go
            task.cancel()
        await self.wind_down()
