"""The JobStore Protocol: the one seam every adapter (memory, Postgres, Supabase) implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar
from uuid import UUID

from jobkit.core import BATCH_LIMIT, CLAIM_LIMIT_CAP
from jobkit.errors import InvalidArgument
from jobkit.models import Enqueued, FailResult, Job, JobStatus, NewJob, Reclaimed, Stats, StatsRow

T = TypeVar("T")
DEFAULT_PRUNE_STATUSES: tuple[JobStatus, ...] = (JobStatus.SUCCEEDED, JobStatus.DEAD)


def _uuid(value: UUID | str) -> UUID:
    """A row's id: psycopg gives a UUID, PostgREST's JSON a string."""
    return value if isinstance(value, UUID) else UUID(value)


MAX_ROWS = 1000  # PostgREST's max-rows on Supabase; no jobkit SQL function returns more in one call


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


class SqlStore(ABC):
    """What the stores calling jobkit's SQL functions (Postgres, Supabase) share: each operation whose
    answer can exceed ``max_rows`` rows is cut into calls that cannot, so no row is lost and no job is leased
    unseen (PostgREST cuts a longer answer while the function runs to completion). The stores supply one
    bounded call per operation and how to read a row."""

    max_rows: int = MAX_ROWS

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
    def _complete_rows(self, done: Sequence[tuple[UUID, UUID]]) -> Mapping[UUID, bool]:
        """One jobkit_complete call (at most ``max_rows`` pairs)."""

    @abstractmethod
    def _reclaim_rows(self, limit: int) -> list[Reclaimed]:
        """One jobkit_reclaim_expired call (at most ``max_rows``)."""

    @abstractmethod
    def _requeue_rows(
        self, ids: Sequence[UUID] | None, type: str | None, limit: int, dead_before: datetime | None
    ) -> list[Job]:
        """One jobkit_requeue call (at most ``limit`` <= ``max_rows`` rows)."""

    @abstractmethod
    def _stats_rows(self, after: tuple[str, str] | None, limit: int) -> list[StatsRow]:
        """One page of jobkit_stats: rows after the (type, status) pair ``after``."""

    def claim(self, types: Sequence[str], worker: str, lease: timedelta, limit: int = 1) -> list[Job]:
        limit = min(limit, self.max_rows)
        return [self._job(r) for r in self._claim_rows(types, worker, lease, limit)]

    def complete(self, job_id: UUID, lease_token: UUID) -> bool:
        return self.complete_many([(job_id, lease_token)])[job_id]

    def complete_many(self, done: Sequence[tuple[UUID, UUID]]) -> Mapping[UUID, bool]:
        if len(done) > BATCH_LIMIT:
            raise InvalidArgument(
                f"jobkit: complete_many takes at most {BATCH_LIMIT} jobs per call (got {len(done)})"
            )
        ok: dict[UUID, bool] = {}
        for chunk in chunks(done, self.max_rows):
            ok.update(self._complete_rows(chunk))
        return ok

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
        # as running rows; a done id not among them lost its lease. Both count against max_rows: the done
        # ids beyond what leaves room for the claim are completed first, on their own.
        limit = min(limit, CLAIM_LIMIT_CAP, self.max_rows - 1)
        room = self.max_rows - limit
        ok = dict(self.complete_many(done[:-room])) if len(done) > room else {}
        last = done[-room:]
        rows = self._claim_rows(types, worker, lease, limit, last)
        completed = {_uuid(r["id"]) for r in rows if r["status"] == JobStatus.SUCCEEDED}
        claimed = [self._job(r) for r in rows if r["status"] == JobStatus.RUNNING]
        ok.update((job_id, job_id in completed) for job_id, _ in last)
        return ok, claimed

    def reclaim_expired(self, limit: int = 1000) -> list[Reclaimed]:
        if limit < 1:
            raise InvalidArgument(f"jobkit: p_limit must be >= 1 (got {limit})")
        out: list[Reclaimed] = []
        while len(out) < limit:
            want = min(limit - len(out), self.max_rows)
            got = self._reclaim_rows(want)
            out += got
            if len(got) < want:
                break
        return out

    def requeue(self, ids: Sequence[UUID] | None = None, type: str | None = None) -> list[Job]:
        # Calls of at most max_rows each, until one returns fewer. The first call's rows carry the time it
        # ran: later calls take only jobs dead by then, so a job that dies again meanwhile ends the run.
        out: list[Job] = []
        dead_before: datetime | None = None
        while True:
            got = self._requeue_rows(ids, type, self.max_rows, dead_before)
            out += got
            if len(got) < self.max_rows:
                return out
            dead_before = dead_before or got[0].updated_at

    def stats(self) -> Stats:
        rows: list[StatsRow] = []
        after: tuple[str, str] | None = None
        while True:
            page = self._stats_rows(after, self.max_rows)
            rows += page
            if len(page) < self.max_rows:
                return Stats(rows=tuple(rows))
            after = (page[-1].type, str(page[-1].status))


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
