"""The projection's one operation, as a value: jobs of a JetStream queue written into the database's
jobkit_jobs, each only where its version is newer (``jobkit_project``, pgjobkit/sql/schema/75_projection.sql)."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from pgjobkit.core.models import Job
from pgjobkit.ops import Call, Dialect, Op, chunks


def project(d: Dialect, jobs: Sequence[tuple[Job, int]]) -> Op[set[UUID]]:
    """Write ``jobs`` (each a job and its version; a job at most once); the ids written (a job whose
    version is not newer than the one held is not)."""
    written: set[UUID] = set()
    for chunk in chunks(jobs, d.max_rows):
        items = [{"version": version, "job": job.model_dump(mode="json")} for job, version in chunk]
        rows = yield Call("jobkit_project", {"p_jobs": ("jsonb", items)}, columns=("id",))
        written |= {UUID(str(row["id"])) for row in rows}
    return written
