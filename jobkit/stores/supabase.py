"""SupabaseStore: the JobStore over PostgREST RPC, with a supabase-py client and the secret (service-role) key.

Every operation is ``POST /rest/v1/rpc/jobkit_*``; how faults are retried and mapped is ``jobkit.http``'s.
PostgREST cuts a set-returning answer at the project's max-rows (1000 on Supabase) while the function
runs to completion, so no call here asks for more: claims and completions are split to fit, requeue, stats
and lease reclaim page, and ``enqueue_many`` calls ``jobkit_enqueue_many_json``, whose one JSON value
carries every row of an all-or-nothing batch of up to 10,000. Give ``max_rows`` if the project's Max Rows
setting (Settings -> API) was lowered.

What a retried call means: the first attempt may have run before its answer was lost (a gateway's 502 or
504, a dropped connection). A retried claim then leaves the jobs it leased running until their lease
expires, when they are reclaimed: delivery stays at-least-once. A retried enqueue without an idempotency
key may insert twice; give a key when that matters. complete / fail / extend are fenced by the lease
token, so a repeat changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import httpx
from pydantic import SecretStr

from jobkit.errors import ConfigurationError, InvalidArgument, JobkitError, TransientError
from jobkit.http import RetryPolicy, supabase_client
from jobkit.models import Enqueued, FailResult, Job, JobStatus, NewJob, Reclaimed, StatsRow
from jobkit.stores.base import DEFAULT_PRUNE_STATUSES, MAX_ROWS, SqlStore

__all__ = ["RetryPolicy", "SupabaseStore"]


def _job(row: Mapping[str, Any]) -> Job:
    return Job.from_row(row)


class SupabaseStore(SqlStore):
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
        max_rows: int = MAX_ROWS,
    ) -> None:
        key = service_key.get_secret_value() if isinstance(service_key, SecretStr) else service_key
        if not url or not key:
            raise ConfigurationError("jobkit: SupabaseStore needs SUPABASE_URL and SUPABASE_SECRET_KEY")
        if max_rows < 2:
            raise InvalidArgument(
                f"jobkit: max_rows must be >= 2, the project's API max rows (got {max_rows})"
            )
        self.max_rows = min(max_rows, MAX_ROWS)  # jobkit's functions never return more in one call
        self._url = url.rstrip("/")
        self._client, self._http = supabase_client(
            self._url, key, retry=retry, timeout=timeout, transport=transport
        )

    def __repr__(self) -> str:
        return f"SupabaseStore(url={self._url!r})"

    def _rpc(self, fn: str, params: dict[str, Any]) -> Any:
        try:
            return self._client.rpc(fn, params).execute().data
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
        if len(jobs) > 10_000:  # the SQL says so too; this saves sending them
            raise InvalidArgument(f"jobkit: p_jobs holds {len(jobs)} jobs; at most 10000 per call")
        rows = self._rows("jobkit_enqueue_many_json", {"p_jobs": [j.to_sql() for j in jobs]})
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

    def _complete_rows(self, done: Sequence[tuple[UUID, UUID]]) -> Mapping[UUID, bool]:
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

    def _reclaim_rows(self, limit: int) -> list[Reclaimed]:
        return [Reclaimed.model_validate(r) for r in self._rows("jobkit_reclaim_expired", {"p_limit": limit})]

    def _requeue_rows(
        self, ids: Sequence[UUID] | None, type: str | None, limit: int, dead_before: datetime | None
    ) -> list[Job]:
        params: dict[str, Any] = {"p_ids": [str(i) for i in ids] if ids is not None else None, "p_type": type}
        params |= {"p_limit": limit, "p_dead_before": dead_before.isoformat() if dead_before else None}
        return [_job(r) for r in self._rows("jobkit_requeue", params)]

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

    def _stats_rows(self, after: tuple[str, str] | None, limit: int) -> list[StatsRow]:
        type_, status = after or (None, None)
        params = {"p_after_type": type_, "p_after_status": status, "p_limit": limit}
        return [StatsRow.model_validate(r) for r in self._rows("jobkit_stats", params)]

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
