"""The MemoryStore's state, the tables of the migration as Python values (``State``), and the helpers every
in-process SQL function shares. The store holds one State and runs every function on it under its lock."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from pgjobkit.core import transitions
from pgjobkit.core.fairness import fair_key
from pgjobkit.core.models import Job, JobStatus

Row = dict[str, Any]
Woken = list[Callable[[], None]]  # the listeners a function wakes: called once the store's lock is released
KEY_FREED = frozenset({JobStatus.DEAD, JobStatus.CANCELLED})  # statuses that free a job's key


def row_of(job: Job, **extra: Any) -> Row:
    return {**job.__dict__, **extra}


@dataclass
class State:
    """jobkit_jobs (``jobs``, with ``live_keys`` as its unique index of live idempotency keys),
    jobkit_limits, jobkit_starts (each type's start times) and jobkit_schedules (rows by name); and the
    ``listeners`` a wake-up calls."""

    jobs: dict[UUID, Job] = field(default_factory=dict)
    live_keys: dict[str, UUID] = field(default_factory=dict)
    limits: dict[str, Row] = field(default_factory=dict)
    starts: dict[str, list[datetime]] = field(default_factory=dict)
    schedules: dict[str, Row] = field(default_factory=dict)
    listeners: list[Callable[[], None]] = field(default_factory=list)

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
        """Delete a job, freeing its idempotency key."""
        job = self.jobs.pop(job_id)
        if job.idempotency_key is not None and self.live_keys.get(job.idempotency_key) == job_id:
            del self.live_keys[job.idempotency_key]

    def wake(self, woken: Woken) -> None:
        woken.extend(self.listeners)

    def insert(self, now: datetime, new: Mapping[str, Any], fair_round: int) -> tuple[Job, bool]:
        """A new job from one of jobkit_enqueue_many's objects, and True; or the live job that holds its
        idempotency key, and False."""
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
            status=JobStatus.QUEUED,
            payload=new.get("payload") or {},
            idempotency_key=key,
            attempts=0,
            max_attempts=new.get("max_attempts") or 3,
            priority=new.get("priority") or 0,
            run_after=run_after or now + timedelta(seconds=delay or 0),
            created_at=now,
            updated_at=now,
            fair_key=fair_key(new),
            fair_round=fair_round,
        )
        self.put(job)
        return job, True
