"""The job's own SQL functions in process: jobkit_enqueue, _enqueue_many, _claim, _complete, _progress,
_fail, _heartbeat, _release and _reclaim_expired, with the SQL's argument checks and per-call limits; and
jobkit_check_jobs' check of jobkit_enqueue_many's objects (``job_problem``), which a pipeline's jobs pass."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any
from uuid import UUID

from pgjobkit.core import fairness, transitions
from pgjobkit.core.failures import MAX_TRACEBACK_LENGTH
from pgjobkit.core.models import (
    MAX_ATTEMPTS_LIMIT,
    MAX_KEY_LENGTH,
    MAX_PAYLOAD_BYTES,
    MAX_PRIORITY,
    MAX_TYPE_LENGTH,
    RUN_AFTER_RANGE,
    Job,
    JobStatus,
    check_result,
)
from pgjobkit.errors import InvalidArgument
from pgjobkit.ops import MAX_ROWS
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


# --- jobkit_check_jobs ------------------------------------------------------------------------------------
JOB_KEYS = (
    "type",
    "payload",
    "idempotency_key",
    "priority",
    "max_attempts",
    "user_id",
    "run_after",
    "delay_seconds",
    "fair_key",
)
UUID_TEXT = re.compile(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}", re.IGNORECASE)
_CONTROL = re.compile(r"[\x01-\x1f\x7f-\x9f]")  # the SQL's ranges (C0, DEL, C1); text holds no NUL
MAX_DELAY_SECONDS = 315_576_000  # ten years


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _whole(value: float, low: int, high: int) -> bool:
    return low <= value <= high and value == int(value)


def _text(value: Any) -> bool:
    """A string of 1 to 200 characters."""
    return isinstance(value, str) and 1 <= len(value) <= MAX_KEY_LENGTH


def _instant(value: str) -> datetime | None:
    """An ISO 8601 time with its offset, or None."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def _readable(value: str) -> bool:
    """A time every client can read (the SQL check jobkit_run_after_between_1970_and_9999)."""
    instant = _instant(value)
    return instant is not None and RUN_AFTER_RANGE[0] <= instant < RUN_AFTER_RANGE[1]


def _field(name: str, test: Callable[[Any], object]) -> Callable[[dict[str, Any]], bool]:
    """A rule on one optional field: met when it is absent or null, or passes ``test``."""
    return lambda e: e.get(name) is None or bool(test(e[name]))


# Each rule, in the SQL's order, and what the SQL says when an object breaks it; a rule may rely on those
# before it holding.
_JOB_RULES: tuple[tuple[Callable[[dict[str, Any]], bool], str], ...] = (
    (lambda e: not e.keys() - set(JOB_KEYS), "has an unknown key; allowed: " + ", ".join(JOB_KEYS)),
    (lambda e: isinstance(e.get("type"), str), "type is required and must be a string"),
    (lambda e: 1 <= len(e["type"]) <= MAX_TYPE_LENGTH, "type must be 1 to 200 characters"),
    (lambda e: not _CONTROL.search(e["type"]), "type must not contain control characters"),
    (_field("payload", lambda v: isinstance(v, dict)), "payload must be a JSON object"),
    (_field("idempotency_key", lambda v: isinstance(v, str)), "idempotency_key must be a string or null"),
    (_field("idempotency_key", _text), "idempotency_key must be 1 to 200 characters"),
    (_field("priority", _number), "priority must be an integer"),
    (
        _field("priority", lambda v: _whole(v, -MAX_PRIORITY, MAX_PRIORITY)),
        "priority must be an integer between -1000000 and 1000000",
    ),
    (_field("max_attempts", _number), "max_attempts must be an integer"),
    (
        _field("max_attempts", lambda v: _whole(v, 1, MAX_ATTEMPTS_LIMIT)),
        "max_attempts must be an integer between 1 and 1000",
    ),
    (_field("user_id", lambda v: isinstance(v, str)), "user_id must be a uuid string or null"),
    (_field("user_id", UUID_TEXT.fullmatch), "user_id must be a uuid"),
    (
        _field("run_after", lambda v: isinstance(v, str) and _instant(v)),
        "run_after must be an ISO 8601 timestamp string",
    ),
    (
        _field("run_after", _readable),
        "run_after must be from 1970 to the end of 9998 (a time every client can read)",
    ),
    (_field("delay_seconds", _number), "delay_seconds must be a number"),
    (
        _field("delay_seconds", lambda v: 0 <= v <= MAX_DELAY_SECONDS),
        "delay_seconds must be between 0 and 315576000 (ten years)",
    ),
    (
        lambda e: e.get("run_after") is None or e.get("delay_seconds") is None,
        "give run_after or delay_seconds, not both",
    ),
    (
        lambda e: len(json.dumps(e.get("payload"), ensure_ascii=False).encode()) <= MAX_PAYLOAD_BYTES,
        "payload must be at most 1 MiB as JSON text",
    ),
    (_field("fair_key", lambda v: isinstance(v, str)), "fair_key must be a string or null"),
    (_field("fair_key", _text), "fair_key must be 1 to 200 characters"),
)


def job_problem(e: Any) -> str | None:
    """What jobkit_check_jobs finds wrong with one of jobkit_enqueue_many's objects, or None."""
    if not isinstance(e, dict):
        return "must be a JSON object"
    return next((problem for met, problem in _JOB_RULES if not met(e)), None)


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


def enqueue(state: State, now: datetime, woken: Woken, **args: Any) -> list[Row]:
    [(job, inserted)] = insert_all(state, now, woken, [{k.removeprefix("p_"): v for k, v in args.items()}])
    return [row_of(job, inserted=inserted)]


def enqueue_many(state: State, now: datetime, woken: Woken, p_jobs: list[Any]) -> list[Row]:
    if len(p_jobs) > transitions.BATCH_LIMIT:
        raise InvalidArgument(f"jobkit: p_jobs holds {len(p_jobs)} jobs; at most 10000 per call")
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
    transitions.check_types(p_types)
    transitions.check_worker(p_worker)
    lease = timedelta(seconds=p_lease_seconds)
    transitions.check_lease(lease)
    limit = transitions.check_limit(p_limit)
    rows: list[Row] = []
    if p_done_ids is not None or p_done_tokens is not None:
        check_pairs(p_done_ids or [], p_done_tokens or [], "p_done_ids", "p_done_tokens")
        check_results(p_done_results)
        for job_id, token in zip(p_done_ids or [], p_done_tokens or [], strict=True):
            if _complete_one(state, now, job_id, token, p_done_results, p_done_delete):
                rows.append(dict.fromkeys(Job.model_fields) | {"id": job_id, "status": "succeeded"})
        state.settle(now, woken, [row["id"] for row in rows])
    reclaim_expired(state, now, woken, MAX_ROWS)
    need = min(limit, 999, MAX_ROWS - len(rows))
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
            "(at most 1000)"
        )
    if any(not 0 <= f <= 1 for f in p_progress) or any(len(m or "") > 200 for m in p_messages):
        raise InvalidArgument("jobkit: p_progress must be between 0 and 1, p_messages at most 200 characters")
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
