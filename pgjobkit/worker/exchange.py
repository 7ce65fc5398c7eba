"""Every round trip a worker makes for its jobs: claims, completions (in batches, folded into the next
claim), failures, and giving jobs back. What the executor's jobs come to (``pgjobkit.worker.executor``)
arrives here as values and is written here; the executor never calls the store.

Round trips in flight: one at a time; while the jobs run quick (each of the latest completed batch finished
within QUICK of being started, and none held has been held longer) and claims come back full, up to
1 + AHEAD, each claiming a batch ahead, so that the database works on some while the worker's process
handles the jobs of another."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import timedelta
from uuid import UUID

from pgjobkit.core.models import Job, JobStatus
from pgjobkit.core.transitions import CLAIM_LIMIT_CAP
from pgjobkit.errors import JobkitError, TransientError
from pgjobkit.exporters import otel
from pgjobkit.stores.base_async import AsyncJobStore
from pgjobkit.worker.calls_async import AsyncWorkerCalls
from pgjobkit.worker.context import Attempt
from pgjobkit.worker.executor import Failed, JobExecutor, Lost, job_log
from pgjobkit.worker.results import AttemptReport, Outcome, error_text, queue_wait

log = logging.getLogger("pgjobkit.worker")
AHEAD = 2  # batches a worker may hold beyond max(concurrency, batch_size) while its jobs run quick
FLUSH_AFTER = 0.02  # seconds a finished job may wait for its batched completion
QUICK = FLUSH_AFTER  # seconds from start to finish under which jobs count as quick (claims go ahead)
RESCAN = 10  # every RESCAN-th claim of a lease group looks from the front of the queue (see ClaimCursor)


def claim_size(
    *, held: int, asked: int, in_flight: int, capacity: int, batch: int, ahead: bool, left: int | None
) -> int:
    """How many jobs the next claim asks for (0: none now). ``held``: jobs the worker holds (running, their
    failures being written, finished ones not completed by this round trip); ``asked``: jobs asked for by the
    ``in_flight`` round trips; ``capacity``: max(concurrency, batch_size), which ``ahead`` (the jobs run quick
    and the queue is not drained) raises by AHEAD batches; ``left``: jobs the run may still claim (None: no
    cap). At most a batch, and only once half a batch is free (a whole one while another claim is in flight,
    ahead), so that claims are not sent a job at a time; with nothing held or asked, whatever is free."""
    free = capacity + (AHEAD * batch if ahead else 0) - held - asked
    if left is not None:
        free = min(free, left - asked)
    least = batch if ahead and in_flight else (batch + 1) // 2
    return max(min(free, batch), 0) if held + asked == 0 or free >= least else 0


class ClaimCursor:
    """Where a lease group's next claim starts looking (jobkit_claim's p_after): at the last job it claimed,
    so that claims do not walk past the index entries of every job claimed since the oldest open snapshot.
    Every RESCAN-th claim, and the claim after one that came back short, looks from the front, where a job
    of higher priority enqueued meanwhile is found."""

    def __init__(self) -> None:
        self.last: UUID | None = None
        self.sent = 0

    def after(self) -> UUID | None:
        """The p_after of the claim about to be sent."""
        self.sent += 1
        return None if self.sent % RESCAN == 0 else self.last

    def claimed(self, asked: int, jobs: Sequence[Job]) -> list[Job]:
        """Note what a claim of ``asked`` jobs took; returns ``jobs``."""
        self.last = jobs[-1].id if jobs and len(jobs) >= asked else None
        return list(jobs)


class Exchange:
    """The round trips of one run: ``store`` (the worker's), claiming for ``worker`` the types of each lease
    group of ``groups`` (one call per lease), for the jobs of ``executor``; each job's end goes to
    ``record``. It holds up to max(concurrency, batch_size) jobs, and while its jobs run quick AHEAD batches
    more; a claim goes out when half a batch of room is free (a whole batch when another is in flight)."""

    def __init__(
        self,
        store: AsyncJobStore,
        executor: JobExecutor,
        *,
        worker: str,
        groups: Mapping[timedelta, Sequence[str]],
        concurrency: int,
        batch_size: int,
        record: Callable[[AttemptReport], None],
        delete: bool = False,
        tracing: bool = False,
    ) -> None:
        self.calls, self.executor, self.worker, self.groups = (
            AsyncWorkerCalls(store),
            executor,
            worker,
            groups,
        )
        self.batch_size, self.record = batch_size, record
        self.delete = delete  # complete by deleting ownerless jobs (Worker's delete_succeeded)
        self.capacity = max(concurrency, batch_size)
        self.drained = False  # the latest claim came back with fewer jobs than it asked for
        self._calls: deque[tuple[asyncio.Task[list[Job]], int]] = deque()  # oldest first, and how many asked
        self._failing: set[asyncio.Task[None]] = set()  # failures being written
        self._quick = False  # the jobs of the latest completed batch each finished within QUICK of starting
        self._cursors = {lease: ClaimCursor() for lease in groups}  # one per lease group
        self.tracing = tracing
        self._contexts: dict[UUID, dict[str, str]] = {}  # trace contexts of claimed jobs, until they start

    @property
    def has_round_trips(self) -> bool:
        """Whether a round trip is in flight."""
        return bool(self._calls)

    @property
    def busy(self) -> bool:
        """Whether anything is left to write: successes to complete, or failures and losses to record."""
        executor = self.executor
        return bool(executor.done_count or executor.has_outcomes or self._failing)

    def start(self, jobs: Sequence[Job]) -> None:
        """Start the claimed ``jobs`` on the executor, in order, each in the trace its enqueuer began."""
        for job in jobs:
            self.executor.start(job, self._contexts.pop(job.id, None))

    @property
    def quick(self) -> bool:
        """Whether the jobs run quick: each of the latest completed batch finished within QUICK of being
        started, and none still running has been held longer."""
        oldest = self.executor.oldest_started
        return self._quick and (oldest is None or time.monotonic() - oldest < QUICK)

    # --- outcomes -----------------------------------------------------------------------------------
    def record_endings(self) -> None:
        """Record what ended since the last call: a loss at once, a failure by its own round trip (the
        successes wait in the executor for a batched completion)."""
        for outcome in self.executor.take_outcomes():
            if isinstance(outcome, Lost):
                r = outcome.run
                self.record(
                    AttemptReport(r.job.id, r.job.type, r.job.attempts, "lost", None, 0.0, queue_wait(r.job))
                )
            else:
                task = asyncio.get_running_loop().create_task(self._fail(outcome))
                self._failing.add(task)
                task.add_done_callback(self._failing.discard)

    async def _fail(self, failed: Failed) -> None:
        """Write ``failed`` (with its handler's max_attempts, which the store keeps on the job, and its
        traceback), and log it once, traceback included, as the store took it."""
        run, job = failed.run, failed.run.job
        seconds = time.monotonic() - run.started
        # the error on the first line, as a line-by-line reader greps for it; the traceback below it
        said = f"{failed.error}\n{failed.traceback}" if failed.traceback else failed.error
        try:
            result = await self.calls.fail(
                job.id,
                run.lease_token,
                failed.error,
                failed.retry_in,
                failed.permanent,
                max_attempts=run.handler.max_attempts,
                traceback=failed.traceback,
            )
        except JobkitError as store_error:
            job_log(
                logging.WARNING,
                job,
                "failed, and recording it failed too (%s): it runs again when its lease expires: %s",
                error_text(store_error),
                said,
            )
            outcome: Outcome = "lost"
        else:
            if not result.ok:
                job_log(logging.WARNING, job, "failed but its lease was lost: %s", said)
                outcome = "lost"
            else:
                outcome = "dead" if result.status == JobStatus.DEAD else "retrying"
                next_step = (
                    "dead" if outcome == "dead" else f"retrying in {failed.retry_in.total_seconds():.1f}s"
                )
                level = logging.ERROR if outcome == "dead" else logging.WARNING  # dead waits for a person
                job_log(level, job, "%s: %s", next_step, said)
        self.record(
            AttemptReport(job.id, job.type, job.attempts, outcome, failed.error, seconds, queue_wait(job))
        )
        self.executor.wake.set()  # a job's end frees room to claim

    async def wind_down(self) -> None:
        """Wait for the failures still being written."""
        await asyncio.gather(*self._failing, return_exceptions=True)

    # --- claims and completions ---------------------------------------------------------------------
    def complete_due(self) -> bool:
        """Complete in batches: when a batch is done, when nothing else runs, or after FLUSH_AFTER."""
        executor = self.executor
        oldest = executor.oldest_done
        if oldest is None:
            return False
        return (
            executor.done_count >= self.batch_size
            or not executor.running_count
            or time.monotonic() - oldest >= FLUSH_AFTER
        )

    def send(self, left: int | None = None) -> bool:
        """Send the next round trip if there is one (finished jobs to complete, or room to claim; at most
        ``left`` more jobs) and room for it in flight; whether one went."""
        ahead = self.quick and not self.drained
        if len(self._calls) > (AHEAD if ahead else 0):
            return False
        due = self.complete_due()
        executor = self.executor
        want = claim_size(
            held=executor.running_count + len(self._failing) + (0 if due else executor.done_count),
            asked=sum(n for _, n in self._calls),
            in_flight=len(self._calls),
            capacity=self.capacity,
            batch=self.batch_size,
            ahead=ahead,
            left=left,
        )
        if not due and not want:
            return False
        # the finished jobs are taken now: a second round trip sent before this one runs must not count them
        call = self.complete_and_claim(want, executor.take_done()) if due else self.claim(want)
        task = asyncio.get_running_loop().create_task(call)
        task.add_done_callback(lambda _: executor.wake.set())
        self._calls.append((task, want))
        return True

    def finished(self) -> Iterator[list[Job] | TransientError]:
        """The answers of the round trips back so far, in the order they were sent: the jobs claimed (to be
        started in that order), or the transient fault that failed it; any other error is raised."""
        while self._calls and self._calls[0][0].done():
            task, asked = self._calls.popleft()
            try:
                jobs = task.result()
            except TransientError as exc:
                yield exc
                continue
            if asked:  # a round trip that only completed says nothing about the queue
                self.drained = len(jobs) < asked
            yield jobs

    async def in_flight(self) -> list[Job]:
        """Wait for every round trip still in flight; the jobs they claimed (a failed one claimed none)."""
        jobs: list[Job] = []
        for answer in await asyncio.gather(*(task for task, _ in self._calls), return_exceptions=True):
            if isinstance(answer, list):
                jobs.extend(answer)
        self._calls.clear()
        return jobs

    async def claim(self, limit: int) -> list[Job]:
        """Up to ``limit`` jobs, one claim per lease group while there is room."""
        jobs: list[Job] = []
        for lease, types in self.groups.items():
            if len(jobs) >= limit:
                break
            jobs.extend(await self._claim(types, lease, limit - len(jobs)))
        return jobs

    async def _claim(self, types: Sequence[str], lease: timedelta, limit: int) -> list[Job]:
        cursor = self._cursors[lease]
        claimed = await self.calls.claim(types, self.worker, lease, limit, cursor.after())
        jobs = cursor.claimed(self._asked(limit), claimed)
        return await self._traced(jobs)

    def _asked(self, limit: int) -> int:
        """How many jobs a claim of ``limit`` asks the database for: the store clamps it to 999, and below
        its max-rows (a Supabase project whose Max Rows is lowered), so a full claim is not taken for short."""
        return min(limit, CLAIM_LIMIT_CAP, self.calls.store.dialect.max_rows - 1)

    async def _traced(self, jobs: list[Job]) -> list[Job]:
        """``jobs``, their trace contexts read first when tracing (one more round trip per claim). A read
        that fails is logged: the jobs run, each in a trace of its own."""
        if self.tracing and jobs:
            try:
                self._contexts.update(await self.calls.store.trace_contexts([j.id for j in jobs]))
            except JobkitError as exc:
                log.warning("trace contexts of %d claimed jobs not read (%s)", len(jobs), error_text(exc))
        return jobs

    async def complete_and_claim(self, want: int, done: list[Attempt]) -> list[Job]:
        """Complete ``done`` and claim ``want`` more: one round trip when all types share a lease."""
        if want and len(self.groups) == 1:
            [(lease, types)] = self.groups.items()
            return await self.complete(done, types, lease, want)
        await self.complete(done)
        return await self.claim(want) if want else []

    async def complete(
        self,
        done: list[Attempt] | None = None,
        types: Sequence[str] = (),
        lease: timedelta | None = None,
        limit: int = 0,
    ) -> list[Job]:
        """Complete every finished job (or ``done``, taken before) in one round trip, claiming ``limit``
        jobs of ``types`` on ``lease`` in the same one. A lost lease is logged, not raised; on a store error
        the jobs stay done, for the next call."""
        executor = self.executor
        if done is None:
            done = executor.take_done()
        adding = [r for r in done if r.added]  # each in a transaction of its own, with what it added
        if adding:
            done = [r for r in done if not r.added]
            for n, r in enumerate(adding):
                try:
                    await self._complete_adding(r)
                except BaseException:
                    executor.put_back(adding[n:] + done)
                    raise
        if not done:
            return await self._claim(types, lease, limit) if limit and lease else []
        self._quick = all(r.finished - r.started < QUICK for r in done)
        pairs = [(r.job.id, r.lease_token) for r in done]
        results = {r.job.id: r.result for r in done if r.result is not None}
        jobs: list[Job] = []
        try:
            if limit and lease is not None:
                cursor = self._cursors[lease]
                ok, jobs = await self.calls.complete_and_claim(
                    pairs, types, self.worker, lease, limit, results, delete=self.delete, after=cursor.after()
                )
                jobs = cursor.claimed(self._asked(limit), jobs)
            else:
                ok = await self.calls.complete_many(pairs, results, delete=self.delete)
        except BaseException:
            executor.put_back(done)
            raise
        now = time.monotonic()
        for r in done:
            job, seconds, succeeded = r.job, now - r.started, bool(ok.get(r.job.id))
            if succeeded:
                job_log(logging.INFO, job, "succeeded in %.3fs", seconds)
            else:
                job_log(logging.WARNING, job, "finished, but its lease was lost: not completed")
            outcome: Outcome = "succeeded" if succeeded else "lost"
            self.record(
                AttemptReport(job.id, job.type, job.attempts, outcome, None, seconds, queue_wait(job))
            )
        return await self._traced(jobs)

    async def _complete_adding(self, r: Attempt) -> None:
        """Complete ``r`` adding the jobs its handler added. Jobs the store refuses fail it for good,
        saying why; a store fault is raised (the caller keeps it done, for the next call)."""
        assert r.added is not None
        try:
            ok, added = await self.calls.complete_adding(
                r.job.id,
                r.lease_token,
                r.result,
                r.added,
                otel.carrier(r.span) if r.span is not None else None,
            )
        except TransientError:
            raise
        except JobkitError as refused:
            error = f"jobkit: the jobs its handler added were refused: {error_text(refused)}"
            await self._fail(Failed(r, error, timedelta(0), True))
            return
        seconds = time.monotonic() - r.started
        if ok:
            job_log(logging.INFO, r.job, "succeeded in %.3fs, adding %d jobs", seconds, len(added.jobs))
        else:
            job_log(logging.WARNING, r.job, "finished, but its lease was lost: not completed, nothing added")
        outcome: Outcome = "succeeded" if ok else "lost"
        self.record(
            AttemptReport(r.job.id, r.job.type, r.job.attempts, outcome, None, seconds, queue_wait(r.job))
        )

    # --- giving jobs back ---------------------------------------------------------------------------
    async def release(self, jobs: Sequence[Job]) -> None:
        """Give back ``jobs``, claimed but never started (their attempts not counted)."""
        for job in jobs:
            assert job.lease_token is not None
            await self._release(job, job.lease_token)

    async def give_back(self) -> None:
        """Release every running job unrun (its attempt not counted)."""
        for r in self.executor.abandon():
            await self._release(r.job, r.lease_token)
        await self.executor.wind_down()

    async def _release(self, job: Job, lease_token: UUID) -> None:
        try:
            await self.calls.release(job.id, lease_token)
            job_log(logging.WARNING, job, "given back")
        except JobkitError as exc:
            job_log(
                logging.WARNING, job, "could not be given back (%s); its lease will expire", error_text(exc)
            )
