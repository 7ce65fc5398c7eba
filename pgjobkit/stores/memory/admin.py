"""An operator's SQL functions in process: jobkit_cancel, _requeue, _prune, _stats, _get, _traceback,
_list_jobs and _schema_version, with the SQL's argument checks and per-call limits (cancel settles the jobs that wait for
the jobs it ends; prune keeps what they still need)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from uuid import UUID

from pgjobkit.core import transitions
from pgjobkit.core.bounds import BATCH_LIMIT, MAX_ROWS
from pgjobkit.core.models import Job, JobStatus
from pgjobkit.errors import InvalidArgument, JobNotFound
from pgjobkit.stores.memory.state import Row, State, Woken, row_of
from pgjobkit.version import SCHEMA_VERSION


def check_limit(limit: int, high: int, name: str = "p_limit") -> None:
    if not 1 <= limit <= high:
        raise InvalidArgument(f"jobkit: {name} must be between 1 and {high}")


def cancel(state: State, now: datetime, woken: Woken, p_ids: list[UUID], p_reason: str | None) -> list[Row]:
    if len(p_ids) > MAX_ROWS:
        raise InvalidArgument(f"jobkit: p_ids must be an array of at most {MAX_ROWS} ids")
    done: set[UUID] = set()
    for job_id in p_ids:
        job = state.jobs.get(job_id)
        cancelled = transitions.cancel(job, now=now, reason=p_reason) if job is not None else None
        if cancelled is not None:
            state.put(cancelled)
            done.add(job_id)
    state.settle(now, woken, done)
    return [
        {"id": job_id, "cancelled": job_id in done, "status": job.status if job else None}
        for job_id, job in ((i, state.jobs.get(i)) for i in p_ids)
    ]


def requeue(
    state: State,
    now: datetime,
    woken: Woken,
    p_ids: list[UUID] | None,
    p_type: str | None,
    p_limit: int,
    p_dead_before: datetime | None,
) -> list[Row]:
    check_limit(p_limit, MAX_ROWS)
    if p_ids is not None:
        if len(p_ids) > BATCH_LIMIT:
            raise InvalidArgument(
                f"jobkit: p_ids must be a one-dimensional array of at most {BATCH_LIMIT} job ids"
            )
        for job_id in p_ids:
            if job_id not in state.jobs:
                raise JobNotFound(f"jobkit: job {job_id} not found", job_id=job_id)
    wanted = set(p_ids) if p_ids is not None else None
    dead = [
        j
        for j in state.jobs.values()
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
                or (newest[j.idempotency_key] is j and j.idempotency_key not in state.live_keys)
            )
        ),
        key=lambda j: (j.updated_at, j.id.bytes),
    )[:p_limit]
    out = []
    for job in chosen:
        new = transitions.requeue(job, now=now)
        state.put(new)
        out.append(row_of(new))
    if out:
        state.wake(woken)
    return out


def prune(
    state: State,
    now: datetime,
    woken: Woken,
    p_older_than_seconds: float,
    p_statuses: tuple[str, ...],
    p_limit: int,
) -> int:
    older, statuses = transitions.check_prune(p_older_than_seconds, p_statuses, p_limit)
    cutoff = now - older
    doomed = [
        j.id
        for j in state.jobs.values()
        if j.status in statuses and j.updated_at < cutoff and not state.needed(j.id)
    ][:p_limit]
    for job_id in doomed:
        state.drop(job_id)
        state.tracebacks.pop(job_id, None)
    # and those past the horizon whose job was deleted another way (on completion, after a failure)
    orphans = [i for i, t in state.tracebacks.items() if t["failed_at"] < cutoff and i not in state.jobs]
    for job_id in orphans[:p_limit]:
        del state.tracebacks[job_id]
    return len(doomed)


def stats(
    state: State,
    now: datetime,
    woken: Woken,
    p_after_type: str | None,
    p_after_status: str | None,
    p_limit: int,
) -> list[Row]:
    return stats_rows(state.jobs.values(), now, p_after_type, p_after_status, p_limit)


def stats_rows(
    jobs: Iterable[Job], now: datetime, after_type: str | None, after_status: str | None, limit: int
) -> list[Row]:
    """jobkit_stats's rows for ``jobs``: by (type, status), after the given pair, at most ``limit``
    (the JetStream store counts its records with it too)."""
    groups: dict[tuple[str, str], list[Job]] = {}
    for job in jobs:
        groups.setdefault((job.type, str(job.status)), []).append(job)
    after = (after_type, after_status or "") if after_type is not None else None
    rows = []
    for (type_, status), jobs in sorted(groups.items()):
        if after is not None and (type_, status) <= after:
            continue
        runnable = [j.run_after for j in jobs if transitions.is_runnable(j, now)]
        oldest = (now - min(runnable)).total_seconds() if runnable else None
        rows.append({"type": type_, "status": status, "count": len(jobs), "oldest_runnable_seconds": oldest})
    return rows[: max(1, min(limit, MAX_ROWS))]


def get(state: State, now: datetime, woken: Woken, p_id: UUID) -> list[Row]:
    job = state.jobs.get(p_id)
    return [row_of(job)] if job is not None else []


def traceback(state: State, now: datetime, woken: Woken, p_id: UUID) -> list[Row]:
    kept = state.tracebacks.get(p_id)
    return [dict(kept)] if kept is not None else []


def list_jobs(
    state: State,
    now: datetime,
    woken: Woken,
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
        for j in state.jobs.values()
        if (p_status is None or j.status == p_status)
        and (p_type is None or j.type == p_type)
        and (p_user_id is None or j.user_id == p_user_id)
        and (p_before is None or (j.created_at, j.id.bytes) < (p_before, (p_before_id or UUID(int=0)).bytes))
    ]
    jobs.sort(key=lambda j: (j.created_at, j.id.bytes), reverse=True)
    return [row_of(j) for j in jobs[:p_limit]]


def schema_version(state: State, now: datetime, woken: Woken) -> str:
    """A MemoryStore is always at the schema of the jobkit it comes with."""
    return SCHEMA_VERSION
