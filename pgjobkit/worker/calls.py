# WARNING: this file is generated from pgjobkit/worker/calls_async.py by tools/async_to_sync.py: DO NOT CHANGE.
# Change pgjobkit/worker/calls_async.py and run `python tools/async_to_sync.py`.
"""The calls a worker makes on a store for its jobs (its protocol, apart from the app's ``JobStore``):
claim, complete, fail, heartbeat, progress, release, reclaim expired leases, fire schedules. Each runs one
operation of ``pgjobkit.ops`` through the store's ``run``. ``AsyncWorkerCalls`` in ``calls_async`` is the
source; ``WorkerCalls`` in ``calls`` is generated from it by tools/async_to_sync.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from pgjobkit.core.models import FailResult, Job, LeaseState, Reclaimed
from pgjobkit.core.pipelines import DependencyResult, Pipeline, PipelineEnqueued
from pgjobkit.core.schedules import Fired
from pgjobkit.ops import admin as admin_ops
from pgjobkit.ops import jobs as job_ops
from pgjobkit.ops import pipelines as pipeline_ops
from pgjobkit.ops import schedules as schedule_ops
from pgjobkit.stores.base import JobStore


class WorkerCalls:
    """A worker's calls on ``store``: each fenced by the lease token its claim handed out."""

    def __init__(self, store: JobStore) -> None:
        self.store = store

    def claim(
        self, types: Sequence[str], worker: str, lease: timedelta, limit: int = 1, after: UUID | None = None
    ) -> list[Job]:
        """Lease up to ``limit`` (clamped to 999) runnable ``types`` jobs; reclaims expired leases first.
        ``after``, the last job this caller claimed: look from its place first (see jobkit_claim's p_after)."""
        return self.store.run(job_ops.claim(self.store.dialect, types, worker, lease, limit, after))

    def complete(self, job_id: UUID, lease_token: UUID, result: Any = None) -> bool:
        """Mark succeeded, keeping ``result`` (JSON, see ``models.check_result``); False when the lease was
        lost (nothing changed)."""
        return self.store.run(job_ops.complete(self.store.dialect, job_id, lease_token, result))

    def complete_adding(
        self,
        job_id: UUID,
        lease_token: UUID,
        result: Any,
        pipeline: Pipeline,
        trace_context: dict[str, str] | None = None,
    ) -> tuple[bool, PipelineEnqueued]:
        """``complete``, adding ``pipeline``'s jobs to the job's pipeline in the same transaction (a job in
        none starts one, named by its id): they exist once it has completed, and not unless it did. Jobs
        that bring no trace context of their own take ``trace_context``."""
        return self.store.run(
            pipeline_ops.complete_adding(
                self.store.dialect, job_id, lease_token, result, pipeline, trace_context
            )
        )

    def dependencies(self, job_id: UUID) -> list[DependencyResult]:
        """What the job waits for, in its order, with results."""
        return self.store.run(pipeline_ops.list_dependencies(self.store.dialect, job_id))

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
        return self.store.run(job_ops.complete_many(self.store.dialect, done, results, delete))

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
        after: UUID | None = None,
    ) -> tuple[Mapping[UUID, bool], list[Job]]:
        """``complete_many(done)`` then ``claim(...)``: one round trip and one commit where they fit."""
        return self.store.run(
            job_ops.complete_and_claim(
                self.store.dialect, done, types, worker, lease, limit, results, delete, after
            )
        )

    def progress(self, reports: Sequence[tuple[UUID, UUID, float, str | None]]) -> Mapping[UUID, bool]:
        """Record running jobs' progress, (job_id, lease_token, fraction 0 to 1, message); fenced."""
        return self.store.run(job_ops.progress(self.store.dialect, reports))

    def fail(
        self,
        job_id: UUID,
        lease_token: UUID,
        error: str,
        retry_delay: timedelta,
        permanent: bool = False,
        *,
        max_attempts: int | None = None,
        traceback: str | None = None,
    ) -> FailResult:
        """Retrying after ``retry_delay``, or dead (attempts used up, or permanent). ``max_attempts``, the
        handler's, decides in place of the job's own and is kept on the job (never below its attempts);
        ``traceback`` is kept for operators (its end, at most 8,000 characters; any text)."""
        return self.store.run(
            job_ops.fail(
                self.store.dialect,
                job_id,
                lease_token,
                error,
                retry_delay,
                permanent,
                max_attempts,
                traceback,
            )
        )

    def heartbeat(self, held: Sequence[tuple[UUID, UUID]], lease: timedelta) -> Mapping[UUID, LeaseState]:
        """For each (job_id, lease_token) held: still held (lease extended to ``lease`` once a third of it
        has passed), or lost, with the job's status (cancelled, reclaimed, ...)."""
        return self.store.run(job_ops.heartbeat(self.store.dialect, held, lease))

    def release(self, job_id: UUID, lease_token: UUID) -> bool:
        """Give a claimed job back unrun (the attempt is not counted); False when the lease was lost."""
        return self.store.run(job_ops.release(self.store.dialect, job_id, lease_token))

    def reclaim_expired(self, limit: int = 1000) -> list[Reclaimed]:
        """Running jobs whose lease expired -> retrying, or dead when attempts are used up."""
        return self.store.run(admin_ops.reclaim_expired(self.store.dialect, limit))

    def fire_schedule(self, name: str, last_due_at: datetime, due: Sequence[datetime]) -> Fired:
        """Enqueue ``name``'s jobs for ``due`` if its last due time is still ``last_due_at`` (see Scheduler)."""
        return self.store.run(schedule_ops.fire_schedule(self.store.dialect, name, last_due_at, due))
