"""A signed-in user's own jobs (``AsyncUserJobs`` in ``users_async``, the source, and ``UserJobs`` in
``users``, generated from it by tools/async_to_sync.py), with the anon key plus the user's access token:
list and read them, start jobs of the types an operator opened to users, cancel them.

Row Level Security does the scoping: PostgREST runs the query as ``authenticated`` with the token's
claims, and the policy on ``jobkit_jobs`` shows only rows whose ``user_id`` is the token's subject. The
user sees the columns in ``UserJob``, never the lease token or which worker holds the job. Starting and
cancelling go through ``jobkit_user_enqueue`` / ``jobkit_user_cancel``, whose checks live in SQL.
"""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

import httpx
from pydantic import SecretStr

from pgjobkit._users_base import (
    DIALECT,
    TABLE,
    UserEnqueued,
    UserJob,
    cancelled,
    credentials,
    enqueue_args,
    enqueued,
    get_query,
    list_query,
    unreachable,
    user_jobs,
)

# SYNC: import threading
# SYNC: from collections.abc import Iterator
from pgjobkit.core.models import Cancelled, JobStatus
from pgjobkit.core.pipelines import (
    DependencyResult,
    Pipeline,
    PipelineEnqueued,
    PipelineJob,
    PipelineProgress,
)
from pgjobkit.exporters import otel
from pgjobkit.ops import Call, Op
from pgjobkit.ops import pipelines as pipeline_ops
from pgjobkit.stores import unreadable
from pgjobkit.stores.base_async import adrive
from pgjobkit.stores.supabase._http_base import RetryPolicy
from pgjobkit.stores.supabase.http_async import async_supabase_client
from pgjobkit.stores.supabase.realtime import JobUpdate, watch_jobs
from pgjobkit.stores.supabase.rpc import answer, rpc_args, undecoded
from supabase import AsyncClient

# SYNC: from pgjobkit.stores.supabase.realtime import watch_jobs_blocking

T = TypeVar("T")


class AsyncUserJobs:
    """One user's view of the queue, over supabase-py's client (made on first use): the publishable key and
    the user's access token. Build one per request: it holds that user's token."""

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
        self._url, key, token = credentials(url, anon_key, access_token)
        self._realtime_url = realtime_url or self._url
        self._secrets = SecretStr(key), SecretStr(token)
        self._options: dict[str, Any] = {"transport": transport, "timeout": timeout, "retry": retry}
        self._made: tuple[AsyncClient, httpx.AsyncClient] | None = None
        # SYNC: self._open_lock = threading.Lock()  # threads may share a blocking client

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self._url!r})"

    async def _client(self) -> AsyncClient:
        # SYNC: with self._open_lock:
        # SYNC:     if self._made is None:
        # SYNC:         key, token = (s.get_secret_value() for s in self._secrets)
        # SYNC:         self._made = supabase_client(self._url, key, token=token, **self._options)
        if self._made is None:  # ASYNC
            key, token = (s.get_secret_value() for s in self._secrets)  # ASYNC
            self._made = await async_supabase_client(self._url, key, token=token, **self._options)  # ASYNC
        return self._made[0]

    async def _select(self, query: Any) -> list[UserJob]:
        try:
            return user_jobs((await query.execute()).data)
        except httpx.TransportError as exc:
            raise unreachable(exc) from exc

    async def _rpc(self, fn: str, args: dict[str, Any]) -> Any:
        try:
            return (await (await self._client()).rpc(fn, args).execute()).data
        except httpx.TransportError as exc:
            raise unreachable(exc) from exc
        except (ValueError, RecursionError):  # JSON supabase-py could not decode: read it row by row
            return unreadable.read_value_by_value(undecoded())

    async def list(
        self,
        *,
        status: JobStatus | str | None = None,
        type: str | None = None,
        limit: int = 50,
        before: tuple[datetime, UUID] | None = None,
    ) -> list[UserJob]:
        """The user's jobs, newest first. Next page: ``before=(last.created_at, last.id)``."""
        return await self._select(
            list_query((await self._client()).table(TABLE), status, type, limit, before)
        )

    async def get(self, job_id: UUID) -> UserJob | None:
        """The job, if it exists and is this user's; otherwise None."""
        rows = await self._select(get_query((await self._client()).table(TABLE), job_id))
        return rows[0] if rows else None

    async def enqueue(
        self, type: str, payload: dict[str, Any] | None = None, *, idempotency_key: str | None = None
    ) -> UserEnqueued:
        """Start a job for this user, of a type an operator opened to users (``jobkit_user_types``), within
        its limits (LimitReached past them). The key is this user's own. Inside a trace (OpenTelemetry), the
        job keeps its context: its run links to that trace, in a new trace of its own (a user does not
        choose which trace the app's worker joins)."""
        with otel.send_span([type] if isinstance(type, str) else []) as trace_context:
            args = enqueue_args(type, payload, idempotency_key, trace_context)
            return enqueued(await self._rpc("jobkit_user_enqueue", args))

    async def cancel(self, job_id: UUID) -> Cancelled:
        """Cancel one of this user's jobs (a running one stops at its worker's next heartbeat);
        JobNotFound when it is not theirs."""
        return cancelled(await self._rpc("jobkit_user_cancel", {"p_id": str(job_id)}))

    async def enqueue_pipeline(self, pipeline: Pipeline) -> PipelineEnqueued:
        """Start a pipeline for this user (at most 1000 jobs): each job of a type open to users, with
        only its type, payload and idempotency key, within its type's limits (its waiting jobs count as
        live); it may wait only for jobs of the pipeline or this user's own. All or nothing."""
        return await self._run(pipeline_ops.user_enqueue_pipeline(DIALECT, pipeline))

    async def cancel_pipeline(self, pipeline_id: UUID) -> int:
        """Cancel every job of this user's pipeline that has not finished; how many. JobNotFound when the
        pipeline is not theirs."""
        return await self._run(pipeline_ops.user_cancel_pipeline(DIALECT, pipeline_id))

    async def pipeline_progress(self, pipeline_id: UUID) -> PipelineProgress | None:
        """This user's pipeline by status, and the types running now; None when it is not theirs."""
        return await self._run(pipeline_ops.pipeline_progress(DIALECT, pipeline_id))

    async def get_pipeline(self, pipeline_id: UUID) -> builtins.list[PipelineJob]:
        """This user's pipeline, job by job, as ``JobStore.get_pipeline`` reads it (only their own)."""
        return await self._run(pipeline_ops.get_pipeline(DIALECT, pipeline_id))

    async def dependencies(self, job_id: UUID) -> builtins.list[DependencyResult]:
        """What one of this user's jobs waits for, with results (only their own jobs show)."""
        return await self._run(pipeline_ops.list_dependencies(DIALECT, job_id))

    async def _run(self, op: Op[T]) -> T:
        return await adrive(op, self._call)

    async def _call(self, call: Call) -> Any:
        return answer(call, await self._rpc(call.fn, rpc_args(call)))

    # SYNC: def watch(self) -> Iterator[JobUpdate]:
    def watch(self) -> AsyncIterator[JobUpdate]:  # ASYNC
        """This user's jobs as they change (status, progress), live over Supabase Realtime, until you stop
        iterating (the blocking client runs the watch on an event loop of its own). Only this user's jobs
        reach it (RLS on the private topic). Re-read a job (``get``) for its result."""
        key, token = (s.get_secret_value() for s in self._secrets)
        return watch_jobs(self._realtime_url, key, token)  # ASYNC
        # SYNC: return watch_jobs_blocking(self._realtime_url, key, token)

    async def close(self) -> None:
        if self._made is not None:
            await self._made[1].aclose()
            self._made = None
