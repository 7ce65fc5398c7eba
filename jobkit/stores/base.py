# WARNING: this file is generated from jobkit/stores/base_async.py by tools/async_to_sync.py: DO NOT CHANGE.
# Change jobkit/stores/base_async.py and run `python tools/async_to_sync.py`.
"""The seam every store implements, async and blocking: the blocking module is generated from the async
one by tools/async_to_sync.py.

A store supplies only a transport: ``_execute`` runs one ``jobkit.ops.Call`` (psycopg's sync or async pool,
supabase-py's sync or async client, the memory store's in-process functions) and ``codec`` says how its rows
read. Every operation (its calls, arguments, paging and row parsing) is ``jobkit.ops``'s, the same for both
kinds; the methods below only hand it to the transport.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, Self, TypeVar
from uuid import UUID

from jobkit.core.limits import Limit
from jobkit.core.models import (
    Beat,
    Cancelled,
    Enqueued,
    EnqueuedId,
    FailResult,
    Job,
    JobStatus,
    NewJob,
    Reclaimed,
    Stats,
)
from jobkit.core.schedules import Fired, Schedule
from jobkit.ops import Call, Codec, Op, drive
from jobkit.ops import admin as admin_ops
from jobkit.ops import jobs as job_ops
from jobkit.ops import limits as limit_ops
from jobkit.ops import schedules as schedule_ops
from jobkit.ops.admin import DEFAULT_PRUNE_STATUSES

if TYPE_CHECKING:
    from jobkit.stores.base_async import AsyncJobStore

T = TypeVar("T")


class Subscription(Protocol):
    """A wake-up subscription; ``close()`` ends it."""

    def close(self) -> None: ...


class JobStore(ABC):
    """Persistence for jobs. Every state change is fenced or guarded as the SQL functions are."""

    codec: Codec

    @abstractmethod
    def _execute(self, call: Call, conn: Any = None) -> Any:
        """Run one call: its rows, or its value for a scalar function (``conn``: the caller's own)."""

    def _run(self, op: Op[T], conn: Any = None) -> T:
        return drive(op, lambda call: self._execute(call, conn))

    @abstractmethod
    def as_async(self) -> AsyncJobStore:
        """An async store on the same backend (same database, project or memory), for the worker's loop."""

    @abstractmethod
    def listen(self, wake: Callable[[], None]) -> Subscription:
        """Call ``wake`` when jobs may have become runnable (from any thread, or on this store's loop for an
        async store); polling is the fallback."""

    def open(self, wait: bool = True) -> None:  # noqa: B027 (a store with nothing to open needs nothing)
        """Open connections now (``wait``: until one is ready) rather than on first use."""

    def close(self) -> None:  # noqa: B027
        """Release connections."""

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def enqueue(self, job: NewJob) -> Enqueued:
        """Insert ``job``, or return the live job holding its idempotency key (``inserted=False``)."""
        return self._run(job_ops.enqueue(self.codec, job))

    def enqueue_many(self, jobs: Sequence[NewJob]) -> list[Enqueued]:
        """``enqueue`` for up to 10,000 jobs in one call, results in input order; all or nothing."""
        return self._run(job_ops.enqueue_many(self.codec, jobs))

    def enqueue_ids(self, jobs: Sequence[NewJob]) -> list[EnqueuedId]:
        """``enqueue_many`` answering only each job's id and inserted flag: the fast path for bulk loads."""
        return self._run(job_ops.enqueue_ids(self.codec, jobs))

    def claim(self, types: Sequence[str], worker: str, lease: timedelta, limit: int = 1) -> list[Job]:
        """Lease up to ``limit`` (clamped to 999) runnable ``types`` jobs; reclaims expired leases first."""
        return self._run(job_ops.claim(self.codec, types, worker, lease, limit))

    def complete(self, job_id: UUID, lease_token: UUID, result: Any = None) -> bool:
        """Mark succeeded, keeping ``result`` (JSON, see ``models.check_result``); False when the lease was
        lost (nothing changed)."""
        return self._run(job_ops.complete(self.codec, job_id, lease_token, result))

    def complete_many(
        self,
        done: Sequence[tuple[UUID, UUID]],
        results: Mapping[UUID, Any] | None = None,
        *,
        delete: bool = False,
    ) -> Mapping[UUID, bool]:
        """``complete`` for many (job_id, lease_token) pairs, in as few calls as fit. ``delete``: jobs without
        a ``user_id`` are deleted rather than kept as succeeded (their results and idempotency keys go with
        them); a user's jobs are kept."""
        return self._run(job_ops.complete_many(self.codec, done, results, delete))

    def complete_and_claim(
        self,
        done: Sequence[tuple[UUID, UUID]],
        types: Sequence[str],
        worker: str,
        lease: timedelta,
        limit: int,
        results: Mapping[UUID, Any] | None = None,
        *,
        delete: bool = False,
    ) -> tuple[Mapping[UUID, bool], list[Job]]:
        """``complete_many(done)`` then ``claim(...)``: one round trip and one commit where they fit."""
        return self._run(
            job_ops.complete_and_claim(self.codec, done, types, worker, lease, limit, results, delete)
        )

    def progress(self, reports: Sequence[tuple[UUID, UUID, float, str | None]]) -> Mapping[UUID, bool]:
        """Record running jobs' progress, (job_id, lease_token, fraction 0 to 1, message); fenced."""
        return self._run(job_ops.progress(self.codec, reports))

    def fail(
        self, job_id: UUID, lease_token: UUID, error: str, retry_delay: timedelta, permanent: bool = False
    ) -> FailResult:
        """Retrying after ``retry_delay``, or dead (attempts used up, or permanent)."""
        return self._run(job_ops.fail(self.codec, job_id, lease_token, error, retry_delay, permanent))

    def extend_lease(self, job_id: UUID, lease_token: UUID, lease: timedelta) -> datetime | None:
        """Heartbeat: the new lease end, or None when the lease was lost."""
        return self._run(job_ops.extend_lease(self.codec, job_id, lease_token, lease))

    def heartbeat(self, held: Sequence[tuple[UUID, UUID]], lease: timedelta) -> Mapping[UUID, Beat]:
        """For each (job_id, lease_token) held: still held (lease extended to ``lease`` once a third of it
        has passed), or lost, with the job's status (cancelled, reclaimed, ...)."""
        return self._run(job_ops.heartbeat(self.codec, held, lease))

    def cancel(self, ids: Sequence[UUID], reason: str | None = None) -> list[Cancelled]:
        """Cancel queued, retrying and running jobs (a running one's worker stops it at its next
        heartbeat); finished ones are left as they are. One result per id."""
        return self._run(admin_ops.cancel(self.codec, ids, reason))

    def release(self, job_id: UUID, lease_token: UUID) -> bool:
        """Give a claimed job back unrun (the attempt is not counted); False when the lease was lost."""
        return self._run(job_ops.release(self.codec, job_id, lease_token))

    def reclaim_expired(self, limit: int = 1000) -> list[Reclaimed]:
        """Running jobs whose lease expired -> retrying, or dead when attempts are used up."""
        return self._run(admin_ops.reclaim_expired(self.codec, limit))

    def requeue(self, ids: Sequence[UUID] | None = None, type: str | None = None) -> list[Job]:
        """Dead jobs back to queued (all dead ones when ``ids`` is None); unknown ids raise JobNotFound."""
        return self._run(admin_ops.requeue(self.codec, ids, type))

    def prune(
        self,
        older_than: timedelta,
        statuses: Sequence[JobStatus] = DEFAULT_PRUNE_STATUSES,
        limit: int = 10_000,
    ) -> int:
        """Delete up to ``limit`` finished jobs last updated more than ``older_than`` ago; the count."""
        return self._run(admin_ops.prune(self.codec, older_than, statuses, limit))

    def stats(self) -> Stats:
        """Counts by type and status, and the oldest runnable job's age."""
        return self._run(admin_ops.stats(self.codec))

    def get(self, job_id: UUID) -> Job | None:
        """The job, or None."""
        return self._run(admin_ops.get(self.codec, job_id))

    def list(
        self,
        *,
        status: JobStatus | None = None,
        type: str | None = None,
        user_id: UUID | None = None,
        before: tuple[datetime, UUID] | None = None,
        limit: int = 50,
    ) -> list[Job]:
        """Newest first; ``before`` is the (created_at, id) of the last job of the previous page."""
        return self._run(
            admin_ops.list_jobs(
                self.codec, status=status, type=type, user_id=user_id, before=before, limit=limit
            )
        )

    # --- flow control -----------------------------------------------------------------------------------
    def set_limit(
        self,
        type: str,
        *,
        max_running: int | None = None,
        max_starts: int | None = None,
        per: timedelta | None = None,
        max_running_per_key: int | None = None,
    ) -> Limit:
        """Set every limit on ``type`` at once (a None removes that kind); the next claim obeys it."""
        return self._run(
            limit_ops.limit_set(
                self.codec,
                type,
                max_running=max_running,
                max_starts=max_starts,
                per=per,
                max_running_per_key=max_running_per_key,
            )
        )

    def delete_limit(self, type: str) -> bool:
        """Remove ``type``'s limits; False when it had none."""
        return self._run(limit_ops.limit_delete(self.codec, type))

    def limits(self) -> builtins.list[Limit]:
        """Every type's limits, with its running jobs and starts in the current window."""
        return self._run(limit_ops.limits(self.codec))

    def set_schedule(self, schedule: Schedule) -> Schedule:
        """Create or replace the schedule named ``schedule.name``; as stored (with ``last_due_at``)."""
        return self._run(schedule_ops.schedule_set(self.codec, schedule))

    def delete_schedule(self, name: str) -> bool:
        """Remove a schedule (its jobs stay); False when there was none."""
        return self._run(schedule_ops.schedule_delete(self.codec, name))

    def schedules(self) -> builtins.list[Schedule]:
        """Every schedule, by name."""
        return (self._run(schedule_ops.schedules(self.codec)))[0]

    def fire_schedule(self, name: str, last_due_at: datetime, due: Sequence[datetime]) -> Fired:
        """Enqueue ``name``'s jobs for ``due`` if its last due time is still ``last_due_at`` (see Scheduler)."""
        return self._run(schedule_ops.schedule_fire(self.codec, name, last_due_at, due))
