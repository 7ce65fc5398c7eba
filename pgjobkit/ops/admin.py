"""An operator's operations, as values: cancel, requeue, prune, reclaim expired leases, stats, get, list."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from pgjobkit.core.bounds import DEFAULT_PRUNE_LIMIT, MAX_ROWS
from pgjobkit.core.models import Cancelled, Job, JobStatus, Reclaimed, Stats, StatsRow
from pgjobkit.errors import NOT_MIGRATED, ConfigurationError, InvalidArgument
from pgjobkit.ops import Call, Dialect, Op, chunks, paged

DEFAULT_PRUNE_STATUSES: tuple[JobStatus, ...] = (JobStatus.SUCCEEDED, JobStatus.DEAD, JobStatus.CANCELLED)


def cancel(d: Dialect, ids: Sequence[UUID], reason: str | None = None) -> Op[list[Cancelled]]:
    out: list[Cancelled] = []
    for chunk in chunks(ids, d.max_rows):
        rows = yield Call("jobkit_cancel", {"p_ids": ("uuid[]", list(chunk)), "p_reason": ("text", reason)})
        out += [Cancelled.model_validate(r) for r in rows]
    return out


def reclaim_expired(d: Dialect, limit: int = MAX_ROWS) -> Op[list[Reclaimed]]:
    if limit < 1:
        raise InvalidArgument(f"jobkit: p_limit must be >= 1 (got {limit})")
    out: list[Reclaimed] = []
    while len(out) < limit:
        want = min(limit - len(out), d.max_rows)
        rows = yield Call("jobkit_reclaim_expired", {"p_limit": ("integer", want)})
        out += [Reclaimed.model_validate(r) for r in rows]
        if len(rows) < want:
            break
    return out


def requeue(d: Dialect, ids: Sequence[UUID] | None = None, type: str | None = None) -> Op[list[Job]]:
    """Calls of at most max_rows each, until one returns fewer. The first call's rows carry the time it ran:
    later calls take only jobs dead by then, so a job that dies again meanwhile ends the run."""
    out: list[Job] = []
    dead_before: datetime | None = None
    while True:
        rows = yield Call(
            "jobkit_requeue",
            {
                "p_ids": ("uuid[]", list(ids) if ids is not None else None),
                "p_type": ("text", type),
                "p_limit": ("integer", d.max_rows),
                "p_dead_before": ("timestamptz", dead_before),
            },
        )
        got = [d.job(r) for r in rows]
        out += got
        if len(got) < d.max_rows:
            return out
        dead_before = dead_before or got[0].updated_at


def prune(
    d: Dialect,
    older_than: timedelta,
    statuses: Sequence[JobStatus] = DEFAULT_PRUNE_STATUSES,
    limit: int = DEFAULT_PRUNE_LIMIT,
) -> Op[int]:
    args = {
        "p_older_than_seconds": ("double precision", older_than.total_seconds()),
        "p_statuses": ("text[]", tuple(str(s) for s in statuses)),
        "p_limit": ("integer", limit),
    }
    return int((yield Call("jobkit_prune", args, scalar=True)))


def stats(d: Dialect) -> Op[Stats]:
    def after(last: StatsRow | None) -> dict[str, tuple[str, Any]]:
        return {
            "p_after_type": ("text", last.type if last else None),
            "p_after_status": ("text", str(last.status) if last else None),
        }

    return Stats(rows=tuple((yield from paged(d, "jobkit_stats", after, StatsRow.model_validate))))


def schema_version(d: Dialect) -> Op[str | None]:
    """The database's jobkit schema version; None before 0.2.0 (which had no version) or with no jobkit."""
    try:
        return str((yield Call("jobkit_schema_version", scalar=True)))
    except ConfigurationError as exc:  # no such function: the schema is older, or absent
        if exc.code not in NOT_MIGRATED:
            raise  # a configuration error of another kind (an unknown database, a refused login)
        return None


def get(d: Dialect, job_id: UUID) -> Op[Job | None]:
    rows = yield Call("jobkit_get", {"p_id": ("uuid", job_id)})
    return d.job(rows[0]) if rows else None


def list_jobs(
    d: Dialect,
    *,
    status: JobStatus | None = None,
    type: str | None = None,
    user_id: UUID | None = None,
    before: tuple[datetime, UUID] | None = None,
    limit: int = 50,
) -> Op[list[Job]]:
    rows = yield Call(
        "jobkit_list_jobs",
        {
            "p_status": ("text", str(status) if status is not None else None),
            "p_type": ("text", type),
            "p_user_id": ("uuid", user_id),
            "p_before": ("timestamptz", before[0] if before else None),
            "p_before_id": ("uuid", before[1] if before else None),
            "p_limit": ("integer", limit),
        },
    )
    return [d.job(r) for r in rows]
