"""Seeing the queue and its workers, as values: a worker's beat and stop, the workers, their activity by
the minute, and the queue's depth."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from pgjobkit.core.workers import ActivityRow, QueueDepth, WorkerInfo
from pgjobkit.ops import Call, Dialect, Op, as_uuid, chunks, paged


def worker_beat(
    d: Dialect,
    worker: str,
    *,
    host: str | None,
    pid: int | None,
    version: str | None,
    types: Sequence[str],
    concurrency: int | None,
    stale_seconds: float,
    activity: list[dict[str, Any]],
) -> Op[int]:
    """How many vanished workers the beat deleted."""
    return int(
        (
            yield Call(
                "jobkit_worker_beat",
                {
                    "p_worker": ("text", worker),
                    "p_host": ("text", host),
                    "p_pid": ("integer", pid),
                    "p_version": ("text", version),
                    "p_types": ("text[]", tuple(types)),
                    "p_concurrency": ("integer", concurrency),
                    "p_stale_seconds": ("double precision", stale_seconds),
                    "p_activity": ("jsonb", activity or None),
                },
                scalar=True,
            )
        )
    )


def worker_stop(d: Dialect, worker: str) -> Op[bool]:
    return bool((yield Call("jobkit_worker_stop", {"p_worker": ("text", worker)}, scalar=True)))


def list_workers(d: Dialect) -> Op[list[WorkerInfo]]:
    rows = yield Call("jobkit_list_workers")
    return [WorkerInfo.model_validate(r) for r in rows]


def queue_depth(d: Dialect) -> Op[list[QueueDepth]]:
    """Every unfinished (type, status), paged by the last row's key: none is cut at max_rows."""

    def after(last: QueueDepth | None) -> dict[str, tuple[str, Any]]:
        return {
            "p_after_type": ("text", last.type if last else None),
            "p_after_status": ("text", str(last.status) if last else None),
        }

    return (yield from paged(d, "jobkit_queue_depth", after, QueueDepth.model_validate))


def activity(d: Dialect, since: datetime) -> Op[list[ActivityRow]]:
    """Every minute since ``since``, paged by the last row's key."""

    def after(last: ActivityRow | None) -> dict[str, tuple[str, Any]]:
        return {
            "p_since": ("timestamptz", since),
            "p_after_minute": ("timestamptz", last.minute if last else None),
            "p_after_type": ("text", last.type if last else None),
            "p_after_outcome": ("text", last.outcome if last else None),
        }

    return (yield from paged(d, "jobkit_activity", after, ActivityRow.model_validate))


def trace_contexts(d: Dialect, ids: Sequence[UUID]) -> Op[dict[UUID, dict[str, str]]]:
    """The trace context of each of ``ids`` that has one. A value that is not an object of strings (stored
    by hand, say) is left out: a job is never refused over its trace."""
    out: dict[UUID, dict[str, str]] = {}
    for chunk in chunks(ids, d.max_rows):
        rows = yield Call("jobkit_trace_contexts", {"p_ids": ("uuid[]", list(chunk))})
        for r in rows:
            context = r["trace_context"]
            if isinstance(context, dict) and all(isinstance(v, str) for v in context.values()):
                out[as_uuid(r["id"])] = context
    return out
