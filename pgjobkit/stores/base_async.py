"""The seam every store implements, async and blocking: the blocking module is generated from the async
one by tools/async_to_sync.py.

A store supplies only a transport: ``_execute`` runs one ``pgjobkit.ops.Call`` (psycopg's sync or async pool,
supabase-py's sync or async client, the memory store's in-process functions) and ``dialect`` says how its rows
read. Every operation (its calls, arguments, paging and row parsing) is ``pgjobkit.ops``'s, the same for both
kinds; the methods below only hand it to the transport.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence  # ASYNC

# SYNC: from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol, Self, TypeVar

# SYNC: from typing import TYPE_CHECKING
from uuid import UUID

from pgjobkit.core.failures import JobTraceback
from pgjobkit.core.limits import Limit
from pgjobkit.core.models import (
    Cancelled,
    Enqueued,
    Job,
    JobStatus,
    NewJob,
    Stats,
)
from pgjobkit.core.pipelines import (
    DependencyResult,
    Pipeline,
    PipelineEnqueued,
    PipelineJob,
    PipelineProgress,
)
from pgjobkit.core.schedules import Schedule
from pgjobkit.core.workers import ActivityRow, QueueDepth, WorkerInfo
from pgjobkit.errors import JobkitError
from pgjobkit.exporters import otel
from pgjobkit.ops import Call, Dialect, Op
from pgjobkit.ops import admin as admin_ops
from pgjobkit.ops import jobs as job_ops
from pgjobkit.ops import limits as limit_ops
from pgjobkit.ops import pipelines as pipeline_ops
from pgjobkit.ops import schedules as schedule_ops
from pgjobkit.ops import workers as worker_ops
from pgjobkit.ops.admin import DEFAULT_PRUNE_STATUSES

# SYNC: if TYPE_CHECKING:
# SYNC:     from pgjobkit.stores.base_async import AsyncJobStore

T = TypeVar("T")


# SYNC: def drive(op: Op[T], execute: Callable[[Call], Any]) -> T:
async def adrive(op: Op[T], execute: Callable[[Call], Awaitable[Any]]) -> T:  # ASYNC
    """Run ``op`` to its result through ``execute`` (a JobkitError it raises is raised inside ``op``)."""
    try:
        call = next(op)
        while True:
            try:
                answer = await execute(call)
            except JobkitError as exc:
                call = op.throw(exc)
            else:
                call = op.send(answer)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


class AsyncSubscription(Protocol):
    """A wake-up subscription; ``await close()`` ends it."""

    async def close(self) -> None: ...


class AsyncNoWakeups:
    """The subscription of a store that sends no wake-ups here: the worker polls."""

    async def close(self) -> None:
        return None


class AsyncJobStore(ABC):
    """Persistence for jobs: what an app does with its queue (enqueue, read, cancel, requeue, prune, limits,
    schedules). Every state change is fenced or guarded as the SQL functions are. A worker's own calls
    (claim, complete, fail, heartbeat...) are ``pgjobkit.worker.calls``'s, on the same ``run``."""

    dialect: Dialect

    @abstractmethod
    async def _execute(self, call: Call, conn: Any = None) -> Any:
        """Run one call: its rows, or its value for a scalar function (``conn``: the caller's own)."""

    async def run(self, op: Op[T], conn: Any = None) -> T:
        """Run one operation of ``pgjobkit.ops`` on this store (``conn``: a connection of the caller's, where
        the store takes one): the seam every method here, and the worker's own calls, go through."""
        return await adrive(op, lambda call: self._execute(call, conn))

    # SYNC: @abstractmethod
    # SYNC: def as_async(self) -> AsyncJobStore:
    # SYNC:     """An async store on the same backend (same database, project or memory), for the worker's loop."""
    # SYNC:
    @abstractmethod
    async def listen(self, wake: Callable[[], None]) -> AsyncSubscription:
        """Call ``wake`` when jobs may have become runnable (from any thread, or on this store's loop for an
        async store); polling is the fallback."""

    async def open(self, wait: bool = True) -> None:  # noqa: B027 (a store with nothing to open needs nothing)
        """Open connections now (``wait``: until one is ready) rather than on first use."""

    async def close(self) -> None:  # noqa: B027
        """Release connections."""

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def enqueue(self, job: NewJob) -> Enqueued:
        """Insert ``job``, or find the live job holding its idempotency key (``inserted=False``): its id and
        status (the whole job: ``get(id)``)."""
        with otel.sending([job]) as traced:
            return await self.run(job_ops.enqueue(self.dialect, traced[0]))

    async def enqueue_many(self, jobs: Sequence[NewJob]) -> list[Enqueued]:
        """``enqueue`` for up to 10,000 jobs in one call, results in input order; all or nothing."""
        with otel.sending(jobs) as traced:
            return await self.run(job_ops.enqueue_many(self.dialect, traced))

    async def enqueue_pipeline(self, pipeline: Pipeline) -> PipelineEnqueued:
        """Enqueue ``pipeline``'s jobs, all or nothing: a job that waits for others is waiting until they
        have ended. Its id and its jobs' ids, in the order they were added."""
        with otel.send_span({job.type for _, job, _ in pipeline.jobs}, len(pipeline.jobs)) as trace_context:
            return await self.run(pipeline_ops.enqueue_pipeline(self.dialect, pipeline, trace_context))

    async def cancel_pipeline(self, pipeline_id: UUID, reason: str | None = None) -> int:
        """Cancel every job of the pipeline that has not finished (running ones stop at their worker's next
        heartbeat); how many."""
        return await self.run(pipeline_ops.cancel_pipeline(self.dialect, pipeline_id, reason))

    async def get_pipeline(self, pipeline_id: UUID) -> list[PipelineJob]:
        """The pipeline's jobs in the order they were added, each with what it waits for (empty: none)."""
        return await self.run(pipeline_ops.get_pipeline(self.dialect, pipeline_id))

    async def pipeline_progress(self, pipeline_id: UUID) -> PipelineProgress | None:
        """The pipeline's jobs by status, and the types running now; None when there is no such pipeline."""
        return await self.run(pipeline_ops.pipeline_progress(self.dialect, pipeline_id))

    async def pipeline_of(self, job_id: UUID) -> UUID | None:
        """The pipeline the job belongs to; None when it is in none (or there is no such job)."""
        return await self.run(pipeline_ops.pipeline_of(self.dialect, job_id))

    async def list_dependencies(self, job_id: UUID) -> list[DependencyResult]:
        """What the job waits for, in its order, with how each ended and its result."""
        return await self.run(pipeline_ops.list_dependencies(self.dialect, job_id))

    async def cancel(self, ids: Sequence[UUID], reason: str | None = None) -> list[Cancelled]:
        """Cancel waiting, queued, retrying and running jobs (a running one's worker stops it at its next
        heartbeat); finished ones are left as they are. One result per id. The jobs that wait for one
        cancelled are cancelled too, unless they run anyway (``After(..., on_failure="run")``)."""
        return await self.run(admin_ops.cancel(self.dialect, ids, reason))

    async def requeue(self, ids: Sequence[UUID] | None = None, type: str | None = None) -> list[Job]:
        """Dead jobs back to queued (all dead ones when ``ids`` is None); unknown ids raise JobNotFound."""
        return await self.run(admin_ops.requeue(self.dialect, ids, type))

    async def prune(
        self,
        older_than: timedelta,
        statuses: Sequence[JobStatus] = DEFAULT_PRUNE_STATUSES,
        limit: int = 10_000,
    ) -> int:
        """Delete up to ``limit`` finished jobs last updated more than ``older_than`` ago; the count."""
        return await self.run(admin_ops.prune(self.dialect, older_than, statuses, limit))

    async def stats(self) -> Stats:
        """Counts by type and status, and the oldest runnable job's age."""
        return await self.run(admin_ops.stats(self.dialect))

    async def schema_version(self) -> str | None:
        """The database's jobkit schema version (None: older than 0.2.0, or no jobkit schema)."""
        return await self.run(admin_ops.schema_version(self.dialect))

    async def get(self, job_id: UUID) -> Job | None:
        """The job, or None."""
        return await self.run(admin_ops.get(self.dialect, job_id))

    async def traceback(self, job_id: UUID) -> JobTraceback | None:
        """The traceback the job's latest failed attempt left (with which attempt, and when), or None: an
        operator's read (the job's owner reads its one-line ``error``)."""
        return await self.run(job_ops.traceback(self.dialect, job_id))

    async def list_jobs(
        self,
        *,
        status: JobStatus | None = None,
        type: str | None = None,
        user_id: UUID | None = None,
        before: tuple[datetime, UUID] | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """Newest first; ``before`` is the (created_at, id) of the last job of the previous page."""
        return await self.run(
            admin_ops.list_jobs(
                self.dialect, status=status, type=type, user_id=user_id, before=before, limit=limit
            )
        )

    # --- flow control -----------------------------------------------------------------------------------
    async def set_limit(
        self,
        type: str,
        *,
        max_running: int | None = None,
        max_starts: int | None = None,
        per: timedelta | None = None,
        max_running_per_key: int | None = None,
    ) -> Limit:
        """Set every limit on ``type`` at once (a None removes that kind); the next claim obeys it."""
        return await self.run(
            limit_ops.set_limit(
                self.dialect,
                type,
                max_running=max_running,
                max_starts=max_starts,
                per=per,
                max_running_per_key=max_running_per_key,
            )
        )

    async def delete_limit(self, type: str) -> bool:
        """Remove ``type``'s limits; False when it had none."""
        return await self.run(limit_ops.delete_limit(self.dialect, type))

    async def list_limits(self) -> list[Limit]:
        """Every type's limits, with its running jobs and starts in the current window."""
        return await self.run(limit_ops.list_limits(self.dialect))

    async def set_schedule(self, schedule: Schedule) -> Schedule:
        """Create or replace the schedule named ``schedule.name``; as stored (with ``last_due_at``)."""
        return await self.run(schedule_ops.set_schedule(self.dialect, schedule))

    async def delete_schedule(self, name: str) -> bool:
        """Remove a schedule (its jobs stay); False when there was none."""
        return await self.run(schedule_ops.delete_schedule(self.dialect, name))

    async def list_schedules(self) -> list[Schedule]:
        """Every schedule, by name."""
        return (await self.run(schedule_ops.list_schedules(self.dialect)))[0]

    # --- seeing the queue and its workers -----------------------------------------------------------------
    async def queue_depth(self) -> list[QueueDepth]:
        """Unfinished jobs by type and status, with the oldest's age: cheap whatever the table holds."""
        return await self.run(worker_ops.queue_depth(self.dialect))

    async def list_workers(self) -> list[WorkerInfo]:
        """The workers that beat (oldest first), whether each is alive, and how many jobs each holds."""
        return await self.run(worker_ops.list_workers(self.dialect))

    async def activity(self, since: datetime) -> list[ActivityRow]:
        """What the workers did by the minute since ``since`` (at most the last day): attempts ended per
        type and outcome, with their run times and queue waits."""
        return await self.run(worker_ops.activity(self.dialect, since))

    async def worker_beat(
        self,
        worker: str,
        *,
        host: str | None = None,
        pid: int | None = None,
        version: str | None = None,
        types: Sequence[str] = (),
        concurrency: int | None = None,
        stale_seconds: float = 60.0,
        activity: list[dict[str, Any]] | None = None,
    ) -> int:
        """``worker`` is alive (the Worker beats for itself), with its ``activity`` since its last beat
        (``pgjobkit.core.workers.Activity.take()``); deletes workers silent past their stale_after, and
        answers how many."""
        return await self.run(
            worker_ops.worker_beat(
                self.dialect,
                worker,
                host=host,
                pid=pid,
                version=version,
                types=types,
                concurrency=concurrency,
                stale_seconds=stale_seconds,
                activity=activity or [],
            )
        )

    async def trace_contexts(self, ids: Sequence[UUID]) -> dict[UUID, dict[str, str]]:
        """The trace context each of ``ids`` was enqueued with, for those enqueued inside a trace."""
        return await self.run(worker_ops.trace_contexts(self.dialect, ids))

    async def worker_stop(self, worker: str) -> bool:
        """``worker`` has stopped: its row goes. False when it had none."""
        return await self.run(worker_ops.worker_stop(self.dialect, worker))
