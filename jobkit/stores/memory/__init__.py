"""MemoryStore: the whole JobStore in process, a product for users' tests; AsyncMemoryStore, its async view.

It runs the same ``jobkit.ops`` operations as the SQL stores: its transport is an in-process version of
each ``jobkit_*`` SQL function, driven by ``jobkit.core``, with the same argument checks and the same
per-call limits (1000 rows, 10,000 jobs), so the operations' splitting and paging run here too. Thread-
safe; inspect it with ``jobs()``, reset it with ``reset()``, and pass ``clock`` to control time. It passes
the contract suite the SQL stores pass (tests/contract/); the one thing it cannot check is that a
``user_id`` exists in ``auth.users``.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from jobkit.core import transitions
from jobkit.core.models import Job, JobStatus
from jobkit.errors import InvalidArgument
from jobkit.ops import MAX_ROWS, Call, Codec
from jobkit.stores.base import JobStore
from jobkit.stores.base_async import AsyncJobStore
from jobkit.stores.memory.admin import KEY_FREED, OperatorFunctions, Row, check_pairs, check_results, row_of
from jobkit.stores.memory.flow_control import FlowFunctions, fair_key


def _utcnow() -> datetime:
    return datetime.now(UTC)


class _Unsubscribe:
    def __init__(self, store: MemoryStore, wake: Callable[[], None]) -> None:
        self._store, self._wake = store, wake

    def close(self) -> None:
        with self._store._lock:
            if self._wake in self._store._listeners:
                self._store._listeners.remove(self._wake)


class MemoryStore(OperatorFunctions, FlowFunctions, JobStore):
    """An in-process JobStore. ``clock`` returns the current time (timezone-aware); default: UTC now."""

    codec = Codec(job=Job.from_row, time=lambda value: value)

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self._clock = clock or _utcnow
        self._lock = threading.RLock()
        self._jobs: dict[UUID, Job] = {}
        self._live_keys: dict[str, UUID] = {}
        self._listeners: list[Callable[[], None]] = []
        self._limits: dict[str, dict[str, Any]] = {}
        self._starts: dict[str, list[datetime]] = {}
        self._schedules: dict[str, dict[str, Any]] = {}

    def __repr__(self) -> str:
        return f"MemoryStore(jobs={len(self._jobs)})"

    def as_async(self) -> AsyncMemoryStore:
        return AsyncMemoryStore(self)

    # --- inspection, for tests -------------------------------------------------------------------
    def jobs(self) -> list[Job]:
        """Every job, oldest first."""
        with self._lock:
            return sorted(self._jobs.values(), key=lambda j: (j.created_at, str(j.id)))

    def reset(self) -> None:
        """Forget every job, limit and schedule."""
        with self._lock:
            self._jobs.clear()
            self._live_keys.clear()
            self._limits.clear()
            self._starts.clear()
            self._schedules.clear()

    def listen(self, wake: Callable[[], None]) -> _Unsubscribe:
        with self._lock:
            self._listeners.append(wake)
        return _Unsubscribe(self, wake)

    def close(self) -> None:
        with self._lock:
            self._listeners.clear()

    # --- the transport: jobkit's SQL functions, in process ---------------------------------------
    def _execute(self, call: Call, conn: Any = None) -> Any:
        fn = getattr(self, "_" + call.fn.removeprefix("jobkit_"))
        woken: list[Callable[[], None]] = []
        with self._lock:
            answer = fn(self._clock(), woken, **{k: v for k, (_, v) in call.args.items()})
        for wake in woken:
            wake()
        return answer

    def _put(self, job: Job) -> None:
        old = self._jobs.get(job.id)
        if old is not None and old.idempotency_key is not None and old.status not in KEY_FREED:
            self._live_keys.pop(old.idempotency_key, None)
        self._jobs[job.id] = job
        if job.idempotency_key is not None and job.status not in KEY_FREED:
            self._live_keys[job.idempotency_key] = job.id

    def _apply(self, outcome: transitions.Transition) -> Job | None:
        if isinstance(outcome, transitions.Applied):
            self._put(outcome.job)
            return outcome.job
        return None

    def _wake(self, woken: list[Callable[[], None]]) -> None:
        woken.extend(self._listeners)

    def _insert(self, now: datetime, new: Mapping[str, Any], fair_round: int) -> tuple[Job, bool]:
        key = new.get("idempotency_key")
        held = self._live_keys.get(key) if key is not None else None
        if held is not None:
            return self._jobs[held], False
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
        self._put(job)
        return job, True

    def _enqueue(self, now: datetime, woken: list[Callable[[], None]], **args: Any) -> list[Row]:
        new = {k.removeprefix("p_"): v for k, v in args.items()}
        job, inserted = self._insert(now, new, self.fair_rounds(now, [new])[0])
        if inserted and job.run_after <= now:
            self._wake(woken)
        return [row_of(job, inserted=inserted)]

    def _enqueue_many(self, now: datetime, woken: list[Callable[[], None]], p_jobs: list[Any]) -> list[Row]:
        if len(p_jobs) > transitions.BATCH_LIMIT:
            raise InvalidArgument(f"jobkit: p_jobs holds {len(p_jobs)} jobs; at most 10000 per call")
        rounds = self.fair_rounds(now, p_jobs)
        out = [(ord_, *self._insert(now, new, rounds[ord_ - 1])) for ord_, new in enumerate(p_jobs, 1)]
        if any(inserted and job.run_after <= now for _, job, inserted in out):
            self._wake(woken)
        return [row_of(job, ord=ord_, inserted=inserted) for ord_, job, inserted in out]

    def _claim(
        self,
        now: datetime,
        woken: list[Callable[[], None]],
        p_types: tuple[str, ...],
        p_worker: str,
        p_lease_seconds: float,
        p_limit: int,
        p_done_ids: list[UUID] | None = None,
        p_done_tokens: list[UUID] | None = None,
        p_done_results: dict[str, Any] | None = None,
        p_done_delete: bool = False,
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
                if self._complete_one(now, job_id, token, p_done_results, p_done_delete):
                    rows.append(dict.fromkeys(Job.model_fields) | {"id": job_id, "status": "succeeded"})
        self._reclaim_expired(now, woken, MAX_ROWS)
        need = min(limit, 999, MAX_ROWS - len(rows))
        if need < 1:
            return rows
        picked, rated = self._pick(now, tuple(p_types), need)
        claimed = [
            transitions.claim(job, now=now, worker=p_worker, lease=lease, token=uuid.uuid4())
            for job in picked
        ]
        for job in claimed:
            self._put(job)
            rows.append(row_of(job))
        self._log_starts(now, rated, claimed)
        return rows

    def _complete(
        self,
        now: datetime,
        woken: list[Callable[[], None]],
        p_ids: list[UUID],
        p_lease_tokens: list[UUID],
        p_results: dict[str, Any] | None = None,
        p_delete: bool = False,
    ) -> list[Row]:
        check_pairs(p_ids, p_lease_tokens, "p_ids", "p_lease_tokens")
        check_results(p_results)
        return [
            {"id": job_id, "ok": self._complete_one(now, job_id, token, p_results, p_delete)}
            for job_id, token in zip(p_ids, p_lease_tokens, strict=True)
        ]

    def _complete_one(
        self, now: datetime, job_id: UUID, token: UUID, results: dict[str, Any] | None, delete: bool
    ) -> bool:
        """jobkit_complete for one job: False when its lease was lost. With ``delete`` a job without an owner
        is deleted rather than kept."""
        result = (results or {}).get(str(job_id))
        job = self._apply(
            transitions.complete(self._jobs.get(job_id), token, now=now, job_id=job_id, result=result)
        )
        if job is not None and delete and job.user_id is None:
            self._drop(job_id)
        return job is not None

    def _progress(
        self,
        now: datetime,
        woken: list[Callable[[], None]],
        p_ids: list[UUID],
        p_lease_tokens: list[UUID],
        p_progress: list[float],
        p_messages: list[str | None],
    ) -> list[Row]:
        if (
            not len(p_ids) == len(p_lease_tokens) == len(p_progress) == len(p_messages)
            or len(p_ids) > MAX_ROWS
        ):
            raise InvalidArgument(
                "jobkit: p_ids, p_lease_tokens, p_progress and p_messages must be arrays of equal length "
                "(at most 1000)"
            )
        if any(not 0 <= f <= 1 for f in p_progress) or any(len(m or "") > 200 for m in p_messages):
            raise InvalidArgument(
                "jobkit: p_progress must be between 0 and 1, p_messages at most 200 characters"
            )
        rows = []
        for job_id, token, fraction, message in zip(
            p_ids, p_lease_tokens, p_progress, p_messages, strict=True
        ):
            outcome = transitions.progress(
                self._jobs.get(job_id), token, now=now, job_id=job_id, fraction=fraction, message=message
            )
            rows.append({"id": job_id, "ok": self._apply(outcome) is not None})
        return rows

    def _fail(
        self,
        now: datetime,
        woken: list[Callable[[], None]],
        p_id: UUID,
        p_lease_token: UUID,
        p_error: str,
        p_retry_delay_seconds: float,
        p_permanent: bool,
    ) -> list[Row]:
        outcome = transitions.fail(
            self._jobs.get(p_id),
            p_lease_token,
            now=now,
            job_id=p_id,
            error=p_error,
            retry_delay=timedelta(seconds=p_retry_delay_seconds),
            permanent=p_permanent,
        )
        job = self._apply(outcome)
        if job is None:
            return [{"id": p_id, "ok": False, "status": None, "attempts": None, "run_after": None}]
        return [
            {
                "id": p_id,
                "ok": True,
                "status": job.status,
                "attempts": job.attempts,
                "run_after": job.run_after,
            }
        ]

    def _heartbeat(
        self,
        now: datetime,
        woken: list[Callable[[], None]],
        p_ids: list[UUID],
        p_lease_tokens: list[UUID],
        p_lease_seconds: float,
    ) -> list[Row]:
        check_pairs(p_ids, p_lease_tokens, "p_ids", "p_lease_tokens")
        lease = timedelta(seconds=p_lease_seconds)
        rows = []
        for job_id, token in zip(p_ids, p_lease_tokens, strict=True):
            job = self._jobs.get(job_id)
            kept = self._apply(transitions.heartbeat(job, token, now=now, job_id=job_id, lease=lease))
            rows.append(
                {
                    "id": job_id,
                    "held": kept is not None,
                    "status": job.status if job is not None else None,
                    "lease_until": kept.lease_until if kept is not None else None,
                }
            )
        return rows

    def _release(
        self, now: datetime, woken: list[Callable[[], None]], p_id: UUID, p_lease_token: UUID
    ) -> list[Row]:
        job = self._apply(transitions.release(self._jobs.get(p_id), p_lease_token, now=now, job_id=p_id))
        if job is not None:
            self._wake(woken)
        return [{"id": p_id, "ok": job is not None}]

    def _reclaim_expired(self, now: datetime, woken: list[Callable[[], None]], p_limit: int) -> list[Row]:
        if p_limit < 1:
            raise InvalidArgument(f"jobkit: p_limit must be >= 1 (got {p_limit})")
        expired = sorted(
            (j for j in self._jobs.values() if transitions.is_expired(j, now)),
            key=lambda j: j.lease_until or now,
        )[: min(p_limit, MAX_ROWS)]
        out = []
        for job in expired:
            new = transitions.reclaim(job, now=now)
            self._put(new)
            out.append({"id": new.id, "status": new.status, "attempts": new.attempts})
        return out


class AsyncMemoryStore(AsyncJobStore):
    """The async view of a MemoryStore (a new one by default): the same jobs, from coroutines."""

    codec = MemoryStore.codec

    def __init__(self, store: MemoryStore | None = None) -> None:
        self.sync = store or MemoryStore()

    async def _execute(self, call: Call, conn: Any = None) -> Any:
        return self.sync._execute(call)  # in process and brief: nothing to wait for

    async def listen(self, wake: Callable[[], None]) -> _AsyncUnsubscribe:
        loop = asyncio.get_running_loop()

        def on_loop() -> None:
            loop.call_soon_threadsafe(wake)

        return _AsyncUnsubscribe(self.sync.listen(on_loop))


class _AsyncUnsubscribe:
    def __init__(self, inner: _Unsubscribe) -> None:
        self._inner = inner

    async def close(self) -> None:
        self._inner.close()
