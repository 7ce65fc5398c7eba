"""What a user's client, blocking and async, shares: what a user sees of a job (``UserJob``), what their
enqueue answers (``UserEnqueued``), and each request as a value (supabase-py's sync and async builders take
the same calls)."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import httpx
from pydantic import BaseModel, ConfigDict, SecretStr

from pgjobkit.core.models import Cancelled, Job, JobStatus
from pgjobkit.errors import ConfigurationError, InvalidArgument, PermissionDenied, TransientError
from pgjobkit.ops import Dialect

TABLE = "jobkit_jobs"
DIALECT = Dialect(job=Job.from_row, time=datetime.fromisoformat, json_answers=True)  # PostgREST's answers


class UserJob(BaseModel):
    """What a user may see of one of their jobs."""

    model_config = ConfigDict(frozen=True)

    id: UUID
    user_id: UUID | None
    type: str
    status: JobStatus
    payload: dict[str, Any]
    idempotency_key: str | None
    attempts: int
    max_attempts: int
    priority: int
    run_after: datetime
    error: str | None
    created_at: datetime
    updated_at: datetime
    progress: float | None = None
    progress_message: str | None = None
    result: Any = None


COLUMNS = ",".join(UserJob.model_fields)


def credentials(url: str, key: str | SecretStr, token: str | SecretStr | None) -> tuple[str, str, str]:
    key = key.get_secret_value() if isinstance(key, SecretStr) else key
    token = token.get_secret_value() if isinstance(token, SecretStr) else token
    if not url or not key:
        raise ConfigurationError("jobkit: UserJobs needs SUPABASE_URL and SUPABASE_PUBLISHABLE_KEY")
    if not token:
        raise PermissionDenied(
            "jobkit: UserJobs needs the signed-in user's access token (session.access_token); "
            "without it there is no user to show jobs for"
        )
    return url.rstrip("/"), key, token


def list_query(
    table: Any,
    status: JobStatus | str | None,
    type: str | None,
    limit: int,
    before: tuple[datetime, UUID] | None,
) -> Any:
    """The listing's request, as a value (supabase-py's sync and async builders take the same calls)."""
    if not 1 <= limit <= 1000:
        raise InvalidArgument("jobkit: limit must be between 1 and 1000")
    query = table.select(COLUMNS)
    if status is not None:
        query = query.eq("status", str(JobStatus(status)))
    if type is not None:
        query = query.eq("type", type)
    if before is not None:
        at, last_id = before[0].isoformat(), str(before[1])
        query = query.or_(f'created_at.lt."{at}",and(created_at.eq."{at}",id.lt.{last_id})')
    return query.order("created_at", desc=True).order("id", desc=True).limit(limit)


def get_query(table: Any, job_id: UUID) -> Any:
    return table.select(COLUMNS).eq("id", str(job_id)).limit(1)


class UserEnqueued(BaseModel):
    """What a user's enqueue returns: the job, and whether this call inserted it (False: the user's own
    idempotency key already held a live job, returned instead)."""

    model_config = ConfigDict(frozen=True)

    job: UserJob
    inserted: bool


def enqueue_args(
    type: str,
    payload: dict[str, Any] | None,
    idempotency_key: str | None,
    trace_context: dict[str, str] | None,
) -> dict[str, Any]:
    if not isinstance(payload, dict | None):
        raise InvalidArgument("jobkit: payload must be a dict (a JSON object)")
    args = {"p_type": type, "p_payload": payload or {}, "p_idempotency_key": idempotency_key}
    if trace_context is not None:  # named only when given: 0.4's function has no such argument
        args["p_trace_context"] = trace_context
    return args


def enqueued(data: Any) -> UserEnqueued:
    [row] = data
    return UserEnqueued(job=UserJob.model_validate(row), inserted=row["inserted"])


def cancelled(data: Any) -> Cancelled:
    [row] = data
    return Cancelled.model_validate(row)


def user_jobs(data: Any) -> list[UserJob]:
    return [UserJob.model_validate(row) for row in data]


def unreachable(exc: httpx.TransportError) -> TransientError:
    return TransientError(f"jobkit: listing jobs: {type(exc).__name__} talking to Supabase")
