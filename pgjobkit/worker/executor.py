"""Runs claimed jobs: each as a task on the worker's loop (a sync handler in the thread pool, off it), at
most ``concurrency`` at once (``pgjobkit.worker.slots``), and turns how each ended into an outcome value for
the exchange to persist: successes wait for a batched completion (``take_done``); ``Failed`` (with the
retry delay, whether it is permanent, and its traceback) and ``Lost`` for ``take_outcomes``. It never calls
the store, and its lists are its own: the exchange and the leases go through the methods below."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor as ThreadPool
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from pgjobkit.core import transitions
from pgjobkit.core.models import Job, JobStatus, check_result
from pgjobkit.core.pipelines import DependencyResult
from pgjobkit.errors import Permanent, Retry
from pgjobkit.exporters import otel
from pgjobkit.worker.context import Attempt, running_as
from pgjobkit.worker.registry import Registry
from pgjobkit.worker.results import error_text, format_traceback, queue_wait
from pgjobkit.worker.slots import Slots, SyncLane

log = logging.getLogger("pgjobkit.worker")


def job_log(level: int, job: Job, message: str, *args: Any) -> None:
    """A log line about one job: always its id, type and attempt, in the text and as ``extra``."""
    if log.isEnabledFor(level):
        extra = {"job_id": str(job.id), "job_type": job.type, "attempt": job.attempts}
        log.log(
            level, "job %s type=%s attempt=%d " + message, job.id, job.type, job.attempts, *args, extra=extra
        )


@dataclass(frozen=True)
class Backoff:
    """The retry delay after a failure: ``base``·2^(attempt-1) seconds, capped, scaled by ±``jitter``."""

    base: float
    cap: float
    jitter: float
    random: Callable[[], float]

    def delay(self, attempt: int) -> timedelta:
        return transitions.backoff(
            attempt, base=self.base, cap=self.cap, jitter=self.jitter, random=self.random
        )


@dataclass(frozen=True)
class Failed:
    """The handler raised: the error text to keep (the one line a job's owner reads), when to retry,
    whether no retry may follow whatever attempts are left (Permanent), and the traceback (the operator's;
    None for a Retry, and when there is none to keep)."""

    run: Attempt
    error: str
    retry_in: timedelta
    permanent: bool
    traceback: str | None = None

    @property
    def dead(self) -> bool:
        """Whether the store ends the job dead, as jobkit_fail decides: permanent, or its attempts (its
        handler's max_attempts, or its own) used up."""
        job = self.run.job
        return self.permanent or job.attempts >= self.run.handler.attempts_for(job)


@dataclass(frozen=True)
class Lost:
    """The job stopped being this worker's while it ran (cancelled, or its lease lost): nothing to write."""

    run: Attempt


RunOutcome = Failed | Lost  # a success is its Attempt, kept with its result until it is taken


def _outcome(outcome: RunOutcome | Attempt | None) -> str:
    """How an attempt ended, for its span: as the worker saw it when its handler returned."""
    if isinstance(outcome, Attempt):
        return "succeeded"
    if isinstance(outcome, Failed):
        return "dead" if outcome.dead else "retrying"
    return "lost" if isinstance(outcome, Lost) else "released"


def _storable(value: Any) -> Any:
    """A handler's return value, checked to be storable as the job's result: a result that cannot be
    stored is a bug no retry fixes, so the job fails permanently, saying why."""
    try:
        return check_result(value)
    except ValueError as exc:
        raise Permanent(str(exc)) from None


class JobExecutor:
    """The jobs of one run in this worker, run by their ``handlers``: running (in order of starting), each
    ending done (succeeded, not yet completed) or as an outcome (a failure or a loss). ``wake`` is set when
    the run loop has something to do: a failure or a loss to record, a batch of successes to complete, or a
    slot freed."""

    def __init__(
        self,
        *,
        handlers: Registry,
        concurrency: int,
        batch_size: int,
        backoff: Backoff,
        threads: ThreadPool,
        wake: asyncio.Event,
        dependencies: Callable[[uuid.UUID], Awaitable[list[DependencyResult]]],
        tracing: bool = False,
    ) -> None:
        self.handlers, self.batch_size, self.backoff, self.wake = handlers, batch_size, backoff, wake
        self.tracing = tracing  # run each attempt in an OpenTelemetry span (pgjobkit.exporters.otel)
        self.dependencies = dependencies  # what a job waits for, read when its handler asks
        self._running: dict[uuid.UUID, Attempt] = {}
        self._done: list[Attempt] = []
        self._outcomes: deque[RunOutcome] = deque()
        # jobs beyond concurrency wait for a slot (their leases extended): async ones in the slots' line,
        # sync ones in the lane
        self._slots = Slots(concurrency, self._spawn)
        self._lane = SyncLane(self._slots, concurrency, threads, self._ran, self._keep)
        self._tasks: set[asyncio.Task[None]] = set()  # the lane's runners, referenced until done

    # --- what it holds ------------------------------------------------------------------------------
    def running_jobs(self) -> list[Attempt]:
        """The jobs running (or waiting for a slot), in order of starting."""
        return list(self._running.values())

    @property
    def running_count(self) -> int:
        return len(self._running)

    @property
    def oldest_started(self) -> float | None:
        """When the longest-running job still here started (monotonic), or None."""
        oldest = next(iter(self._running.values()), None)  # dicts keep order: the first started
        return oldest.started if oldest is not None else None

    @property
    def done_count(self) -> int:
        """How many jobs succeeded and wait to be completed."""
        return len(self._done)

    @property
    def oldest_done(self) -> float | None:
        """When the job waiting longest to be completed finished (monotonic), or None."""
        return self._done[0].finished if self._done else None

    @property
    def has_outcomes(self) -> bool:
        """Whether failures or losses wait to be taken."""
        return bool(self._outcomes)

    def take_done(self) -> list[Attempt]:
        """The jobs that succeeded since the last call, to be completed."""
        done, self._done = self._done, []
        return done

    def put_back(self, done: Sequence[Attempt]) -> None:
        """Taken jobs whose completion failed, back in front of the line: their leases still guard them,
        and the next completion (or the final one) takes them again."""
        self._done[:0] = done

    def take_outcomes(self) -> list[RunOutcome]:
        """Every failure and loss since the last call, oldest first."""
        taken = list(self._outcomes)
        self._outcomes.clear()
        return taken

    # --- running jobs -------------------------------------------------------------------------------
    def start(self, job: Job, trace_context: dict[str, str] | None = None) -> Attempt:
        """Run ``job`` with its type's handler (in the trace ``trace_context`` continues, when tracing)."""
        handler = self.handlers[job.type]
        run = Attempt(job, handler, started=time.monotonic())
        run.loop, run.dependencies = asyncio.get_running_loop(), partial(self.dependencies, job.id)
        if self.tracing:
            try:
                run.span = otel.start_run(job, trace_context, queue_wait(job))
            except Exception as exc:  # a trace is never worth a job (the context is a client's to write)
                job_log(logging.WARNING, job, "runs without a span: %s", error_text(exc))
        self._running[job.id] = run
        if handler.is_async:
            self._lane.yield_slots()  # the slots a lingering runner holds are this job's to take
            self._slots.run(run)
        else:
            self._lane.add(run)
        return run

    def _spawn(self, run: Attempt, awaitable: Awaitable[Any] | None) -> None:
        """Start ``run``'s task in the slot it holds."""
        run.slot = True
        run.task = task = asyncio.get_running_loop().create_task(self._execute(run, awaitable))
        task.add_done_callback(lambda _: self._on_task_done(run))

    def _free_slot(self, run: Attempt) -> None:
        """``run`` is done with its slot (if it still holds one)."""
        if run.slot:
            run.slot = False
            self._slots.give()

    def _on_task_done(self, run: Attempt) -> None:
        """A task's end: its slot and its job are let go even if it was cancelled before it began."""
        self._free_slot(run)
        if run.job.id in self._running:
            self._finish(Lost(run) if run.lost else None, run)

    async def _execute(self, run: Attempt, awaitable: Awaitable[Any] | None = None) -> None:
        """Await the handler in the slot ``run`` holds, and end the job with what came of it."""
        try:
            try:
                with running_as(run):
                    value = await (run.handler.invoke(run.job) if awaitable is None else awaitable)
            finally:
                self._free_slot(run)
            run.result = _storable(value)
        except asyncio.CancelledError:
            if run.lost:  # cancelled, or reclaimed: the job is no longer this worker's
                self._finish(Lost(run), run)
            elif not run.abandoned:
                raise
        except Exception as exc:  # every handler failure ends its job, none escapes
            self._finish(None if run.abandoned else self._failed(run, exc), run)
        else:
            self._finish(None if run.abandoned else run, run)

    def _failed(self, run: Attempt, exc: BaseException) -> Failed:
        """The outcome of a failure: its error text, its retry delay (a handler's own, held within what the
        store takes, or the backoff's), whether it is permanent, and its traceback (formatted here, so that
        the exception, and every frame it holds, goes now)."""
        job = run.job
        if isinstance(exc, Retry) and exc.after is not None:
            delay = min(max(exc.after, timedelta(0)), transitions.MAX_RETRY_DELAY)
        else:
            delay = self.backoff.delay(job.attempts)
        if run.span is not None:
            otel.failed(run.span, exc)
        # a Retry is the handler's own decision, often a rate limit's: its one line says it all, and no
        # traceback is written (nor logged) for each of a storm of them
        traceback = None if isinstance(exc, Retry) else format_traceback(exc)
        return Failed(run, error_text(exc), delay, isinstance(exc, Permanent), traceback)

    def _finish(self, outcome: RunOutcome | Attempt | None, run: Attempt) -> None:
        """``run`` leaves the running jobs: succeeded (``outcome`` is the run itself), with a failure or a
        loss, or given back (None: nothing to record). The loop is woken only when it has work: a batch to
        complete, a failure or loss to record, or a slot freed by the last running job (it also wakes on
        its own while completions wait)."""
        if self._running.pop(run.job.id, None) is None:
            return
        if run.span is not None:
            otel.end_run(run.span, _outcome(outcome))
        if isinstance(outcome, Attempt):
            run.finished = time.monotonic()
            self._done.append(run)
            if len(self._done) < self.batch_size and self._running:
                return
        elif outcome is not None:
            self._outcomes.append(outcome)
        self.wake.set()

    def _keep(self, task: asyncio.Task[None]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _ran(self, run: Attempt, result: Any, error: BaseException | None) -> None:
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
        self._finish(run if error is None else self._failed(run, error), run)

    def lose(self, run: Attempt, status: JobStatus | None) -> None:
        """``run``'s job is no longer this worker's (now ``status``): stop its handler, if it still runs. An
        async one is cancelled; a sync one sees ``current().cancelled``, or never starts; whatever it does
        later is fenced off."""
        if self._running.get(run.job.id) is not run:
            return  # it ended meanwhile
        run.lost = True
        run.stopped = True
        why = "was cancelled" if status == JobStatus.CANCELLED else f"lost its lease (now {status or 'gone'})"
        job_log(logging.WARNING, run.job, "%s: stopping its handler", why)
        if run.task is not None:
            run.task.cancel()
            return
        if self._slots.leave(run) or self._lane.remove(run):  # still waiting: it never runs
            self._finish(Lost(run), run)

    def abandon(self) -> list[Attempt]:
        """Stop every running job unrun, for giving back: an async handler's task is cancelled; a sync
        one's thread runs on, its result dropped. The jobs, to release."""
        given = list(self._running.values())
        for r in given:  # first, so that no slot let go below starts one of them
            r.abandoned = True
        self._lane.clear()
        self._slots.clear()
        for r in given:
            if r.task is not None:
                r.task.cancel()
            if self._running.pop(r.job.id, None) is not None and r.span is not None:
                otel.end_run(r.span, "released")
        for task in list(self._tasks):  # runners waiting on threads that cannot be stopped: let them go
            task.cancel()
        return given

    async def wind_down(self) -> None:
        """Wait for the runners still in flight (a runner whose thread has returned needs a turn of the
        loop to finish), so none is left pending when the loop closes."""
        self._lane.stop_lingering()
        await asyncio.gather(*self._tasks, return_exceptions=True)
