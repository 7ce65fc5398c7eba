"""The job's own operations, as values: enqueue, claim, complete, fail (and the traceback a failure left),
heartbeat, progress, release."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any
from uuid import UUID

from pydantic import ValidationError

from pgjobkit.core.bounds import BATCH_LIMIT, CLAIM_LIMIT_CAP, DEFAULT_MAX_ATTEMPTS
from pgjobkit.core.failures import JobTraceback, storable_traceback
from pgjobkit.core.models import Enqueued, FailResult, Job, JobStatus, LeaseState, NewJob
from pgjobkit.errors import InvalidArgument
from pgjobkit.ops import UNREADABLE, Call, Dialect, Op, as_uuid, chunks, log, pairs


# --- enqueue --------------------------------------------------------------------------------------------
def job_object(job: NewJob) -> dict[str, Any]:
    """The JSON object ``jobkit_enqueue_many`` takes for one job, its fields at their defaults left out
    (``jobkit_enqueue`` takes the same, each as a ``p_`` argument)."""
    out: dict[str, Any] = {"type": job.type, "payload": job.payload}
    if job.idempotency_key is not None:
        out["idempotency_key"] = job.idempotency_key
    if job.priority:
        out["priority"] = job.priority
    if job.max_attempts != DEFAULT_MAX_ATTEMPTS:
        out["max_attempts"] = job.max_attempts
    if job.user_id is not None:
        out["user_id"] = str(job.user_id)
    if job.run_after is not None:
        out["run_after"] = job.run_after.isoformat()
    if job.delay is not None:
        out["delay_seconds"] = job.delay.total_seconds()
    if job.fair_key is not None:
        out["fair_key"] = job.fair_key
    if job.trace_context is not None:
        out["trace_context"] = job.trace_context
    return out


def _enqueue_call(job: NewJob, columns: tuple[str, ...] | None = None) -> Call:
    args = {f"p_{k}": (_ENQUEUE_TYPES[f"p_{k}"], v) for k, v in job_object(job).items()}
    return Call("jobkit_enqueue", args, columns=columns)


def enqueue(d: Dialect, job: NewJob) -> Op[Enqueued]:
    [row] = yield _enqueue_call(job, _ENQUEUED)
    return _enqueued(row)


# What an enqueue answers: a row transport reads these columns alone, not the payload back (measured
# through enqueue one per call: 1.9x the jobs/s of whole rows, see the README's benchmark notes).
_ENQUEUED = ("inserted", "id", "status")


def _enqueued(row: Mapping[str, Any]) -> Enqueued:
    return Enqueued(as_uuid(row["id"]), bool(row["inserted"]), JobStatus(row["status"]))


_ENQUEUE_TYPES = {
    "p_type": "text",
    "p_payload": "jsonb",
    "p_idempotency_key": "text",
    "p_priority": "integer",
    "p_max_attempts": "integer",
    "p_user_id": "uuid",
    "p_run_after": "timestamptz",
    "p_delay_seconds": "double precision",
    "p_fair_key": "text",
    "p_trace_context": "jsonb",
}


def enqueue_many(d: Dialect, jobs: Sequence[NewJob]) -> Op[list[Enqueued]]:
    """One job goes through jobkit_enqueue, whose typed arguments skip the JSON batch's parsing and checks
    (measured: 1.4x)."""
    if not jobs:
        return []
    if len(jobs) == 1:
        return [(yield from enqueue(d, jobs[0]))]
    if len(jobs) > BATCH_LIMIT:  # the SQL says so too; this saves sending them
        raise InvalidArgument(f"jobkit: p_jobs holds {len(jobs)} jobs; at most {BATCH_LIMIT} per call")
    args = {"p_jobs": ("jsonb", [job_object(j) for j in jobs])}
    if d.json_answers:  # one JSON value: PostgREST cannot cut it, and the batch stays all or nothing
        rows = yield Call("jobkit_enqueue_many_ids_json", args, scalar=True)
    else:
        rows = yield Call("jobkit_enqueue_many", args, columns=_ENQUEUED)
    return [_enqueued(r) for r in rows]


# --- claim and complete ---------------------------------------------------------------------------------
def _claim_call(
    types: Sequence[str],
    worker: str,
    lease: timedelta,
    limit: int,
    done: Sequence[tuple[UUID, UUID]] = (),
    results: Mapping[UUID, Any] | None = None,
    delete: bool = False,
    after: UUID | None = None,
) -> Call:
    args: dict[str, tuple[str, Any]] = {
        "p_types": ("text[]", tuple(types)),
        "p_worker": ("text", worker),
        "p_lease_seconds": ("double precision", lease.total_seconds()),
        "p_limit": ("integer", limit),
    }
    if done:
        args |= pairs(done, "p_done_ids", "p_done_tokens") | _results(done, results, "p_done_results")
        if delete:
            args["p_done_delete"] = ("boolean", True)
    if after is not None:
        args["p_after"] = ("uuid", after)
    return Call("jobkit_claim", args)


def claim(
    d: Dialect, types: Sequence[str], worker: str, lease: timedelta, limit: int = 1, after: UUID | None = None
) -> Op[list[Job]]:
    rows = yield _claim_call(types, worker, lease, min(limit, d.max_rows), after=after)
    return (yield from _claimed(d, rows))


def _claimed(d: Dialect, rows: Sequence[Mapping[str, Any]]) -> Op[list[Job]]:
    """The jobs of claimed ``rows``. A row this client cannot read (a value its decoder refuses, or one Job
    refuses: a payload written before its bounds held, a time no datetime holds) is failed at once,
    permanently, saying why, so it neither comes back nor stops the worker; the rest of the batch runs."""
    jobs: list[Job] = []
    for row in rows:
        problem = row.get(UNREADABLE)
        if problem is None:
            try:
                jobs.append(d.job(row))
                continue
            except ValidationError as exc:
                error = exc.errors(include_url=False, include_input=False)[0]
                problem = f"{'.'.join(map(str, error['loc']))}: {error['msg']}"
        yield from _fail_unreadable(row, problem[:500])
    return jobs


def _fail_unreadable(row: Mapping[str, Any], problem: str) -> Op[None]:
    what = f"job {str(row.get('id'))[:36]} type={str(row.get('type'))[:100]!r}"
    try:
        job_id, token = as_uuid(row["id"]), as_uuid(row["lease_token"])
    except (KeyError, TypeError, ValueError):  # pragma: no cover - a uuid column always reads
        log.error("%s cannot be read (%s), nor failed: its lease will expire", what, problem)
        return
    log.error("%s cannot be read (%s): failed without running", what, problem)
    yield Call(
        "jobkit_fail",
        {
            "p_id": ("uuid", job_id),
            "p_lease_token": ("uuid", token),
            "p_error": ("text", f"jobkit: the worker cannot read this job ({problem}); it was not run"),
            "p_retry_delay_seconds": ("double precision", 0.0),
            "p_permanent": ("boolean", True),
        },
    )


def _results(
    done: Sequence[tuple[UUID, UUID]], results: Mapping[UUID, Any] | None, name: str
) -> dict[str, tuple[str, Any]]:
    """The results of ``done`` as the one jsonb argument {job id: result}; nothing when none has one (the
    common case keeps the call's shape, and its cached statement)."""
    if not results:
        return {}
    chosen = {str(job_id): results[job_id] for job_id, _ in done if results.get(job_id) is not None}
    return {name: ("jsonb", chosen)} if chosen else {}


def complete_many(
    d: Dialect,
    done: Sequence[tuple[UUID, UUID]],
    results: Mapping[UUID, Any] | None = None,
    delete: bool = False,
) -> Op[dict[UUID, bool]]:
    if len(done) > BATCH_LIMIT:
        raise InvalidArgument(
            f"jobkit: complete_many takes at most {BATCH_LIMIT} jobs per call (got {len(done)})"
        )
    ok: dict[UUID, bool] = {}
    for chunk in chunks(done, d.max_rows):
        args = pairs(chunk, "p_ids", "p_lease_tokens") | _results(chunk, results, "p_results")
        if delete:
            args["p_delete"] = ("boolean", True)
        rows = yield Call("jobkit_complete", args)
        ok.update((as_uuid(r["id"]), bool(r["ok"])) for r in rows)
    return ok


def complete(d: Dialect, job_id: UUID, lease_token: UUID, result: Any = None) -> Op[bool]:
    ok = yield from complete_many(d, [(job_id, lease_token)], {job_id: result})
    return ok[job_id]


def complete_and_claim(
    d: Dialect,
    done: Sequence[tuple[UUID, UUID]],
    types: Sequence[str],
    worker: str,
    lease: timedelta,
    limit: int,
    results: Mapping[UUID, Any] | None = None,
    delete: bool = False,
    after: UUID | None = None,
) -> Op[tuple[dict[UUID, bool], list[Job]]]:
    """Complete ``done`` (with ``results``; ``delete``: see ``JobStore.complete_many``) and claim up to
    ``limit`` more, in one call when they fit (``after``: see ``claim``)."""
    if limit < 1 or not done:
        ok = yield from complete_many(d, done, results, delete)
        return ok, ((yield from claim(d, types, worker, lease, limit, after)) if limit > 0 else [])
    # Given done ids, jobkit_claim returns the jobs it completed as succeeded rows (id and status only) and
    # the ones it claimed as running rows; a done id not among them lost its lease. Both count against
    # max_rows: the done ids beyond what leaves room for the claim are completed first, on their own.
    limit = min(limit, CLAIM_LIMIT_CAP, d.max_rows - 1)
    room = d.max_rows - limit
    ok = (yield from complete_many(d, done[:-room], results, delete)) if len(done) > room else {}
    last = done[-room:]
    rows = yield _claim_call(types, worker, lease, limit, last, results, delete, after)
    completed = {as_uuid(r["id"]) for r in rows if r["status"] == JobStatus.SUCCEEDED}
    ok.update((job_id, job_id in completed) for job_id, _ in last)
    return ok, (yield from _claimed(d, [r for r in rows if r["status"] == JobStatus.RUNNING]))


def fail(
    d: Dialect,
    job_id: UUID,
    lease_token: UUID,
    error: str,
    retry_delay: timedelta,
    permanent: bool = False,
    max_attempts: int | None = None,
    traceback: str | None = None,
) -> Op[FailResult]:
    """``max_attempts`` and ``traceback`` are sent only when given (the common call keeps its shape); the
    traceback made storable first (``storable_traceback``), whatever text it holds."""
    args: dict[str, tuple[str, Any]] = {
        "p_id": ("uuid", job_id),
        "p_lease_token": ("uuid", lease_token),
        "p_error": ("text", error),
        "p_retry_delay_seconds": ("double precision", retry_delay.total_seconds()),
        "p_permanent": ("boolean", permanent),
    }
    if max_attempts is not None:
        args["p_max_attempts"] = ("integer", max_attempts)
    if traceback is not None:
        args["p_traceback"] = ("text", storable_traceback(traceback))
    [row] = yield Call("jobkit_fail", args)
    return FailResult.model_validate({k: row[k] for k in ("ok", "status", "attempts", "run_after")})


def traceback(d: Dialect, job_id: UUID) -> Op[JobTraceback | None]:
    rows = yield Call("jobkit_traceback", {"p_id": ("uuid", job_id)})
    if not rows:
        return None
    [row] = rows
    return JobTraceback(job_id, int(row["attempt"]), row["traceback"], d.time(row["failed_at"]))


def heartbeat(d: Dialect, held: Sequence[tuple[UUID, UUID]], lease: timedelta) -> Op[dict[UUID, LeaseState]]:
    out: dict[UUID, LeaseState] = {}
    for chunk in chunks(held, d.max_rows):
        args = pairs(chunk, "p_ids", "p_lease_tokens") | {
            "p_lease_seconds": ("double precision", lease.total_seconds())
        }
        rows = yield Call("jobkit_heartbeat", args)
        out.update((as_uuid(r["id"]), LeaseState.model_validate(r)) for r in rows)
    return out


def progress(d: Dialect, reports: Sequence[tuple[UUID, UUID, float, str | None]]) -> Op[dict[UUID, bool]]:
    out: dict[UUID, bool] = {}
    for chunk in chunks(reports, d.max_rows):
        args = {
            "p_ids": ("uuid[]", [r[0] for r in chunk]),
            "p_lease_tokens": ("uuid[]", [r[1] for r in chunk]),
            "p_progress": ("double precision[]", [r[2] for r in chunk]),
            "p_messages": ("text[]", [r[3] for r in chunk]),
        }
        rows = yield Call("jobkit_progress", args)
        out.update((as_uuid(r["id"]), bool(r["ok"])) for r in rows)
    return out


def release(d: Dialect, job_id: UUID, lease_token: UUID) -> Op[bool]:
    [row] = yield Call("jobkit_release", {"p_id": ("uuid", job_id), "p_lease_token": ("uuid", lease_token)})
    return bool(row["ok"])
