"""The job's own SQL functions in process: jobkit_enqueue, _enqueue_many, _claim, _complete, _progress,
_fail, _heartbeat, _release and _reclaim_expired, with the SQL's argument checks and per-call limits. A job
to enqueue meets jobkit_check_jobs' rules (``core.job_rules``), as a pipeline's jobs do."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any
from uuid import UUID

from pgjobkit.core import fairness, transitions
from pgjobkit.core.bounds import (
    BATCH_LIMIT,
    CLAIM_LIMIT_CAP,
    MAX_PROGRESS_MESSAGE,
    MAX_ROWS,
    MAX_TRACEBACK_LENGTH,
)
from pgjobkit.core.job_rules import job_problem
from pgjobkit.core.models import Job, JobStatus, check_result
from pgjobkit.errors import InvalidArgument
from pgjobkit.stores.memory.state import Row, State, Woken, row_of


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


# --- jobkit_check_jobs: the rules are core.job_rules' ----------------------------------------------------
def bad_job(idx: int, problem: str) -> InvalidArgument:
    """A problem with element ``idx`` of a call's jobs, worded as the SQL words it."""
    return InvalidArgument(f"jobkit: job {idx}: {problem}")


def check_each(items: Sequence[Any], problem: Callable[[Any], str | None]) -> None:
    """Raise the first problem ``problem`` finds among ``items``, by index (nothing is written)."""
    for idx, item in enumerate(items):
        found = problem(item)
        if found is not None:
            raise bad_job(idx, found)


# --- enqueue --------------------------------------------------------------------------------------------
def insert_all(
    state: State, now: datetime, woken: Woken, jobs: Sequence[Mapping[str, Any]]
) -> list[tuple[Job, bool]]:
    """Insert ``jobs`` (jobkit_enqueue_many's objects) with their turns, all numbered before the first
    insert; wake the listeners when one inserted is runnable now."""
    turns = fairness.turns(jobs, partial(fairness.base_turn, state.jobs.values(), now))
    out = [state.insert(now, new, turn) for new, turn in zip(jobs, turns, strict=True)]
    if any(inserted and job.status == JobStatus.QUEUED and job.run_after <= now for job, inserted in out):
        state.wake(woken)
    return out


def _as_json(value: Any) -> Any:
    """A typed argument as jobkit_enqueue passes it to jobkit_check_jobs (jsonb_build_object)."""
    if isinstance(value, UUID):
        return str(value)
    return value.isoformat() if isinstance(value, datetime) else value


def enqueue(state: State, now: datetime, woken: Woken, **args: Any) -> list[Row]:
    new = {k.removeprefix("p_"): _as_json(v) for k, v in args.items()}
    problem = job_problem(new)
    if problem is not None:
        raise InvalidArgument(f"jobkit: {problem}")
    [(job, inserted)] = insert_all(state, now, woken, [new])
    return [row_of(job, inserted=inserted)]


def enqueue_many(state: State, now: datetime, woken: Woken, p_jobs: Any) -> list[Row]:
    if not isinstance(p_jobs, list | tuple):
        raise InvalidArgument("jobkit: p_jobs must be a JSON array of job objects")
    if len(p_jobs) > BATCH_LIMIT:
        raise InvalidArgument(f"jobkit: p_jobs holds {len(p_jobs)} jobs; at most {BATCH_LIMIT} per call")
    check_each(p_jobs, job_problem)
    out = insert_all(state, now, woken, p_jobs)
    return [row_of(job, ord=n, inserted=inserted) for n, (job, inserted) in enumerate(out, 1)]


# --- claim and complete -----------------------------------------------------------------------------------
def claim(
    state: State,
    now: datetime,
    woken: Woken,
    p_types: tuple[str, ...],
    p_worker: str,
    p_lease_seconds: float,
    p_limit: int,
    p_done_ids: list[UUID] | None = None,
    p_done_tokens: list[UUID] | None = None,
    p_done_results: dict[str, Any] | None = None,
    p_done_delete: bool = False,
    p_after: UUID | None = None,
) -> list[Row]:
    lease, limit = transitions.check_claim(p_types, p_worker, p_lease_seconds, p_limit)
    rows: list[Row] = []
    if p_done_ids is not None or p_done_tokens is not None:
        check_pairs(p_done_ids or [], p_done_tokens or [], "p_done_ids", "p_done_tokens")
        check_results(p_done_results)
        for job_id, token in zip(p_done_ids or [], p_done_tokens or [], strict=True):
            if _complete_one(state, now, job_id, token, p_done_results, p_done_delete):
                rows.append(dict.fromkeys(Job.model_fields) | {"id": job_id, "status": "succeeded"})
        state.settle(now, woken, [row["id"] for row in rows])
    reclaim_expired(state, now, woken, MAX_ROWS)
    need = min(limit, CLAIM_LIMIT_CAP, MAX_ROWS - len(rows))
    if need < 1:
        return rows
    picked = fairness.pick(
        types=p_types,
        limit=need,
        candidates=[j for j in state.jobs.values() if transitions.is_runnable(j, now)],
        running=[j for j in state.jobs.values() if j.status == JobStatus.RUNNING],
        limits=state.limits,
        starts=state.starts,
        now=now,
        after=state.jobs.get(p_after) if p_after is not None else None,
    )
    state.starts.update(picked.starts)
    for job in picked.jobs:
        claimed = transitions.claim(job, now=now, worker=p_worker, lease=lease, token=uuid.uuid4())
        state.put(claimed)
        rows.append(row_of(claimed))
    return rows


def complete(
    state: State,
    now: datetime,
    woken: Woken,
    p_ids: list[UUID],
    p_lease_tokens: list[UUID],
    p_results: dict[str, Any] | None = None,
    p_delete: bool = False,
) -> list[Row]:
    check_pairs(p_ids, p_lease_tokens, "p_ids", "p_lease_tokens")
    check_results(p_results)
    rows: list[Row] = [
        {"id": job_id, "ok": _complete_one(state, now, job_id, token, p_results, p_delete)}
        for job_id, token in zip(p_ids, p_lease_tokens, strict=True)
    ]
    state.settle(now, woken, [row["id"] for row in rows if row["ok"]])
    return rows


def _complete_one(
    state: State, now: datetime, job_id: UUID, token: UUID, results: dict[str, Any] | None, delete: bool
) -> bool:
    """jobkit_complete for one job: False when its lease was lost. With ``delete`` a job without an owner
    or a pipeline, that nothing waits for, is deleted rather than kept."""
    result = (results or {}).get(str(job_id))
    job = state.apply(
        transitions.complete(state.jobs.get(job_id), token, now=now, job_id=job_id, result=result)
    )
    if (
        job is not None
        and delete
        and job.user_id is None
        and job_id not in state.pipeline_jobs
        and not any(e.outcome is None for e in state.waiters.get(job_id, ()))
    ):
        state.drop(job_id)
    return job is not None


# --- the running job's other calls --------------------------------------------------------------------------
def progress(
    state: State,
    now: datetime,
    woken: Woken,
    p_ids: list[UUID],
    p_lease_tokens: list[UUID],
    p_progress: list[float],
    p_messages: list[str | None],
) -> list[Row]:
    if not len(p_ids) == len(p_lease_tokens) == len(p_progress) == len(p_messages) or len(p_ids) > MAX_ROWS:
        raise InvalidArgument(
            "jobkit: p_ids, p_lease_tokens, p_progress and p_messages must be arrays of equal length "
            f"(at most {MAX_ROWS})"
        )
    if any(not 0 <= f <= 1 for f in p_progress) or any(
        len(m or "") > MAX_PROGRESS_MESSAGE for m in p_messages
    ):
        raise InvalidArgument(
            f"jobkit: p_progress must be between 0 and 1, p_messages at most {MAX_PROGRESS_MESSAGE} characters"
        )
    rows = []
    for job_id, token, fraction, message in zip(p_ids, p_lease_tokens, p_progress, p_messages, strict=True):
        outcome = transitions.progress(
            state.jobs.get(job_id), token, now=now, job_id=job_id, fraction=fraction, message=message
        )
        rows.append({"id": job_id, "ok": state.apply(outcome) is not None})
    return rows


def fail(
    state: State,
    now: datetime,
    woken: Woken,
    p_id: UUID,
    p_lease_token: UUID,
    p_error: str,
    p_retry_delay_seconds: float,
    p_permanent: bool,
    p_max_attempts: int | None = None,
    p_traceback: str | None = None,
) -> list[Row]:
    outcome = transitions.fail(
        state.jobs.get(p_id),
        p_lease_token,
        now=now,
        job_id=p_id,
        error=p_error,
        retry_delay=timedelta(seconds=p_retry_delay_seconds),
        permanent=p_permanent,
        max_attempts=p_max_attempts,
    )
    job = state.apply(outcome)
    if job is None:
        return [{"id": p_id, "ok": False, "status": None, "attempts": None, "run_after": None}]
    if p_traceback is not None:  # jobkit_tracebacks: the latest attempt's, its end
        state.tracebacks[p_id] = {
            "attempt": job.attempts,
            "traceback": p_traceback[-MAX_TRACEBACK_LENGTH:],
            "failed_at": now,
        }
    if job.status == JobStatus.DEAD:
        state.settle(now, woken, [p_id])
    return [
        {"id": p_id, "ok": True, "status": job.status, "attempts": job.attempts, "run_after": job.run_after}
    ]


def heartbeat(
    state: State,
    now: datetime,
    woken: Woken,
    p_ids: list[UUID],
    p_lease_tokens: list[UUID],
    p_lease_seconds: float,
) -> list[Row]:
    check_pairs(p_ids, p_lease_tokens, "p_ids", "p_lease_tokens")
    lease = timedelta(seconds=p_lease_seconds)
    rows = []
    for job_id, token in zip(p_ids, p_lease_tokens, strict=True):
        job = state.jobs.get(job_id)
        kept = state.apply(transitions.heartbeat(job, token, now=now, job_id=job_id, lease=lease))
        rows.append(
            {
                "id": job_id,
                "held": kept is not None,
                "status": job.status if job is not None else None,
                "lease_until": kept.lease_until if kept is not None else None,
            }
        )
    return rows


def release(state: State, now: datetime, woken: Woken, p_id: UUID, p_lease_token: UUID) -> list[Row]:
    job = state.apply(transitions.release(state.jobs.get(p_id), p_lease_token, now=now, job_id=p_id))
    if job is not None:
        state.wake(woken)
    return [{"id": p_id, "ok": job is not None}]


def reclaim_expired(state: State, now: datetime, woken: Woken, p_limit: int) -> list[Row]:
    if p_limit < 1:
        raise InvalidArgument(f"jobkit: p_limit must be >= 1 (got {p_limit})")
    expired = sorted(
        (j for j in state.jobs.values() if transitions.is_expired(j, now)),
        key=lambda j: j.lease_until or now,
    )[: min(p_limit, MAX_ROWS)]
    out: list[Row] = []
    for job in expired:
        new = transitions.reclaim(job, now=now)
        state.put(new)
        out.append({"id": new.id, "status": new.status, "attempts": new.attempts})
    state.settle(now, woken, [row["id"] for row in out if row["status"] == JobStatus.DEAD])
    return out
