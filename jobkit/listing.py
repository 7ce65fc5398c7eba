"""UserJobs: a signed-in user's own jobs, with the anon key plus the user's access token: list and read
them, start jobs of the types an operator opened to users, cancel them.

Row Level Security does the scoping: PostgREST runs the query as ``authenticated`` with the token's
claims, and the policy on ``jobkit_jobs`` shows only rows whose ``user_id`` is the token's subject. The
user sees the columns in ``UserJob``, never the lease token or which worker holds the job. Starting and
cancelling go through ``jobkit_user_enqueue`` / ``jobkit_user_cancel``, whose checks live in SQL.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any
from uuid import UUID

import httpx
from pydantic import BaseModel, ConfigDict, SecretStr

from jobkit.errors import ConfigurationError, InvalidArgument, PermissionDenied, TransientError
from jobkit.http import RetryPolicy, async_supabase_client, supabase_client
from jobkit.live import JobUpdate, watch_jobs, watch_jobs_blocking
from jobkit.models import Cancelled, JobStatus
from supabase import AsyncClient

TABLE = "jobkit_jobs"


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


def _credentials(url: str, key: str | SecretStr, token: str | SecretStr | None) -> tuple[str, str, str]:
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


def _list_query(
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


def _get_query(table: Any, job_id: UUID) -> Any:
    return table.select(COLUMNS).eq("id", str(job_id)).limit(1)


class UserEnqueued(BaseModel):
    """What a user's enqueue returns: the job, and whether this call inserted it (False: the user's own
    idempotency key already held a live job, returned instead)."""

    model_config = ConfigDict(frozen=True)

    job: UserJob
    inserted: bool


def _enqueue_args(type: str, payload: dict[str, Any] | None, idempotency_key: str | None) -> dict[str, Any]:
    if not isinstance(payload, dict | None):
        raise InvalidArgument("jobkit: payload must be a dict (a JSON object)")
    return {"p_type": type, "p_payload": payload or {}, "p_idempotency_key": idempotency_key}


def _enqueued(data: Any) -> UserEnqueued:
    [row] = data
    return UserEnqueued(job=UserJob.model_validate(row), inserted=row["inserted"])


def _cancelled(data: Any) -> Cancelled:
    [row] = data
    return Cancelled.model_validate(row)


def _jobs(data: Any) -> list[UserJob]:
    return [UserJob.model_validate(row) for row in data]


def _unreachable(exc: httpx.TransportError) -> TransientError:
    return TransientError(f"jobkit: listing jobs: {type(exc).__name__} talking to Supabase")


class UserJobs:
    """One user's view of the queue. Build one per request: it holds that user's token."""

    def __init__(
        self,
        url: str,
        anon_key: str | SecretStr,
        access_token: str | SecretStr | None,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout: float = 10.0,
        retry: RetryPolicy | None = None,
        realtime_url: str | None = None,
    ) -> None:
        self._url, key, token = _credentials(url, anon_key, access_token)
        self._realtime_url = realtime_url or self._url
        self._secrets = SecretStr(key), SecretStr(token)
        self._client, self._http = supabase_client(
            self._url, key, token=token, retry=retry, timeout=timeout, transport=transport
        )

    def __repr__(self) -> str:
        return f"UserJobs(url={self._url!r})"

    def _select(self, query: Any) -> list[UserJob]:
        try:
            return _jobs(query.execute().data)
        except httpx.TransportError as exc:
            raise _unreachable(exc) from exc

    def list(
        self,
        *,
        status: JobStatus | str | None = None,
        type: str | None = None,
        limit: int = 50,
        before: tuple[datetime, UUID] | None = None,
    ) -> list[UserJob]:
        """The user's jobs, newest first. Next page: ``before=(last.created_at, last.id)``."""
        return self._select(_list_query(self._client.table(TABLE), status, type, limit, before))

    def get(self, job_id: UUID) -> UserJob | None:
        """The job, if it exists and is this user's; otherwise None."""
        rows = self._select(_get_query(self._client.table(TABLE), job_id))
        return rows[0] if rows else None

    def watch(self) -> Iterator[JobUpdate]:
        """This user's jobs as they change, live over Supabase Realtime (see ``AsyncUserJobs.watch``), for
        blocking code: ``for update in jobs.watch(): ...``; stop iterating (or ``close()`` it) to leave."""
        key, token = (s.get_secret_value() for s in self._secrets)
        return watch_jobs_blocking(self._realtime_url, key, token)

    def _rpc(self, fn: str, args: dict[str, Any]) -> Any:
        try:
            return self._client.rpc(fn, args).execute().data
        except httpx.TransportError as exc:
            raise _unreachable(exc) from exc

    def enqueue(
        self, type: str, payload: dict[str, Any] | None = None, *, idempotency_key: str | None = None
    ) -> UserEnqueued:
        """Start a job for this user, of a type an operator opened to users (``jobkit_user_types``), within
        its limits (LimitReached past them). The key is this user's own."""
        return _enqueued(self._rpc("jobkit_user_enqueue", _enqueue_args(type, payload, idempotency_key)))

    def cancel(self, job_id: UUID) -> Cancelled:
        """Cancel one of this user's jobs (a running one stops at its worker's next heartbeat);
        JobNotFound when it is not theirs."""
        return _cancelled(self._rpc("jobkit_user_cancel", {"p_id": str(job_id)}))

    def close(self) -> None:
        self._http.close()


class AsyncUserJobs:
    """UserJobs for asyncio, over supabase-py's async client (made on first use)."""

    def __init__(
        self,
        url: str,
        anon_key: str | SecretStr,
        access_token: str | SecretStr | None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout: float = 10.0,
        retry: RetryPolicy | None = None,
        realtime_url: str | None = None,
    ) -> None:
        self._url, key, token = _credentials(url, anon_key, access_token)
        self._realtime_url = realtime_url or self._url
        self._secrets = SecretStr(key), SecretStr(token)
        self._options: dict[str, Any] = {"transport": transport, "timeout": timeout, "retry": retry}
        self._made: tuple[AsyncClient, httpx.AsyncClient] | None = None

    def __repr__(self) -> str:
        return f"AsyncUserJobs(url={self._url!r})"

    async def _client(self) -> AsyncClient:
        if self._made is None:
            key, token = (s.get_secret_value() for s in self._secrets)
            self._made = await async_supabase_client(self._url, key, token=token, **self._options)
        return self._made[0]

    async def _table(self) -> Any:
        return (await self._client()).table(TABLE)

    async def _rpc(self, fn: str, args: dict[str, Any]) -> Any:
        try:
            return (await (await self._client()).rpc(fn, args).execute()).data
        except httpx.TransportError as exc:
            raise _unreachable(exc) from exc

    async def enqueue(
        self, type: str, payload: dict[str, Any] | None = None, *, idempotency_key: str | None = None
    ) -> UserEnqueued:
        return _enqueued(
            await self._rpc("jobkit_user_enqueue", _enqueue_args(type, payload, idempotency_key))
        )

    async def cancel(self, job_id: UUID) -> Cancelled:
        return _cancelled(await self._rpc("jobkit_user_cancel", {"p_id": str(job_id)}))

    def watch(self) -> AsyncIterator[JobUpdate]:
        """This user's jobs as they change (status, progress), live over Supabase Realtime, until you stop
        iterating: ``async for update in jobs.watch(): ...``. Only this user's jobs reach it (RLS on the
        private topic). Re-read a job (``get``) for its result."""
        key, token = (s.get_secret_value() for s in self._secrets)
        return watch_jobs(self._realtime_url, key, token)

    async def _select(self, query: Any) -> list[UserJob]:
        try:
            return _jobs((await query.execute()).data)
        except httpx.TransportError as exc:
            raise _unreachable(exc) from exc

    async def list(
        self,
        *,
        status: JobStatus | str | None = None,
        type: str | None = None,
        limit: int = 50,
        before: tuple[datetime, UUID] | None = None,
    ) -> list[UserJob]:
        """The user's jobs, newest first. Next page: ``before=(last.created_at, last.id)``."""
        return await self._select(_list_query(await self._table(), status, type, limit, before))

    async def get(self, job_id: UUID) -> UserJob | None:
        """The job, if it exists and is this user's; otherwise None."""
        rows = await self._select(_get_query(await self._table(), job_id))
        return rows[0] if rows else None

    async def close(self) -> None:
        if self._made is not None:
            await self._made[1].aclose()
            self._made = None
