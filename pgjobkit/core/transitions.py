"""The pure core: jobkit's transitions and backoff. ``now`` is always a parameter; no clock, no I/O.

Each transition takes a Job and returns an outcome value; the store applies it. The SQL functions in
pgjobkit/sql/schema/ implement the same rules, and tests/contract/ proves the two agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from pgjobkit.core.bounds import BATCH_LIMIT as BATCH_LIMIT  # re-exported: written in bounds
from pgjobkit.core.bounds import CLAIM_LIMIT_CAP as CLAIM_LIMIT_CAP  # re-exported: written in bounds
from pgjobkit.core.bounds import MAX_ATTEMPTS_LIMIT, MAX_ERROR_LENGTH, MAX_LEASE, MAX_WORKER_LENGTH
from pgjobkit.core.bounds import MAX_RETRY_DELAY as MAX_RETRY_DELAY  # re-exported: written in bounds
from pgjobkit.core.models import FINISHED, RUNNABLE, Job, JobStatus
from pgjobkit.errors import InvalidArgument


@dataclass(frozen=True)
class Applied:
    """The transition happened; the store writes ``job``."""

    job: Job


@dataclass(frozen=True)
class LeaseLost:
    """The caller no longer holds the job's lease (or the job is gone); nothing changes."""

    job_id: UUID


Transition = Applied | LeaseLost


# --- argument checks, the same ones the SQL functions make --------------------------------------
def check_lease(lease: timedelta, name: str = "lease") -> None:
    """A lease must be positive and at most a day."""
    if not timedelta(0) < lease <= MAX_LEASE:
        raise InvalidArgument(
            f"jobkit: {name} must be > 0 and <= {MAX_LEASE.total_seconds():.0f} seconds "
            f"(got {lease.total_seconds()})"
        )


def check_limit(limit: int, name: str = "limit") -> int:
    """A claim limit must be >= 1; above CLAIM_LIMIT_CAP it is clamped to it."""
    if limit < 1:
        raise InvalidArgument(f"jobkit: {name} must be >= 1 (got {limit})")
    return min(limit, CLAIM_LIMIT_CAP)


def check_prune(older_than_seconds: float, statuses: Sequence[str], limit: int) -> tuple[timedelta, set[str]]:
    """A prune's arguments checked as jobkit_prune checks them: its horizon and its statuses (a non-empty
    subset of the finished ones), and a limit of 1 to BATCH_LIMIT."""
    chosen = {str(s) for s in statuses}
    if older_than_seconds < 0:
        raise InvalidArgument("jobkit: p_older_than_seconds must be >= 0")
    if not chosen or not chosen <= FINISHED:
        raise InvalidArgument("jobkit: p_statuses must be a non-empty subset of {succeeded, dead, cancelled}")
    if not 1 <= limit <= BATCH_LIMIT:
        raise InvalidArgument(f"jobkit: p_limit must be between 1 and {BATCH_LIMIT}")
    return timedelta(seconds=older_than_seconds), chosen


def check_types(types: Sequence[str]) -> None:
    if not types or any(not t for t in types):
        raise InvalidArgument("jobkit: types must be a non-empty list of job types without empty strings")


def check_worker(worker: str) -> None:
    if not 1 <= len(worker) <= MAX_WORKER_LENGTH:
        raise InvalidArgument(f"jobkit: worker must be a worker name of 1 to {MAX_WORKER_LENGTH} characters")


def check_claim(types: Sequence[str], worker: str, lease_seconds: float, limit: int) -> tuple[timedelta, int]:
    """A claim's arguments checked as jobkit_claim checks them: its lease, and its limit clamped."""
    check_types(types)
    check_worker(worker)
    lease = timedelta(seconds=lease_seconds)
    check_lease(lease)
    return lease, check_limit(limit)


def check_retry_delay(delay: timedelta) -> None:
    if not timedelta(0) <= delay <= MAX_RETRY_DELAY:
        raise InvalidArgument(
            f"jobkit: retry delay must be between 0 and {MAX_RETRY_DELAY.total_seconds():.0f} seconds "
            f"(got {delay.total_seconds()})"
        )


def check_max_attempts(max_attempts: int, name: str = "max_attempts") -> None:
    if not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT:
        raise InvalidArgument(
            f"jobkit: {name} must be between 1 and {MAX_ATTEMPTS_LIMIT} (got {max_attempts})"
        )


# --- transitions -----------------------------------------------------------------------------------
def is_runnable(job: Job, now: datetime) -> bool:
    """The one definition of runnable: queued or retrying, and run_after has come."""
    return job.status in RUNNABLE and job.run_after <= now


def claim_order(job: Job) -> tuple[int, int, datetime, datetime]:
    """Sort key of a claim: highest priority first, then the earliest fairness turn, then oldest run_after,
    then oldest created_at."""
    return (-job.priority, job.fair_round, job.run_after, job.created_at)


def holds_lease(job: Job | None, token: UUID) -> bool:
    return job is not None and job.status == JobStatus.RUNNING and job.lease_token == token


def claim(job: Job, *, now: datetime, worker: str, lease: timedelta, token: UUID) -> Job:
    """A runnable job becomes running for ``worker`` until ``now + lease``."""
    if not is_runnable(job, now):
        raise ValueError(f"job {job.id} is not runnable")
    return job.model_copy(
        update={
            "status": JobStatus.RUNNING,
            "attempts": job.attempts + 1,
            "lease_until": now + lease,
            "lease_token": token,
            "claimed_by": worker,
            "updated_at": now,
            "started_at": now,
            "progress": None,
            "progress_message": None,
        }
    )


def complete(job: Job | None, token: UUID, *, now: datetime, job_id: UUID, result: Any = None) -> Transition:
    """running → succeeded with ``result`` (progress 1), fenced by the lease token."""
    if job is None or not holds_lease(job, token):
        return LeaseLost(job_id)
    return Applied(
        job.model_copy(
            update={
                "status": JobStatus.SUCCEEDED,
                "lease_until": None,
                "lease_token": None,
                "updated_at": now,
                "progress": 1.0,
                "result": result,
            }
        )
    )


def progress(
    job: Job | None, token: UUID, *, now: datetime, job_id: UUID, fraction: float, message: str | None
) -> Transition:
    """A running handler's report: ``fraction`` done (0 to 1) and a short message, fenced."""
    if job is None or not holds_lease(job, token):
        return LeaseLost(job_id)
    return Applied(
        job.model_copy(update={"progress": fraction, "progress_message": message, "updated_at": now})
    )


def fail(
    job: Job | None,
    token: UUID,
    *,
    now: datetime,
    job_id: UUID,
    error: str,
    retry_delay: timedelta,
    permanent: bool = False,
    max_attempts: int | None = None,
) -> Transition:
    """running → retrying (run_after = now + retry_delay), or dead when attempts are used up or permanent.
    ``max_attempts`` (its handler's), when given, is the job's attempts in place of its own, and is kept as
    its own (so that a later reclaim honours it), never below the attempts made: a job past it ends dead."""
    check_retry_delay(retry_delay)
    if max_attempts is not None:
        check_max_attempts(max_attempts)
    if job is None or not holds_lease(job, token):
        return LeaseLost(job_id)
    allowed = job.max_attempts if max_attempts is None else max_attempts
    dead = permanent or job.attempts >= allowed
    return Applied(
        job.model_copy(
            update={
                "status": JobStatus.DEAD if dead else JobStatus.RETRYING,
                "run_after": job.run_after if dead else now + retry_delay,
                "max_attempts": max(allowed, job.attempts),
                "lease_until": None,
                "lease_token": None,
                "error": (error or "failed (no error text)")[:MAX_ERROR_LENGTH],
                "updated_at": now,
            }
        )
    )


def heartbeat(job: Job | None, token: UUID, *, now: datetime, job_id: UUID, lease: timedelta) -> Transition:
    """A beat: extend the lease to ``now + lease`` when less than two thirds of it is left, fenced."""
    check_lease(lease)
    if job is None or not holds_lease(job, token):
        return LeaseLost(job_id)
    assert job.lease_until is not None
    if job.lease_until >= now + lease * 2 / 3:
        return Applied(job)
    return Applied(job.model_copy(update={"lease_until": now + lease, "updated_at": now}))


def cancel(job: Job, *, now: datetime, reason: str | None = None) -> Job | None:
    """waiting, queued, retrying or running → cancelled (a running job's lease ends); None for a finished
    job."""
    if job.status not in (JobStatus.WAITING, JobStatus.QUEUED, JobStatus.RETRYING, JobStatus.RUNNING):
        return None
    return job.model_copy(
        update={
            "status": JobStatus.CANCELLED,
            "lease_until": None,
            "lease_token": None,
            "error": (reason or "cancelled")[:MAX_ERROR_LENGTH],
            "updated_at": now,
        }
    )


def release(job: Job | None, token: UUID, *, now: datetime, job_id: UUID) -> Transition:
    """Give a claimed job back unrun (worker shutdown): the attempt is not counted, runnable at once."""
    if job is None or not holds_lease(job, token):
        return LeaseLost(job_id)
    attempts = job.attempts - 1
    return Applied(
        job.model_copy(
            update={
                "status": JobStatus.RETRYING if attempts > 0 else JobStatus.QUEUED,
                "attempts": attempts,
                "run_after": now,
                "lease_until": None,
                "lease_token": None,
                "updated_at": now,
            }
        )
    )


def is_expired(job: Job, now: datetime) -> bool:
    return job.status == JobStatus.RUNNING and job.lease_until is not None and job.lease_until <= now


def reclaim(job: Job, *, now: datetime) -> Job:
    """An expired lease: retrying at once, or dead when the attempts are used up."""
    if not is_expired(job, now):
        raise ValueError(f"job {job.id} does not hold an expired lease")
    dead = job.attempts >= job.max_attempts
    return job.model_copy(
        update={
            "status": JobStatus.DEAD if dead else JobStatus.RETRYING,
            "run_after": now,
            "lease_until": None,
            "lease_token": None,
            "error": f"lease expired on attempt {job.attempts} (its worker stopped or was too slow)",
            "updated_at": now,
        }
    )


def requeue(job: Job, *, now: datetime) -> Job:
    """dead → queued with fresh attempts (an operator's decision)."""
    if job.status != JobStatus.DEAD:
        raise ValueError(f"job {job.id} is not dead")
    return job.model_copy(
        update={
            "status": JobStatus.QUEUED,
            "attempts": 0,
            "run_after": now,
            "claimed_by": None,
            "updated_at": now,
        }
    )


# --- backoff ---------------------------------------------------------------------------------------
def backoff(
    attempt: int,
    *,
    base: float = 1.0,
    cap: float = 300.0,
    jitter: float = 0.0,
    random: Callable[[], float] | None = None,
) -> timedelta:
    """Delay before retrying after failed ``attempt`` (1-based): base·2^(attempt-1), capped at ``cap``.

    With ``jitter`` j in [0, 1] the delay is scaled by a factor in [1 - j, 1 + j] (still capped), drawn
    from ``random`` (a function returning [0, 1)); a seeded source gives fixed values. Core owns no
    randomness: the worker passes its own source.
    """
    if attempt < 1:
        raise InvalidArgument(f"jobkit: attempt must be >= 1 (got {attempt})")
    if base <= 0 or cap <= 0:
        raise InvalidArgument("jobkit: backoff base and cap must be > 0")
    if not 0.0 <= jitter <= 1.0:
        raise InvalidArgument(f"jobkit: jitter must be between 0 and 1 (got {jitter})")
    exponent = min(attempt - 1, 64)  # 2**64 s is far past any cap; avoids float overflow
    delay = min(cap, base * math.pow(2, exponent))
    if jitter:
        if random is None:
            raise InvalidArgument("jobkit: jitter needs a random source (e.g. random.Random().random)")
        delay = min(cap, delay * (1 - jitter + 2 * jitter * random()))
    return timedelta(seconds=delay)
