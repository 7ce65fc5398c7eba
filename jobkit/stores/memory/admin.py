"""The MemoryStore's in-process versions of jobkit's operator functions (cancel, requeue, prune, stats, get,
list), with the SQL's argument checks and per-call limits; and the helpers every in-process function
shares. A base class of MemoryStore, which holds the jobs and the lock these run under."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from jobkit.core import transitions
from jobkit.core.models import FINISHED, Job, JobStatus, check_result
from jobkit.errors import InvalidArgument, JobNotFound
from jobkit.ops import MAX_ROWS

Row = dict[str, Any]


def row_of(job: Job, **extra: Any) -> Row:
    return {**job.__dict__, **extra}


def check_limit(limit: int, high: int, name: str = "p_limit") -> None:
    if not 1 <= limit <= high:
        raise InvalidArgument(f"jobkit: {name} must be between 1 and {high}")


def check_pairs(ids: list[UUID], tokens: list[UUID], ids_name: str, tokens_name: str) -> None:
    if len(ids) != len(tokens) or len(ids) > MAX_ROWS:
        raise InvalidArgument(
            f"jobkit: {ids_name} and {tokens_name} must be arrays of equal length (at most {MAX_ROWS})"
        )


def check_results(results: dict[str, Any] | None) -> None:
    """Each result as the SQL domain jobkit_result takes it (64 KiB, readable by every client), or none is
    kept: a bad one fails the whole call, as its CHECK fails the statement."""
    for result in (results or {}).values():
        try:
            check_result(result)
        except ValueError as exc:
            raise InvalidArgument(f"jobkit: {exc}") from None


KEY_FREED = frozenset({JobStatus.DEAD, JobStatus.CANCELLED})  # statuses that free a job's key


class OperatorFunctions:
    """jobkit_cancel, _requeue, _prune, _stats, _get and _list, over ``_jobs`` and ``_live_keys``."""

    _jobs: dict[UUID, Job]
    _live_keys: dict[str, UUID]

    def _put(self, job: Job) -> None:
        raise NotImplementedError

    def _wake(self, woken: list[Callable[[], None]]) -> None:
        raise NotImplementedError

    def _cancel(
        self, now: datetime, woken: list[Callable[[], None]], p_ids: list[UUID], p_reason: str | None
    ) -> list[Row]:
        if len(p_ids) > MAX_ROWS:
            raise InvalidArgument("jobkit: p_ids must be an array of at most 1000 ids")
        rows = []
        for job_id in p_ids:
            job = self._jobs.get(job_id)
            cancelled = transitions.cancel(job, now=now, reason=p_reason) if job is not None else None
            if cancelled is not None:
                self._put(cancelled)
            now_is = cancelled or job
            rows.append(
                {
                    "id": job_id,
                    "cancelled": cancelled is not None,
                    "status": now_is.status if now_is else None,
                }
            )
        return rows

    def _requeue(
        self,
        now: datetime,
        woken: list[Callable[[], None]],
        p_ids: list[UUID] | None,
        p_type: str | None,
        p_limit: int,
        p_dead_before: datetime | None,
    ) -> list[Row]:
        check_limit(p_limit, MAX_ROWS)
        if p_ids is not None:
            if len(p_ids) > transitions.BATCH_LIMIT:
                raise InvalidArgument(
                    "jobkit: p_ids must be a one-dimensional array of at most 10000 job ids"
                )
            for job_id in p_ids:
                if job_id not in self._jobs:
                    raise JobNotFound(f"jobkit: job {job_id} not found", job_id=job_id)
        wanted = set(p_ids) if p_ids is not None else None
        dead = [
            j
            for j in self._jobs.values()
            if j.status == JobStatus.DEAD
            and (wanted is None or j.id in wanted)
            and (p_type is None or j.type == p_type)
        ]
        newest: dict[str, Job] = {}  # of dead candidates sharing a key only the newest may come back
        for j in dead:
            if j.idempotency_key is not None:
                held = newest.get(j.idempotency_key)
                if held is None or (j.updated_at, j.id.bytes) > (held.updated_at, held.id.bytes):
                    newest[j.idempotency_key] = j
        chosen = sorted(
            (
                j
                for j in dead
                if (p_dead_before is None or j.updated_at <= p_dead_before)
                and (
                    j.idempotency_key is None
                    or (newest[j.idempotency_key] is j and j.idempotency_key not in self._live_keys)
                )
            ),
            key=lambda j: (j.updated_at, j.id.bytes),
        )[:p_limit]
        out = []
        for job in chosen:
            new = transitions.requeue(job, now=now)
            self._put(new)
            out.append(row_of(new))
        if out:
            self._wake(woken)
        return out

    def _prune(
        self,
        now: datetime,
        woken: list[Callable[[], None]],
        p_older_than_seconds: float,
        p_statuses: tuple[str, ...],
        p_limit: int,
    ) -> int:
        if p_older_than_seconds < 0:
            raise InvalidArgument("jobkit: p_older_than_seconds must be >= 0")
        if not p_statuses or not set(p_statuses) <= FINISHED:
            raise InvalidArgument(
                "jobkit: p_statuses must be a non-empty subset of {succeeded, dead, cancelled}"
            )
        check_limit(p_limit, transitions.BATCH_LIMIT)
        cutoff = now - timedelta(seconds=p_older_than_seconds)
        statuses = set(p_statuses)
        doomed = [j.id for j in self._jobs.values() if j.status in statuses and j.updated_at < cutoff][
            :p_limit
        ]
        for job_id in doomed:
            self._drop(job_id)
        return len(doomed)

    def _drop(self, job_id: UUID) -> None:
        """Delete a job, freeing its idempotency key."""
        job = self._jobs.pop(job_id)
        if job.idempotency_key is not None and self._live_keys.get(job.idempotency_key) == job_id:
            del self._live_keys[job.idempotency_key]

    def _stats(
        self,
        now: datetime,
        woken: list[Callable[[], None]],
        p_after_type: str | None,
        p_after_status: str | None,
        p_limit: int,
    ) -> list[Row]:
        groups: dict[tuple[str, str], list[Job]] = {}
        for job in self._jobs.values():
            groups.setdefault((job.type, str(job.status)), []).append(job)
        after = (p_after_type, p_after_status or "") if p_after_type is not None else None
        rows = []
        for (type_, status), jobs in sorted(groups.items()):
            if after is not None and (type_, status) <= after:
                continue
            runnable = [j.run_after for j in jobs if transitions.is_runnable(j, now)]
            oldest = (now - min(runnable)).total_seconds() if runnable else None
            rows.append(
                {"type": type_, "status": status, "count": len(jobs), "oldest_runnable_seconds": oldest}
            )
        return rows[: max(1, min(p_limit, MAX_ROWS))]

    def _get(self, now: datetime, woken: list[Callable[[], None]], p_id: UUID) -> list[Row]:
        job = self._jobs.get(p_id)
        return [row_of(job)] if job is not None else []

    def _list_jobs(
        self,
        now: datetime,
        woken: list[Callable[[], None]],
        p_status: str | None,
        p_type: str | None,
        p_user_id: UUID | None,
        p_before: datetime | None,
        p_before_id: UUID | None,
        p_limit: int,
    ) -> list[Row]:
        check_limit(p_limit, MAX_ROWS)
        jobs = [
            j
            for j in self._jobs.values()
            if (p_status is None or j.status == p_status)
            and (p_type is None or j.type == p_type)
            and (p_user_id is None or j.user_id == p_user_id)
            and (
                p_before is None
                or (j.created_at, j.id.bytes) < (p_before, (p_before_id or UUID(int=0)).bytes)
            )
        ]
        jobs.sort(key=lambda j: (j.created_at, j.id.bytes), reverse=True)
        return [row_of(j) for j in jobs[:p_limit]]
