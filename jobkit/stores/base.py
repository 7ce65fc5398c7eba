"""The JobStore Protocol: the one seam every adapter (memory, Postgres, Supabase) implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol
from uuid import UUID

from jobkit.models import Enqueued, FailResult, Job, JobStatus, NewJob, Reclaimed, Stats

DEFAULT_PRUNE_STATUSES: tuple[JobStatus, ...] = (JobStatus.SUCCEEDED, JobStatus.DEAD)


def _uuid(value: UUID | str) -> UUID:
    """A row's id: psycopg gives a UUID, PostgREST's JSON a string."""
    return value if isinstance(value, UUID) else UUID(value)


class ClaimsThroughSql(ABC):
    """``claim`` and ``complete_and_claim`` for the stores that call the ``jobkit_claim`` SQL function
    (Postgres, Supabase): they supply only how to call it and how to read a row."""

    @abstractmethod
    def _claim_rows(
        self,
        types: Sequence[str],
        worker: str,
        lease: timedelta,
        limit: int,
        done: Sequence[tuple[UUID, UUID]] = (),
    ) -> list[dict[str, Any]]:
        """Call jobkit_claim (with ``done`` as p_done_ids / p_done_tokens when given); its rows."""

    @staticmethod
    @abstractmethod
    def _job(row: Mapping[str, Any]) -> Job:
        """A Job from one of the store's rows."""

    @abstractmethod
    def complete_many(self, done: Sequence[tuple[UUID, UUID]]) -> Mapping[UUID, bool]:
        """See JobStore."""

    def claim(self, types: Sequence[str], worker: str, lease: timedelta, limit: int = 1) -> list[Job]:
        return [self._job(r) for r in self._claim_rows(types, worker, lease, limit)]

    def complete_and_claim(
        self,
        done: Sequence[tuple[UUID, UUID]],
        types: Sequence[str],
        worker: str,
        lease: timedelta,
        limit: int,
    ) -> tuple[Mapping[UUID, bool], list[Job]]:
        if limit < 1 or not done:
            return self.complete_many(done), self.claim(types, worker, lease, limit) if limit > 0 else []
        # Given done ids, jobkit_claim returns the jobs it completed as succeeded rows and the ones it claimed
        # as running rows; a done id not among them lost its lease.
        rows = self._claim_rows(types, worker, lease, limit, done)
        completed = {_uuid(r["id"]) for r in rows if r["status"] == JobStatus.SUCCEEDED}
        claimed = [self._job(r) for r in rows if r["status"] == JobStatus.RUNNING]
        return {job_id: job_id in completed for job_id, _ in done}, claimed


class Subscription(Protocol):
    """A wake-up subscription; ``close()`` ends it."""

    def close(self) -> None: ...


class JobStore(Protocol):
    """Persistence for jobs. Every state change is fenced or guarded exactly as the SQL functions are."""

    def enqueue(self, job: NewJob) -> Enqueued:
        """Insert ``job``, or return the live job holding its idempotency key (``inserted=False``)."""
        ...

    def enqueue_many(self, jobs: Sequence[NewJob]) -> list[Enqueued]:
        """``enqueue`` for many jobs in one call, results in input order; all or nothing on bad input."""
        ...

    def claim(self, types: Sequence[str], worker: str, lease: timedelta, limit: int = 1) -> list[Job]:
        """Lease up to ``limit`` (clamped to 999) runnable ``types`` jobs; reclaims expired leases first."""
        ...

    def complete(self, job_id: UUID, lease_token: UUID) -> bool:
        """Mark succeeded; False when the lease was lost (nothing changed)."""
        ...

    def complete_many(self, done: Sequence[tuple[UUID, UUID]]) -> Mapping[UUID, bool]:
        """``complete`` for many (job_id, lease_token) pairs in one round trip."""
        ...

    def complete_and_claim(
        self,
        done: Sequence[tuple[UUID, UUID]],
        types: Sequence[str],
        worker: str,
        lease: timedelta,
        limit: int,
    ) -> tuple[Mapping[UUID, bool], list[Job]]:
        """``complete_many(done)`` then ``claim(...)``: one round trip and one commit where the store can."""
        ...

    def fail(
        self, job_id: UUID, lease_token: UUID, error: str, retry_delay: timedelta, permanent: bool = False
    ) -> FailResult:
        """Retrying after ``retry_delay``, or dead (attempts used up, or permanent)."""
        ...

    def extend_lease(self, job_id: UUID, lease_token: UUID, lease: timedelta) -> datetime | None:
        """Heartbeat: the new lease end, or None when the lease was lost."""
        ...

    def release(self, job_id: UUID, lease_token: UUID) -> bool:
        """Give a claimed job back unrun (the attempt is not counted); False when the lease was lost."""
        ...

    def reclaim_expired(self, limit: int = 1000) -> list[Reclaimed]:
        """Running jobs whose lease expired → retrying, or dead when attempts are used up."""
        ...

    def requeue(self, ids: Sequence[UUID] | None = None, type: str | None = None) -> list[Job]:
        """Dead jobs back to queued (all dead ones when ``ids`` is None); unknown ids raise JobNotFound."""
        ...

    def prune(
        self,
        older_than: timedelta,
        statuses: Sequence[JobStatus] = DEFAULT_PRUNE_STATUSES,
        limit: int = 10_000,
    ) -> int:
        """Delete up to ``limit`` finished jobs last updated more than ``older_than`` ago; the count."""
        ...

    def stats(self) -> Stats:
        """Counts by type and status, and the oldest runnable job's age."""
        ...

    def get(self, job_id: UUID) -> Job | None:
        """The job, or None."""
        ...

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
        ...

    def listen(self, wake: Callable[[], None]) -> Subscription:
        """Call ``wake`` (from any thread) when jobs may have become runnable; polling is the fallback."""
        ...

    def close(self) -> None:
        """Release connections."""
        ...
