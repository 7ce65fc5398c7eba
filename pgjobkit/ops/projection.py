"""A JetStream queue's operations on its database, as values: its jobs written into jobkit_jobs, each only
where its version is newer (``jobkit_project``, pgjobkit/sql/schema/75_projection.sql), and the outbox the
relay moves into it (pgjobkit/sql/schema/76_outbox.sql)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from pgjobkit.core.models import Job, NewJob
from pgjobkit.ops import Call, Dialect, Op, chunks
from pgjobkit.ops.jobs import job_object


def project(d: Dialect, jobs: Sequence[tuple[Job | UUID, int]]) -> Op[set[UUID]]:
    """Write ``jobs`` (each a job, or the id of one JetStream removed, and its version; a job at most
    once); the ids written or deleted (a job whose version is not newer than the one held is neither)."""
    written: set[UUID] = set()
    for chunk in chunks(jobs, d.max_rows):
        items = [
            {"version": version, "removed": str(job)}
            if isinstance(job, UUID)
            else {"version": version, "job": job.model_dump(mode="json")}
            for job, version in chunk
        ]
        rows = yield Call("jobkit_project", {"p_jobs": ("jsonb", items)}, columns=("id",))
        written |= {UUID(str(row["id"])) for row in rows}
    return written


def outbox_enqueue(jobs: Sequence[NewJob]) -> Op[list[int]]:
    """``jobs`` (1 to 1000, each with an idempotency key) into the outbox (``jobkit_outbox_enqueue``), on
    the connection the store is given: ``store.run(outbox_enqueue(jobs), conn)`` enqueues them in that
    connection's transaction. Their outbox numbers."""
    rows = yield Call("jobkit_outbox_enqueue", {"p_jobs": ("jsonb", [job_object(j) for j in jobs])})
    return [int(row if isinstance(row, int) else next(iter(row.values()))) for row in rows]


def outbox_take(limit: int) -> Op[list[tuple[int, dict[str, Any]]]]:
    """The oldest ``limit`` outbox jobs waiting to move (``jobkit_outbox_take``): (outbox number, job)."""
    rows = yield Call("jobkit_outbox_take", {"p_limit": ("integer", limit)})
    return [(int(row["seq"]), _object(row["job"])) for row in rows]


def outbox_done(seqs: Sequence[int], errors: Sequence[str | None]) -> Op[int]:
    """Remove the outbox jobs that moved, keep those that could not with their error (``errors``: one a
    number, None where it moved)."""
    args = {"p_seqs": ("bigint[]", list(seqs)), "p_errors": ("text[]", list(errors))}
    return int((yield Call("jobkit_outbox_done", args, scalar=True)))


def _object(value: Any) -> dict[str, Any]:
    """A jsonb value as psycopg reads it (a dict) or as a JSON transport carries it (a dict, or its text)."""
    return dict(json.loads(value) if isinstance(value, str) else value)
