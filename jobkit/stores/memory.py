"""MemoryStore: the whole JobStore in process, driven by ``jobkit.core``. A product for users' tests.

Thread-safe; inspect it with ``jobs()``, reset it with ``reset()``, and pass ``clock`` to control time.
It passes the same contract suite as the SQL (tests/contract/); the one thing it cannot check is that a
``user_id`` exists in ``auth.users``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from uuid import UUID

from jobkit import core
from jobkit.errors import InvalidArgument, JobNotFound
from jobkit.models import (
    FINISHED,
    Enqueued,
    FailResult,
    Job,
    JobStatus,
    NewJob,
    Reclaimed,
    Stats,
    StatsRow,
)
from jobkit.stores.base import DEFAULT_PRUNE_STATUSES


def _utcnow() -> datetime:
    return datetime.now(UTC)


class _Unsubscribe:
    def __init__(self, store: MemoryStore, wake: Callable[[], None]) -> None:
        self._store, self._wake = store, wake

    def close(self) -> None:
        with self._store._lock:
            if self._wake in self._store._listeners:
                self._store._listeners.remove(self._wake)


class MemoryStore:
    """An in-process JobStore. ``clock`` returns the current time (timezone-aware); default: UTC now."""

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self._clock = clock or _utcnow
        self._lock = threading.RLock()
        self._jobs: dict[UUID, Job] = {}
        self._live_keys: dict[str, UUID] = {}
        self._listeners: list[Callable[[], None]] = []

    def __repr__(self) -> str:
        return f"MemoryStore(jobs={len(self._jobs)})"

    # --- inspection, for tests -------------------------------------------------------------------
    def jobs(self) -> list[Job]:
        """Every job, oldest first."""
        with self._lock:
            return sorted(self._jobs.values(), key=lambda j: (j.created_at, str(j.id)))

    def reset(self) -> None:
        """Forget every job."""
        with self._lock:
            self._jobs.clear()
            self._live_keys.clear()

    # --- internals -----------------------------------------------------------------------------------
    def _put(self, job: Job) -> None:
        old = self._jobs.get(job.id)
        if old is not None and old.idempotency_key is not None and old.status != JobStatus.DEAD:
            self._live_keys.pop(old.idempotency_key, None)
        self._jobs[job.id] = job
        if job.idempotency_key is not None and job.status != JobStatus.DEAD:
            self._live_keys[job.idempotency_key] = job.id

    def _apply(self, outcome: core.Outcome) -> Job | None:
        if isinstance(outcome, core.Applied):
            self._put(outcome.job)
            return outcome.job
        return None

    # --- JobStore --------------------------------------------------------------------------------------
    def enqueue(self, job: NewJob) -> Enqueued:
        return self.enqueue_many([job])[0]

    def enqueue_many(self, jobs: Sequence[NewJob]) -> list[Enqueued]:
        if len(jobs) > core.BATCH_LIMIT:
            raise InvalidArgument(f"jobkit: p_jobs holds {len(jobs)} jobs; at most 10000 per call")
        out: list[Enqueued] = []
        woke = False
        with self._lock:
            now = self._clock()
            for new in jobs:
                held = self._live_keys.get(new.idempotency_key) if new.idempotency_key is not None else None
                if held is not None:
                    out.append(Enqueued(job=self._jobs[held], inserted=False))
                    continue
                run_after = new.run_after or (now + new.delay if new.delay is not None else now)
                job = Job(
                    id=uuid.uuid4(),
                    user_id=new.user_id,
                    type=new.type,
                    status=JobStatus.QUEUED,
                    payload=new.payload,
                    idempotency_key=new.idempotency_key,
                    attempts=0,
                    max_attempts=new.max_attempts,
                    priority=new.priority,
                    run_after=run_after,
                    created_at=now,
                    updated_at=now,
                )
                self._put(job)
                woke = woke or run_after <= now
                out.append(Enqueued(job=job, inserted=True))
            listeners = list(self._listeners) if woke else []
        for wake in listeners:
            wake()
        return out

    def claim(self, types: Sequence[str], worker: str, lease: timedelta, limit: int = 1) -> list[Job]:
        core.check_types(types)
        core.check_worker(worker)
        core.check_lease(lease)
        limit = core.check_limit(limit)
        wanted = set(types)
        with self._lock:
            self.reclaim_expired()
            now = self._clock()
            runnable = sorted(
                (j for j in self._jobs.values() if j.type in wanted and core.is_runnable(j, now)),
                key=core.claim_order,
            )[:limit]
            claimed = []
            for job in runnable:
                new = core.claim(job, now=now, worker=worker, lease=lease, token=uuid.uuid4())
                self._put(new)
                claimed.append(new)
            return claimed

    def complete(self, job_id: UUID, lease_token: UUID) -> bool:
        return self.complete_many([(job_id, lease_token)])[job_id]

    def complete_many(self, done: Sequence[tuple[UUID, UUID]]) -> Mapping[UUID, bool]:
        if len(done) > core.BATCH_LIMIT:
            raise InvalidArgument(
                f"jobkit: complete_many takes at most {core.BATCH_LIMIT} jobs per call (got {len(done)})"
            )
        with self._lock:
            now = self._clock()
            return {
                job_id: self._apply(core.complete(self._jobs.get(job_id), token, now=now, job_id=job_id))
                is not None
                for job_id, token in done
            }

    def complete_and_claim(
        self,
        done: Sequence[tuple[UUID, UUID]],
        types: Sequence[str],
        worker: str,
        lease: timedelta,
        limit: int,
    ) -> tuple[Mapping[UUID, bool], list[Job]]:
        with self._lock:
            return self.complete_many(done), self.claim(types, worker, lease, limit) if limit > 0 else []

    def fail(
        self, job_id: UUID, lease_token: UUID, error: str, retry_delay: timedelta, permanent: bool = False
    ) -> FailResult:
        with self._lock:
            outcome = core.fail(
                self._jobs.get(job_id),
                lease_token,
                now=self._clock(),
                job_id=job_id,
                error=error,
                retry_delay=retry_delay,
                permanent=permanent,
            )
            job = self._apply(outcome)
        if job is None:
            return FailResult(ok=False)
        return FailResult(ok=True, status=job.status, attempts=job.attempts, run_after=job.run_after)

    def extend_lease(self, job_id: UUID, lease_token: UUID, lease: timedelta) -> datetime | None:
        with self._lock:
            job = self._apply(
                core.extend(
                    self._jobs.get(job_id), lease_token, now=self._clock(), job_id=job_id, lease=lease
                )
            )
        return job.lease_until if job is not None else None

    def release(self, job_id: UUID, lease_token: UUID) -> bool:
        with self._lock:
            job = self._apply(
                core.release(self._jobs.get(job_id), lease_token, now=self._clock(), job_id=job_id)
            )
            listeners = list(self._listeners) if job is not None else []
        for wake in listeners:
            wake()
        return job is not None

    def reclaim_expired(self, limit: int = 1000) -> list[Reclaimed]:
        if limit < 1:
            raise InvalidArgument(f"jobkit: p_limit must be >= 1 (got {limit})")
        with self._lock:
            now = self._clock()
            expired = sorted(
                (j for j in self._jobs.values() if core.is_expired(j, now)),
                key=lambda j: j.lease_until or now,
            )[:limit]
            out = []
            for job in expired:
                new = core.reclaim(job, now=now)
                self._put(new)
                out.append(Reclaimed(id=new.id, status=new.status, attempts=new.attempts))
            return out

    def requeue(self, ids: Sequence[UUID] | None = None, type: str | None = None) -> list[Job]:
        with self._lock:
            if ids is not None:
                if len(ids) > core.BATCH_LIMIT:
                    raise InvalidArgument("jobkit: p_ids holds more than 10000 ids")
                for job_id in ids:
                    if job_id not in self._jobs:
                        raise JobNotFound(f"jobkit: job {job_id} not found", job_id=job_id)
            wanted = set(ids) if ids is not None else None
            dead = [
                j
                for j in self._jobs.values()
                if j.status == JobStatus.DEAD
                and (wanted is None or j.id in wanted)
                and (type is None or j.type == type)
            ]
            # Of dead jobs sharing a key only the newest comes back, and only if no live job holds the key.
            dead.sort(key=lambda j: (j.updated_at, str(j.id)), reverse=True)
            now = self._clock()
            out = []
            for job in dead:
                if job.idempotency_key is not None and job.idempotency_key in self._live_keys:
                    continue
                new = core.requeue(job, now=now)
                self._put(new)
                out.append(new)
            listeners = list(self._listeners) if out else []
        for wake in listeners:
            wake()
        return out

    def prune(
        self,
        older_than: timedelta,
        statuses: Sequence[JobStatus] = DEFAULT_PRUNE_STATUSES,
        limit: int = 10_000,
    ) -> int:
        if older_than < timedelta(0):
            raise InvalidArgument("jobkit: p_older_than_seconds must be >= 0")
        if not statuses or not set(statuses) <= FINISHED:
            raise InvalidArgument("jobkit: p_statuses must be a non-empty subset of {succeeded, dead}")
        if not 1 <= limit <= 10_000:
            raise InvalidArgument("jobkit: p_limit must be between 1 and 10000")
        with self._lock:
            cutoff = self._clock() - older_than
            doomed = [j.id for j in self._jobs.values() if j.status in statuses and j.updated_at < cutoff][
                :limit
            ]
            for job_id in doomed:
                job = self._jobs.pop(job_id)
                if job.idempotency_key is not None and self._live_keys.get(job.idempotency_key) == job_id:
                    del self._live_keys[job.idempotency_key]
            return len(doomed)

    def stats(self) -> Stats:
        with self._lock:
            now = self._clock()
            groups: dict[tuple[str, JobStatus], list[Job]] = {}
            for job in self._jobs.values():
                groups.setdefault((job.type, job.status), []).append(job)
        rows = []
        for (type_, status), jobs in sorted(groups.items()):
            runnable = [j.run_after for j in jobs if core.is_runnable(j, now)]
            oldest = (now - min(runnable)).total_seconds() if runnable else None
            rows.append(StatsRow(type=type_, status=status, count=len(jobs), oldest_runnable_seconds=oldest))
        return Stats(rows=tuple(rows))

    def get(self, job_id: UUID) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def list(
        self,
        *,
        status: JobStatus | None = None,
        type: str | None = None,
        user_id: UUID | None = None,
        before: tuple[datetime, UUID] | None = None,
        limit: int = 50,
    ) -> list[Job]:
        if not 1 <= limit <= 1000:
            raise InvalidArgument("jobkit: p_limit must be between 1 and 1000")
        with self._lock:
            jobs = [
                j
                for j in self._jobs.values()
                if (status is None or j.status == status)
                and (type is None or j.type == type)
                and (user_id is None or j.user_id == user_id)
                and (before is None or (j.created_at, str(j.id)) < (before[0], str(before[1])))
            ]
        jobs.sort(key=lambda j: (j.created_at, str(j.id)), reverse=True)
        return jobs[:limit]

    def listen(self, wake: Callable[[], None]) -> _Unsubscribe:
        with self._lock:
            self._listeners.append(wake)
        return _Unsubscribe(self, wake)

    def close(self) -> None:
        with self._lock:
            self._listeners.clear()
