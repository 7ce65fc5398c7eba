"""The MemoryStore's state, the schema's tables as Python values (``State``; ``Node`` and ``Edge``
are a pipeline's rows), and the helpers every in-process SQL function shares: a job's insert, and
``settle``, what an ending does to the jobs that wait for it. The store holds one State and runs every
function on it under its lock."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from pgjobkit.core import transitions
from pgjobkit.core.bounds import DEFAULT_MAX_ATTEMPTS, MAX_ERROR_LENGTH
from pgjobkit.core.fairness import base_turn, fair_key
from pgjobkit.core.models import FINISHED, Job, JobStatus

Row = dict[str, Any]
Woken = list[Callable[[], None]]  # the listeners a function wakes: called once the store's lock is released
KEY_FREED = frozenset({JobStatus.DEAD, JobStatus.CANCELLED})  # statuses that free a job's key


def row_of(job: Job, **extra: Any) -> Row:
    return {**job.__dict__, **extra}


@dataclass
class Node:
    """A row of jobkit_pipeline_jobs: a job's pipeline, its owner, the job whose completion added it, how
    many of the jobs it waits for have not ended, and the order it was added in."""

    pipeline_id: UUID
    user_id: UUID | None
    parent_id: UUID | None
    waiting_for: int
    seq: int
    created_at: datetime


@dataclass
class Edge:
    """A row of jobkit_dependencies: job ``job_id`` waits for ``depends_on`` (its ``position``-th), and
    how that one ended (``outcome``, None until it did)."""

    job_id: UUID
    position: int
    depends_on: UUID
    on_failure: str
    user_id: UUID | None
    outcome: JobStatus | None = None


@dataclass
class State:
    """jobkit_jobs (``jobs``, with ``live_keys`` as its unique index of live idempotency keys),
    jobkit_limits, jobkit_starts (each type's start times), jobkit_schedules (rows by name),
    jobkit_pipeline_jobs (``pipeline_jobs`` by job id, ``seq`` its identity's last value) and
    jobkit_dependencies (``dependencies`` by waiting job, in position order); and the ``listeners`` a
    wake-up calls."""

    jobs: dict[UUID, Job] = field(default_factory=dict)
    live_keys: dict[str, UUID] = field(default_factory=dict)
    limits: dict[str, Row] = field(default_factory=dict)
    starts: dict[str, list[datetime]] = field(default_factory=dict)
    schedules: dict[str, Row] = field(default_factory=dict)
    pipeline_jobs: dict[UUID, Node] = field(default_factory=dict)
    dependencies: dict[UUID, list[Edge]] = field(default_factory=dict)
    waiters: dict[UUID, list[Edge]] = field(default_factory=dict)  # the same rows by depends_on (its index)
    seq: int = 0
    listeners: list[Callable[[], None]] = field(default_factory=list)
    workers: dict[str, Row] = field(default_factory=dict)  # jobkit_workers, by name
    activity: dict[tuple[datetime, str, str], Row] = field(default_factory=dict)  # by (minute, type, outcome)
    traces: dict[UUID, tuple[dict[str, str], datetime]] = field(default_factory=dict)  # jobkit_traces
    tracebacks: dict[UUID, Row] = field(default_factory=dict)  # jobkit_tracebacks, by job id

    def put(self, job: Job) -> None:
        """Write a job, keeping ``live_keys`` in step."""
        old = self.jobs.get(job.id)
        if old is not None and old.idempotency_key is not None and old.status not in KEY_FREED:
            self.live_keys.pop(old.idempotency_key, None)
        self.jobs[job.id] = job
        if job.idempotency_key is not None and job.status not in KEY_FREED:
            self.live_keys[job.idempotency_key] = job.id

    def apply(self, outcome: transitions.Transition) -> Job | None:
        """Write an applied transition's job and return it; None when the lease was lost."""
        if isinstance(outcome, transitions.Applied):
            self.put(outcome.job)
            return outcome.job
        return None

    def drop(self, job_id: UUID) -> None:
        """Delete a job, freeing its idempotency key, with its pipeline row and what it waited for."""
        job = self.jobs.pop(job_id)
        if job.idempotency_key is not None and self.live_keys.get(job.idempotency_key) == job_id:
            del self.live_keys[job.idempotency_key]
        self.pipeline_jobs.pop(job_id, None)
        for edge in self.dependencies.pop(job_id, []):
            self.waiters[edge.depends_on].remove(edge)

    def needed(self, job_id: UUID) -> bool:
        """Whether a job not yet finished waits for ``job_id`` (its result is still to be handed on)."""
        return any(self.jobs[e.job_id].status not in FINISHED for e in self.waiters.get(job_id, ()))

    def add_edge(self, edge: Edge) -> None:
        """Write a jobkit_dependencies row, keeping ``waiters`` in step."""
        self.dependencies.setdefault(edge.job_id, []).append(edge)
        self.waiters.setdefault(edge.depends_on, []).append(edge)

    def add_node(
        self,
        now: datetime,
        job_id: UUID,
        pipeline_id: UUID,
        user_id: UUID | None,
        parent_id: UUID | None,
        waiting_for: int,
    ) -> None:
        """Put a job in a pipeline, after every job added to one before it."""
        self.seq += 1
        self.pipeline_jobs[job_id] = Node(pipeline_id, user_id, parent_id, waiting_for, self.seq, now)

    def wake(self, woken: Woken) -> None:
        woken.extend(self.listeners)

    def insert(self, now: datetime, new: Mapping[str, Any], fair_round: int) -> tuple[Job, bool]:
        """A new job from one of jobkit_enqueue_many's objects (waiting, with ``"waiting": True``), and
        True; or the live job that holds its idempotency key, and False."""
        key = new.get("idempotency_key")
        held = self.live_keys.get(key) if key is not None else None
        if held is not None:
            return self.jobs[held], False
        run_after = new.get("run_after")
        if isinstance(run_after, str):
            run_after = datetime.fromisoformat(run_after)
        delay = new.get("delay_seconds")
        user_id = new.get("user_id")
        job = Job(
            id=uuid.uuid4(),
            user_id=UUID(user_id) if isinstance(user_id, str) else user_id,
            type=new["type"],
            status=JobStatus.WAITING if new.get("waiting") else JobStatus.QUEUED,
            payload=new.get("payload") or {},
            idempotency_key=key,
            attempts=0,
            max_attempts=new.get("max_attempts") or DEFAULT_MAX_ATTEMPTS,
            priority=new.get("priority") or 0,
            run_after=run_after or now + timedelta(seconds=delay or 0),
            created_at=now,
            updated_at=now,
            fair_key=fair_key(new),
            fair_round=fair_round,
        )
        self.put(job)
        if isinstance(new.get("trace_context"), dict):
            self.traces[job.id] = (new["trace_context"], now)
        return job, True

    def settle(self, now: datetime, woken: Woken, ended: Iterable[UUID]) -> None:
        """jobkit_private.release_waiters: the jobs that wait for ``ended``, after these ended (one that has
        not is passed over). Each open edge on them takes its job's status as its outcome and counts its
        waiting job down; a job waiting with such an edge that did not succeed and says on_failure 'cancel'
        is cancelled, and settled in turn; one that waits for nothing more is queued, with the turn a job
        enqueued now takes."""
        todo = set(ended)
        while todo:
            counts: Counter[UUID] = Counter()
            whys: dict[UUID, tuple[int, str]] = {}  # the first reason, by position, to cancel each job
            for edge in (e for t in todo for e in self.waiters.get(t, ())):
                job = self.jobs.get(edge.depends_on)
                if edge.outcome is None and job is not None and job.status in FINISHED:
                    edge.outcome = job.status
                    counts[edge.job_id] += 1
                    if edge.on_failure == "cancel" and job.status != JobStatus.SUCCEEDED:
                        why = (edge.position, f"job {job.id}, which it waits for, ended {job.status}")
                        whys[edge.job_id] = min(whys.get(edge.job_id, why), why)
            counted = [
                (self.jobs[i], node) for i in counts if (node := self.pipeline_jobs.get(i)) is not None
            ]
            for job, node in counted:
                node.waiting_for = max(node.waiting_for - counts[job.id], 0)
            free = [
                j
                for j, node in counted
                if j.id not in whys and not node.waiting_for and j.status == JobStatus.WAITING
            ]
            turns = [base_turn(self.jobs.values(), now, j.type, j.priority, j.fair_key) for j in free]
            for job, turn in zip(free, turns, strict=True):
                run_after = max(job.run_after, now)
                self.put(
                    job.model_copy(
                        update={
                            "status": JobStatus.QUEUED,
                            "run_after": run_after,
                            "updated_at": now,
                            "fair_round": turn,
                        }
                    )
                )
            if free:
                self.wake(woken)
            todo = set()
            for job, _ in counted:
                if job.id in whys and job.status == JobStatus.WAITING:
                    error = f"jobkit: cancelled: {whys[job.id][1]}"[:MAX_ERROR_LENGTH]
                    self.put(
                        job.model_copy(
                            update={"status": JobStatus.CANCELLED, "error": error, "updated_at": now}
                        )
                    )
                    todo.add(job.id)
