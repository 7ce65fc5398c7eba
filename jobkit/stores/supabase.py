"""SupabaseStore: the JobStore over PostgREST RPC, with a supabase-py client and the service-role key.

Every operation is one ``POST /rest/v1/rpc/jobkit_*``. Transient faults (connection errors, timeouts,
429, 502, 503, 504) are retried by tenacity inside the HTTP transport, with exponential backoff, full
jitter, ``Retry-After`` honoured and a bound on the total time; other 4xx are never retried.

What a retried call means: the first attempt may have run before its response was lost. A retried claim
then leaves the jobs it leased running until their lease expires, when they are reclaimed: delivery
stays at-least-once. A retried enqueue without an idempotency key may insert twice; give a key when that
matters. complete / fail / extend are fenced by the lease token, so a repeat changes nothing.
"""

from __future__ import annotations

import email.utils
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import httpx
import tenacity
from postgrest.exceptions import APIError
from pydantic import SecretStr

from jobkit.errors import ConfigurationError, JobkitError, PermissionDenied, TransientError, error_for
from jobkit.models import Enqueued, FailResult, Job, JobStatus, NewJob, Reclaimed, Stats, StatsRow
from jobkit.stores.base import DEFAULT_PRUNE_STATUSES, ClaimsThroughSql
from supabase import Client, ClientOptions, create_client

log = logging.getLogger("jobkit.supabase")
RETRY_STATUSES = frozenset({429, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """How transient HTTP faults are retried: at most ``attempts`` tries within ``max_total`` seconds."""

    attempts: int = 6
    base: float = 0.2
    cap: float = 5.0
    max_total: float = 30.0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, (when - datetime.now(UTC)).total_seconds())


class RetryingTransport(httpx.BaseTransport):
    """An httpx transport that retries transient faults of the one it wraps (see module doc)."""

    def __init__(self, inner: httpx.BaseTransport, policy: RetryPolicy) -> None:
        self._inner, self._policy = inner, policy

    @staticmethod
    def _elapsed(state: tenacity.RetryCallState) -> float:
        # idle_for counts the sleeps asked for, so an injected sleep keeps the budget honest too.
        return max(state.seconds_since_start or 0.0, state.idle_for)

    def _delay(self, state: tenacity.RetryCallState) -> float:
        p = self._policy
        delay = random.uniform(0, min(p.cap, p.base * 2 ** (state.attempt_number - 1)))
        delay = max(delay, self._retry_after(state))
        return max(0.0, min(delay, p.max_total - self._elapsed(state)))

    def _stop(self, state: tenacity.RetryCallState) -> bool:
        p = self._policy
        if state.attempt_number >= p.attempts:
            return True
        return self._elapsed(state) + self._retry_after(state) >= p.max_total

    @staticmethod
    def _retry_after(state: tenacity.RetryCallState) -> float:
        outcome = state.outcome
        if outcome is not None and not outcome.failed:
            return _retry_after(outcome.result()) or 0.0
        return 0.0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()  # the body is sent again on a retry

        def close_retried(state: tenacity.RetryCallState) -> None:
            outcome = state.outcome
            if outcome is not None and not outcome.failed:
                response: httpx.Response = outcome.result()
                log.warning(
                    "jobkit: %s %s answered %d; retrying",
                    request.method,
                    request.url.path,
                    response.status_code,
                )
                response.close()
            elif outcome is not None:
                log.warning(
                    "jobkit: %s %s failed (%s); retrying",
                    request.method,
                    request.url.path,
                    type(outcome.exception()).__name__,
                )

        retrying = tenacity.Retrying(
            stop=self._stop,
            wait=self._delay,
            retry=(
                tenacity.retry_if_exception_type(httpx.TransportError)
                | tenacity.retry_if_result(lambda r: r.status_code in RETRY_STATUSES)
            ),
            before_sleep=close_retried,
            retry_error_callback=lambda state: state.outcome.result() if state.outcome else None,
            sleep=self._policy.sleep,
            reraise=True,
        )
        response: httpx.Response = retrying(self._inner.handle_request, request)
        return response

    def close(self) -> None:
        self._inner.close()


def _job(row: Mapping[str, Any]) -> Job:
    return Job.from_row(row)


class SupabaseStore(ClaimsThroughSql):
    """A JobStore over a Supabase project's API. ``service_key``: the service_role / secret key."""

    _job = staticmethod(_job)

    def __init__(
        self,
        url: str,
        service_key: str | SecretStr,
        *,
        retry: RetryPolicy | None = None,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        key = service_key.get_secret_value() if isinstance(service_key, SecretStr) else service_key
        if not url or not key:
            raise ConfigurationError("jobkit: SupabaseStore needs SUPABASE_URL and SUPABASE_SERVICE_ROLE_KEY")
        self._url = url.rstrip("/")
        self._http = httpx.Client(
            transport=RetryingTransport(transport or httpx.HTTPTransport(), retry or RetryPolicy()),
            timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
        )
        self._client: Client = create_client(
            self._url,
            key,
            options=ClientOptions(
                auto_refresh_token=False,
                persist_session=False,
                postgrest_client_retry=False,  # jobkit retries, with its own bounds
                httpx_client=self._http,
            ),
        )

    def __repr__(self) -> str:
        return f"SupabaseStore(url={self._url!r})"

    def _rpc(self, fn: str, params: dict[str, Any]) -> Any:
        try:
            return self._client.rpc(fn, params).execute().data
        except APIError as exc:
            error = error_for(exc.code, f"jobkit: {fn}: {exc.message or 'request failed'} ({exc.code})")
            if isinstance(error, PermissionDenied):
                raise PermissionDenied(
                    f"jobkit: {fn} was refused ({exc.code}: {exc.message}). The key lacks service rights: "
                    "set SUPABASE_SERVICE_ROLE_KEY (or SUPABASE_SECRET_KEY) to the project's service_role / "
                    "secret key, and check that the jobkit migrations are applied (supabase db push).",
                    code=exc.code,
                ) from exc
            raise error from exc
        except httpx.TransportError as exc:
            raise TransientError(f"jobkit: {fn}: {type(exc).__name__} talking to Supabase") from exc

    def _rows(self, fn: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        data = self._rpc(fn, params)
        if not isinstance(data, list):
            raise JobkitError(f"jobkit: {fn} returned {type(data).__name__}, expected rows")
        return data

    # --- JobStore --------------------------------------------------------------------------------------
    def enqueue(self, job: NewJob) -> Enqueued:
        [row] = self._rows("jobkit_enqueue", job.to_rpc())
        return Enqueued(job=_job(row), inserted=row["inserted"])

    def enqueue_many(self, jobs: Sequence[NewJob]) -> list[Enqueued]:
        if not jobs:
            return []
        rows = self._rows("jobkit_enqueue_many", {"p_jobs": [j.to_sql() for j in jobs]})
        return [Enqueued(job=_job(r), inserted=r["inserted"]) for r in rows]

    def _claim_rows(
        self,
        types: Sequence[str],
        worker: str,
        lease: timedelta,
        limit: int,
        done: Sequence[tuple[UUID, UUID]] = (),
    ) -> list[dict[str, Any]]:
        params: dict[str, Any] = {
            "p_types": list(types),
            "p_worker": worker,
            "p_lease_seconds": lease.total_seconds(),
            "p_limit": limit,
        }
        if done:
            params |= {"p_done_ids": [str(d[0]) for d in done], "p_done_tokens": [str(d[1]) for d in done]}
        return self._rows("jobkit_claim", params)

    def complete(self, job_id: UUID, lease_token: UUID) -> bool:
        return self.complete_many([(job_id, lease_token)])[job_id]

    def complete_many(self, done: Sequence[tuple[UUID, UUID]]) -> Mapping[UUID, bool]:
        if not done:
            return {}
        rows = self._rows(
            "jobkit_complete",
            {"p_ids": [str(d[0]) for d in done], "p_lease_tokens": [str(d[1]) for d in done]},
        )
        return {UUID(r["id"]): bool(r["ok"]) for r in rows}

    def fail(
        self, job_id: UUID, lease_token: UUID, error: str, retry_delay: timedelta, permanent: bool = False
    ) -> FailResult:
        [row] = self._rows(
            "jobkit_fail",
            {
                "p_id": str(job_id),
                "p_lease_token": str(lease_token),
                "p_error": error,
                "p_retry_delay_seconds": retry_delay.total_seconds(),
                "p_permanent": permanent,
            },
        )
        return FailResult.model_validate({k: row[k] for k in ("ok", "status", "attempts", "run_after")})

    def extend_lease(self, job_id: UUID, lease_token: UUID, lease: timedelta) -> datetime | None:
        [row] = self._rows(
            "jobkit_extend_lease",
            {
                "p_id": str(job_id),
                "p_lease_token": str(lease_token),
                "p_lease_seconds": lease.total_seconds(),
            },
        )
        return datetime.fromisoformat(row["lease_until"]) if row["ok"] else None

    def release(self, job_id: UUID, lease_token: UUID) -> bool:
        [row] = self._rows("jobkit_release", {"p_id": str(job_id), "p_lease_token": str(lease_token)})
        return bool(row["ok"])

    def reclaim_expired(self, limit: int = 1000) -> list[Reclaimed]:
        return [Reclaimed.model_validate(r) for r in self._rows("jobkit_reclaim_expired", {"p_limit": limit})]

    def requeue(self, ids: Sequence[UUID] | None = None, type: str | None = None) -> list[Job]:
        rows = self._rows(
            "jobkit_requeue", {"p_ids": [str(i) for i in ids] if ids is not None else None, "p_type": type}
        )
        return [_job(r) for r in rows]

    def prune(
        self,
        older_than: timedelta,
        statuses: Sequence[JobStatus] = DEFAULT_PRUNE_STATUSES,
        limit: int = 10_000,
    ) -> int:
        data = self._rpc(
            "jobkit_prune",
            {
                "p_older_than_seconds": older_than.total_seconds(),
                "p_statuses": [str(s) for s in statuses],
                "p_limit": limit,
            },
        )
        return int(data)

    def stats(self) -> Stats:
        return Stats(rows=tuple(StatsRow.model_validate(r) for r in self._rows("jobkit_stats", {})))

    def get(self, job_id: UUID) -> Job | None:
        rows = self._rows("jobkit_get", {"p_id": str(job_id)})
        return _job(rows[0]) if rows else None

    def list(
        self,
        *,
        status: JobStatus | None = None,
        type: str | None = None,
        user_id: UUID | None = None,
        before: tuple[datetime, UUID] | None = None,
        limit: int = 50,
    ) -> list[Job]:
        rows = self._rows(
            "jobkit_list",
            {
                "p_status": str(status) if status is not None else None,
                "p_type": type,
                "p_user_id": str(user_id) if user_id is not None else None,
                "p_before": before[0].isoformat() if before else None,
                "p_before_id": str(before[1]) if before else None,
                "p_limit": limit,
            },
        )
        return [_job(r) for r in rows]

    def listen(self, wake: Callable[[], None]) -> _Polling:
        """PostgREST has no LISTEN: the worker polls (Realtime could wake it; not used)."""
        return _Polling()

    def close(self) -> None:
        self._http.close()


class _Polling:
    def close(self) -> None:
        return None
