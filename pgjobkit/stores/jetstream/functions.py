"""jobkit's SQL functions on JetStream records: the calls of ``pgjobkit.ops`` this store executes, by the
SQL function's name (``Functions.table``), each deciding through ``pgjobkit.core``'s transitions and
writing by compare-and-set. The store's ``_execute`` dispatches a ``Call`` through the table; a call not in
it is refused (``NotAvailable``)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from nats.js import JetStreamContext
from nats.js.errors import APIError

from pgjobkit.core import transitions
from pgjobkit.core.bounds import (
    BATCH_LIMIT,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PRUNE_LIMIT,
    DEFAULT_STALE_SECONDS,
    MAX_PROGRESS_MESSAGE,
    MAX_ROWS,
)
from pgjobkit.core.job_rules import job_problem
from pgjobkit.core.models import FINISHED, RUNNABLE, Job, JobStatus, check_result
from pgjobkit.errors import InvalidArgument, JobNotFound, NotAvailable, TransientError
from pgjobkit.stores.jetstream.layout import (
    LAYOUT_VERSION,
    LOST_RACE,
    MAX_ATOMIC_JOBS,
    MAX_BATCH_MESSAGES,
    Layout,
    record_data,
)
from pgjobkit.stores.jetstream.wire import Message, Wire, log
from pgjobkit.stores.memory.admin import stats_rows
from pgjobkit.stores.memory.workers import check_beat
from pgjobkit.version import SCHEMA_VERSION

Row = dict[str, Any]
Clock = Callable[[], datetime]
Decide = Callable[[Job | None, datetime], Job | None]
KEY_FREED = frozenset({JobStatus.DEAD, JobStatus.CANCELLED})
RACES = 20  # compare-and-set rounds one change tries before it reports contention
KNOWN_LIMIT = 100_000  # running jobs whose last revision a store remembers


def not_available(what: str) -> NotAvailable:
    return NotAvailable(
        f"jobkit: {what} is not available on the JetStream store (pgjobkit.stores.jetstream); "
        "use PostgresStore or SupabaseStore for it"
    )


def utcnow() -> datetime:
    return datetime.now(UTC)


# the calls a partitioned queue routes by job (``partitions.Partitions``); the rest go to its first partition
CHANGES = (
    "enqueue",
    "enqueue_many",
    "claim",
    "complete",
    "fail",
    "heartbeat",
    "progress",
    "release",
    "cancel",
    "requeue",
    "reclaim_expired",
    "stats",
    "get",
    "schema_version",
    "prune",
)


def table(calls: object, names: Sequence[str]) -> dict[str, Callable[..., Awaitable[Any]]]:
    """The SQL function name of each of ``names`` (``jobkit_<name>``) to that method of ``calls``."""
    return {f"jobkit_{name}": getattr(calls, name) for name in names}


class Functions:
    """The calls, on ``wire``. ``claim_wait``: seconds a claim waits for a dispatch when none is there (a
    long poll: a dispatch published meanwhile is taken at once). ``ack_wait``: how long a fetched dispatch
    is held before JetStream delivers it again, which only covers the moment between its delivery and the
    claim's compare-and-set (the lease lives in the record)."""

    def __init__(
        self,
        wire: Wire,
        clock: Clock = utcnow,
        *,
        claim_wait: float = 0.1,
        ack_wait: float = 30.0,
        new_id: Callable[[], UUID] = uuid.uuid4,
    ) -> None:
        self.wire = wire
        self.new_id = new_id  # a new job's id (a partition's draws ids of its own: ``partitions``)
        self.layout: Layout = wire.layout
        self.clock = clock
        self.claim_wait = claim_wait
        self.ack_wait = ack_wait
        self._subs: dict[str, JetStreamContext.PullSubscription] = {}
        # the running jobs this store last wrote, with their revisions: a complete, fail or progress of one
        # tries its compare-and-set on them before reading the record (a stale guess loses the race, and
        # the record is read); a round trip fewer per job in the common case
        self._known: dict[UUID, tuple[Job, int]] = {}
        self.table = table(self, (*CHANGES, "worker_beat", "worker_stop", "list_limits"))

    # --- the one change loop ---------------------------------------------------------------------------------
    async def change(
        self, job_id: UUID, decide: Decide, *, arm: bool = True, remove: Callable[[Job], bool] | None = None
    ) -> tuple[Job | None, Job | None]:
        """Read the record, ``decide`` the new job from it (None or the same job: no change), write it by
        compare-and-set; on a lost race read again. (the job read, the job written or None). ``arm``: a won
        write is followed by the job's dispatch or schedule (``Wire.arm``); ``remove``: a new job it holds
        for is written as no record at all (``Wire.write``'s ``removed``)."""
        before, written, _ = await self.change_armed(job_id, decide, arm=arm, remove=remove)
        return before, written

    async def change_armed(
        self, job_id: UUID, decide: Decide, *, arm: bool = True, remove: Callable[[Job], bool] | None = None
    ) -> tuple[Job | None, Job | None, bool]:
        """``change``, and whether the job's arming was sent (False: it failed after the write won; what
        armed the job before, its old schedule or an unacked dispatch, looks again)."""
        known = self._known.pop(job_id, None)
        for _ in range(RACES):
            guessed = known is not None
            job, seq = known if known is not None else await self.wire.read(job_id)
            known = None
            now = self.clock()
            new = decide(job, now)
            if new is None or new is job:
                if guessed:  # nothing to write on what this store wrote last: confirm on the record
                    continue
                return job, None, True
            revision = await self.wire.write(new, seq, removed=remove is not None and remove(new))
            if revision is not None:
                self.remember(new, revision)
                armed = not arm
                if arm:
                    try:
                        await self.wire.arm(new, revision, now)
                        armed = True
                    except Exception:
                        log.exception("jobkit: job %s written but not armed", job_id)
                return job, new, armed
        raise TransientError(f"jobkit: job {job_id} changed {RACES} times while this call tried to change it")

    def remember(self, job: Job, revision: int) -> None:
        if job.status != JobStatus.RUNNING:
            return
        if len(self._known) >= KNOWN_LIMIT:  # jobs whose worker never came back for them
            self._known.clear()
        self._known[job.id] = (job, revision)

    # --- enqueue -------------------------------------------------------------------------------------------
    async def enqueue(self, **args: Any) -> list[Row]:
        new = {k.removeprefix("p_"): _as_json(v) for k, v in args.items()}
        problem = job_problem(new)
        if problem is not None:
            raise InvalidArgument(f"jobkit: {problem}")
        [(job, inserted)] = await self.insert([new])
        return [_row(job, inserted=inserted)]

    async def enqueue_many(self, p_jobs: Any) -> list[Row]:
        check_many(p_jobs)
        out = await self.insert(list(p_jobs))
        return [_row(job, ord=n, inserted=inserted) for n, (job, inserted) in enumerate(out, 1)]

    async def insert(self, news: list[Mapping[str, Any]]) -> list[tuple[Job, bool]]:
        """Insert ``news`` (jobkit_enqueue_many's objects) in one atomic batch: each its record and its
        dispatch (or schedule), and for a key its key record, by compare-and-set on what the key held when
        read. A key a live job holds (not dead, not cancelled, not pruned) answers that job, not inserted;
        the second of two jobs with one key in the call answers the first. A batch refused because a key
        moved meanwhile is planned again."""
        for item in news:
            if item.get("priority"):
                raise not_available("priority (claims follow dispatch order)")
            if item.get("fair_key") is not None:
                raise not_available("fair_key (fairness)")
        keys = sorted({str(k) for n in news if (k := n.get("idempotency_key")) is not None})
        for _ in range(RACES):
            now = self.clock()
            held = dict(zip(keys, await asyncio.gather(*(self._key_holder(k) for k in keys)), strict=True))
            out: list[tuple[Job, bool]] = []
            messages: list[Message] = []
            taken: dict[str, Job] = {}
            for item in news:
                key = item.get("idempotency_key")
                if key is not None:
                    holder, key_seq = held[key]
                    if holder is not None:
                        out.append((holder, False))
                        continue
                    if key in taken:
                        out.append((taken[key], False))
                        continue
                job = _new_job(item, now, self.new_id())
                if key is not None:
                    taken[key] = job
                    body = json.dumps({"key": key, "job": str(job.id)}).encode()
                    messages.append(
                        Message(
                            self.layout.key(key), body, {"Nats-Expected-Last-Subject-Sequence": str(key_seq)}
                        )
                    )
                messages.append(
                    Message(
                        self.layout.record(job.id),
                        record_data(job),
                        {"Nats-Expected-Last-Subject-Sequence": "0"},
                    )
                )
                arming = self.wire.arming(job, now)
                assert arming is not None
                messages.append(arming)
                out.append((job, True))
            if not messages:
                return out
            try:
                await self.wire.retrying("an enqueue", lambda _, batch=messages: self.wire.batch(batch))  # type: ignore[misc]
            except APIError as exc:
                if exc.err_code not in LOST_RACE:
                    raise
                # a key moved on between the read and the batch; or a retried batch met itself
                mine = [j for j, inserted in out if inserted]
                stored = await asyncio.gather(*(self.wire.last(self.layout.record(j.id)) for j in mine))
                if mine and all(data == record_data(j) for j, (data, _) in zip(mine, stored, strict=True)):
                    return out
                continue
            return out
        raise TransientError("jobkit: an enqueue's idempotency keys kept changing while it was written")

    async def _key_holder(self, key: str) -> tuple[Job | None, int]:
        """The live job that holds ``key`` (None: the key is free) and the key record's revision."""
        data, seq = await self.wire.last(self.layout.key(key))
        if not data:
            return None, seq
        held = json.loads(data)
        if held.get("key") != key:  # pragma: no cover - a SHA-256 collision
            raise InvalidArgument("jobkit: two idempotency keys share a digest on this store")
        job, _ = await self.wire.read(UUID(held["job"]))
        if job is None or job.status in KEY_FREED:
            return None, seq
        return job, seq

    # --- claim ---------------------------------------------------------------------------------------------
    async def claim(
        self,
        p_types: tuple[str, ...],
        p_worker: str,
        p_lease_seconds: float,
        p_limit: int,
        p_done_ids: list[UUID] | None = None,
        p_done_tokens: list[UUID] | None = None,
        p_done_results: dict[str, Any] | None = None,
        p_done_delete: bool = False,
        p_after: UUID | None = None,
        budget: Budget | None = None,
        wait: float | None = None,
    ) -> list[Row]:
        """Complete the done jobs (as jobkit_complete), then take up to ``p_limit`` dispatches of ``p_types``
        and claim each through its record. A dispatch whose job is not claimable is settled instead: an
        expired lease is reclaimed (and the job claimed, or dead), a job not due yet or still leased is armed
        again for when it is, a finished or missing one is dropped. Every dispatch is acked only after its
        record's write won, or was found not needed. ``budget``: claims shared with other partitions' (a
        dispatch taken when it is spent is nak'ed: delivered again at once); ``wait``: seconds to wait for a
        first dispatch (default ``claim_wait``)."""
        lease, limit = transitions.check_claim(p_types, p_worker, p_lease_seconds, p_limit)
        rows: list[Row] = []
        if p_done_ids is not None or p_done_tokens is not None:
            done = await self.complete(p_done_ids or [], p_done_tokens or [], p_done_results, p_done_delete)
            rows += done_rows(done)
        need = min(limit, MAX_ROWS - len(rows))
        wait = (self.claim_wait if wait is None else wait) / len(p_types)
        for type_ in p_types:
            if need < 1:
                break
            # a consumer created by this call (a cluster elects its leader first) gets the whole wait
            fresh = self.claim_wait / len(p_types) if type_ not in self._subs else 0.0
            msgs = await self._fetch(type_, need, max(wait, fresh, 0.01))
            claimed = await asyncio.gather(*(self._take(m, p_worker, lease, budget) for m in msgs))
            for job in claimed:
                if job is not None:
                    rows.append(_row(job))
                    need -= 1
        return rows

    async def _fetch(self, type: str, batch: int, wait: float) -> list[Any]:
        """Up to ``batch`` dispatches of ``type``, waiting up to ``wait`` seconds for a first one
        (``Wire.pull``). A pull nats-py leaves open past the call (``reference/jetstream-2.15.md``, pitfall
        2) delivers into this subscription's queue, which the next claim drains first; unclaimed, it is
        delivered again after ``ack_wait``."""
        return await self.wire.pull(await self._subscription(type), batch, wait, f"a pull of {type!r}")

    async def _subscription(self, type: str) -> JetStreamContext.PullSubscription:
        sub = self._subs.get(type)
        if sub is None:
            name = await self.wire.ensure_consumer(type, self.ack_wait)
            sub = await self.wire.js.pull_subscribe_bind(durable=name, stream=self.layout.stream)
            self._subs[type] = sub
        return sub

    async def close(self) -> None:
        for sub in self._subs.values():
            await sub.unsubscribe()
        self._subs.clear()

    async def _take(
        self, msg: Any, worker: str, lease: timedelta, budget: Budget | None = None
    ) -> Job | None:
        """One dispatch: the job it names, claimed (None: nothing to claim)."""
        if budget is not None and not budget.reserve():
            try:
                await msg.nak()  # this claim has all it asked for: the dispatch goes to the next claim now
            except Exception:  # delivered again after ack_wait
                log.warning("jobkit: a surplus dispatch's nak was lost")
            return None
        job = await self._claim_dispatch(msg, worker, lease)
        if budget is not None and job is None:
            budget.release()
        return job

    async def _claim_dispatch(self, msg: Any, worker: str, lease: timedelta) -> Job | None:
        job_id = UUID(msg.subject.rsplit(".", 1)[1])
        token = uuid.uuid4()

        def decide(job: Job | None, now: datetime) -> Job | None:
            if job is None or job.status in FINISHED or job.status == JobStatus.WAITING:
                return None
            if transitions.is_expired(job, now):
                job = transitions.reclaim(job, now=now)
                if job.status == JobStatus.DEAD:
                    return job
            if transitions.is_runnable(job, now):
                return transitions.claim(job, now=now, worker=worker, lease=lease, token=token)
            return None  # not due yet, or leased: armed again below

        try:
            before, written, armed = await self.change_armed(job_id, decide)
            if written is None and before is not None and before.status in (*RUNNABLE, JobStatus.RUNNING):
                current, seq = await self.wire.read(job_id)
                if current is not None:
                    await self.wire.arm(current, seq, self.clock())
        except Exception:
            log.exception("jobkit: dispatch of job %s not settled; JetStream delivers it again", job_id)
            return None
        if armed:  # else this unacked dispatch, delivered again after ack_wait, is the job's lease check
            try:
                await msg.ack()
            except Exception:  # delivered again after ack_wait, and found settled
                log.warning("jobkit: the ack of job %s's dispatch was lost", job_id)
        if written is not None and written.status == JobStatus.RUNNING and written.lease_token == token:
            return written
        return None

    # --- the running job's calls ----------------------------------------------------------------------------
    async def complete(
        self,
        p_ids: list[UUID],
        p_lease_tokens: list[UUID],
        p_results: dict[str, Any] | None = None,
        p_delete: bool = False,
    ) -> list[Row]:
        _check_pairs(p_ids, p_lease_tokens, "p_ids", "p_lease_tokens")
        for result in (p_results or {}).values():
            try:
                check_result(result)
            except ValueError as exc:
                raise InvalidArgument(f"jobkit: {exc}") from None

        async def one(job_id: UUID, token: UUID) -> Row:
            result = (p_results or {}).get(str(job_id))

            def decide(job: Job | None, now: datetime) -> Job | None:
                outcome = transitions.complete(job, token, now=now, job_id=job_id, result=result)
                return outcome.job if isinstance(outcome, transitions.Applied) else None

            # p_delete, as jobkit_complete: a job with no user is removed, a user's kept for them to read
            remove = (lambda job: job.user_id is None) if p_delete else None
            _, written = await self.change(job_id, decide, remove=remove)
            return {"id": job_id, "ok": written is not None}

        return list(await asyncio.gather(*(one(i, t) for i, t in zip(p_ids, p_lease_tokens, strict=True))))

    async def fail(
        self,
        p_id: UUID,
        p_lease_token: UUID,
        p_error: str,
        p_retry_delay_seconds: float,
        p_permanent: bool,
        p_max_attempts: int | None = None,
        p_traceback: str | None = None,
    ) -> list[Row]:
        delay = timedelta(seconds=p_retry_delay_seconds)
        transitions.check_retry_delay(delay)
        if p_max_attempts is not None:
            transitions.check_max_attempts(p_max_attempts)

        def decide(job: Job | None, now: datetime) -> Job | None:
            outcome = transitions.fail(
                job,
                p_lease_token,
                now=now,
                job_id=p_id,
                error=p_error,
                retry_delay=delay,
                permanent=p_permanent,
                max_attempts=p_max_attempts,
            )
            return outcome.job if isinstance(outcome, transitions.Applied) else None

        _, job = await self.change(p_id, decide)
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

    async def heartbeat(
        self, p_ids: list[UUID], p_lease_tokens: list[UUID], p_lease_seconds: float
    ) -> list[Row]:
        """Extends the record's lease; the schedule that checks it stays where it was and, when it fires
        before the new end, is armed again for it (one look per lease, not one write per beat)."""
        _check_pairs(p_ids, p_lease_tokens, "p_ids", "p_lease_tokens")
        lease = timedelta(seconds=p_lease_seconds)
        transitions.check_lease(lease)

        async def one(job_id: UUID, token: UUID) -> Row:
            def decide(job: Job | None, now: datetime) -> Job | None:
                outcome = transitions.heartbeat(job, token, now=now, job_id=job_id, lease=lease)
                return outcome.job if isinstance(outcome, transitions.Applied) else None

            for _ in range(RACES):
                job, seq = await self.wire.read(job_id)
                kept = decide(job, self.clock())
                if kept is None or kept is job:
                    break
                revision = await self.wire.write(kept, seq)
                if revision is not None:
                    self.remember(kept, revision)
                    job = kept
                    break
            else:
                raise TransientError(f"jobkit: job {job_id} kept changing during a heartbeat")
            return {
                "id": job_id,
                "held": kept is not None,
                "status": job.status if job is not None else None,
                "lease_until": kept.lease_until if kept is not None else None,
            }

        return list(await asyncio.gather(*(one(i, t) for i, t in zip(p_ids, p_lease_tokens, strict=True))))

    async def progress(
        self,
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
                f"(at most {MAX_ROWS})"
            )
        if any(not 0 <= f <= 1 for f in p_progress) or any(
            len(m or "") > MAX_PROGRESS_MESSAGE for m in p_messages
        ):
            raise InvalidArgument(
                f"jobkit: p_progress must be between 0 and 1, p_messages at most {MAX_PROGRESS_MESSAGE} characters"
            )

        async def one(job_id: UUID, token: UUID, fraction: float, message: str | None) -> Row:
            def decide(job: Job | None, now: datetime) -> Job | None:
                outcome = transitions.progress(
                    job, token, now=now, job_id=job_id, fraction=fraction, message=message
                )
                return outcome.job if isinstance(outcome, transitions.Applied) else None

            _, written = await self.change(job_id, decide, arm=False)
            return {"id": job_id, "ok": written is not None}

        reports = zip(p_ids, p_lease_tokens, p_progress, p_messages, strict=True)
        return list(await asyncio.gather(*(one(*r) for r in reports)))

    async def release(self, p_id: UUID, p_lease_token: UUID) -> list[Row]:
        def decide(job: Job | None, now: datetime) -> Job | None:
            outcome = transitions.release(job, p_lease_token, now=now, job_id=p_id)
            return outcome.job if isinstance(outcome, transitions.Applied) else None

        _, written = await self.change(p_id, decide)
        return [{"id": p_id, "ok": written is not None}]

    # --- an operator's calls ------------------------------------------------------------------------------
    async def cancel(self, p_ids: list[UUID], p_reason: str | None) -> list[Row]:
        if len(p_ids) > MAX_ROWS:
            raise InvalidArgument(f"jobkit: p_ids must be an array of at most {MAX_ROWS} ids")

        async def one(job_id: UUID) -> Row:
            before, written = await self.change(
                job_id, lambda job, now: transitions.cancel(job, now=now, reason=p_reason) if job else None
            )
            status = (written or before).status if (written or before) is not None else None  # type: ignore[union-attr]
            return {"id": job_id, "cancelled": written is not None, "status": status}

        return list(await asyncio.gather(*(one(i) for i in p_ids)))

    async def requeue(
        self, p_ids: list[UUID] | None, p_type: str | None, p_limit: int, p_dead_before: datetime | None
    ) -> list[Row]:
        """Dead jobs back to queued with fresh attempts. A job with a key takes it back in the same batch,
        unless a live job holds it now (then it stays dead, as on PostgreSQL)."""
        transitions.check_limit(p_limit, "p_limit")
        if p_ids is not None:
            if len(p_ids) > BATCH_LIMIT:
                raise InvalidArgument(
                    f"jobkit: p_ids must be a one-dimensional array of at most {BATCH_LIMIT} job ids"
                )
            found = await asyncio.gather(*(self.wire.read(i) for i in p_ids))
            for job_id, (job, _) in zip(p_ids, found, strict=True):
                if job is None:
                    raise JobNotFound(f"jobkit: job {job_id} not found", job_id=job_id)
            candidates = [j for j, _ in found if j is not None]
        else:
            candidates = [j for j, _ in await self.scan()]
        dead = to_requeue(candidates, p_type, p_limit, p_dead_before)
        out = await asyncio.gather(*(self._requeue_one(j.id) for j in dead))
        return [_row(j) for j in out if j is not None]

    async def _requeue_one(self, job_id: UUID) -> Job | None:
        for _ in range(RACES):
            job, seq = await self.wire.read(job_id)
            if job is None or job.status != JobStatus.DEAD:
                return None
            now = self.clock()
            new = transitions.requeue(job, now=now)
            arming = self.wire.arming(new, now)
            assert arming is not None
            messages = [
                Message(
                    self.layout.record(new.id),
                    record_data(new),
                    {"Nats-Expected-Last-Subject-Sequence": str(seq)},
                ),
                arming,
            ]
            if job.idempotency_key is not None:
                holder, key_seq = await self._key_holder(job.idempotency_key)
                if holder is not None and holder.id != job.id:
                    return None  # a live job holds its key now
                body = json.dumps({"key": job.idempotency_key, "job": str(job.id)}).encode()
                messages.insert(
                    0,
                    Message(
                        self.layout.key(job.idempotency_key),
                        body,
                        {"Nats-Expected-Last-Subject-Sequence": str(key_seq)},
                    ),
                )
            try:
                await self.wire.retrying("a requeue", lambda _, m=messages: self.wire.batch(m))  # type: ignore[misc]
            except APIError as exc:
                if exc.err_code not in LOST_RACE:
                    raise
                continue
            return new
        raise TransientError(f"jobkit: job {job_id} kept changing during a requeue")

    async def reclaim_expired(self, p_limit: int) -> list[Row]:
        """Expired leases found by a scan of every record (the schedules find them without one, at each
        lease's end): each job retrying at once, or dead when its attempts are used up."""
        if p_limit < 1:
            raise InvalidArgument(f"jobkit: p_limit must be >= 1 (got {p_limit})")
        now = self.clock()
        expired = sorted(
            (j for j, _ in await self.scan() if transitions.is_expired(j, now)),
            key=lambda j: j.lease_until or now,
        )[: min(p_limit, MAX_ROWS)]

        async def one(job_id: UUID) -> Row | None:
            _, new = await self.change(
                job_id,
                lambda job, now: (
                    transitions.reclaim(job, now=now) if job and transitions.is_expired(job, now) else None
                ),
            )
            return {"id": new.id, "status": new.status, "attempts": new.attempts} if new else None

        return [r for r in await asyncio.gather(*(one(j.id) for j in expired)) if r is not None]

    async def prune(
        self, p_older_than_seconds: float, p_statuses: Sequence[str], p_limit: int = DEFAULT_PRUNE_LIMIT
    ) -> int:
        """Finished jobs of ``p_statuses`` last updated longer ago than ``p_older_than_seconds``, at most
        ``p_limit``, oldest first, found by a scan of every record and removed as ``delete_succeeded``
        removes a job: each record written empty by compare-and-set (a job changed since the scan, requeued
        say, is left). The jobs removed."""
        older, statuses = transitions.check_prune(p_older_than_seconds, p_statuses, p_limit)
        cutoff = self.clock() - older
        doomed = sorted(
            (
                (job, seq)
                for job, seq in await self.scan()
                if job.status in statuses and job.updated_at < cutoff
            ),
            key=lambda found: found[0].updated_at,
        )[:p_limit]
        won = await asyncio.gather(*(self.wire.write(job, seq, removed=True) for job, seq in doomed))
        return sum(revision is not None for revision in won)

    async def stats(self, p_after_type: str | None, p_after_status: str | None, p_limit: int) -> list[Row]:
        """By a scan of every record (an ephemeral consumer reads the last message of each record subject)."""
        jobs = [job for job, _ in await self.scan()]
        return stats_rows(jobs, self.clock(), p_after_type, p_after_status, p_limit)

    async def worker_beat(
        self,
        p_worker: str,
        p_stale_seconds: float = DEFAULT_STALE_SECONDS,
        p_activity: Any = None,
        **_: Any,
    ) -> int:
        """Checked as on every store, then not kept (no worker registry on this store: list_workers is
        refused): a Worker's beats and its stop go on without a warning each time. No stale worker is
        deleted: 0."""
        check_beat(p_worker, p_stale_seconds, p_activity, self.clock())
        return 0

    async def worker_stop(self, **_: Any) -> bool:
        return False

    async def list_limits(self) -> list[Row]:
        """None: set_limit is refused here, so no limit exists (``pgjobkit stats`` reads them)."""
        return []

    async def get(self, p_id: UUID) -> list[Row]:
        job, _ = await self.wire.read(p_id)
        return [_row(job)] if job is not None else []

    async def schema_version(self) -> str:
        """The schema version this package needs (``version.SCHEMA_VERSION``) when the stream has the layout
        this code writes, so the worker's schema check passes; else the layout the stream names (and the
        worker says to migrate)."""
        layout = (await self.wire.metadata()).get("jobkit_layout", "unknown")
        return SCHEMA_VERSION if layout == LAYOUT_VERSION else layout

    async def scan(self) -> list[tuple[Job, int]]:
        """Every record, with its revision: an ephemeral consumer delivering the last message of each
        ``<p>.job.*`` subject, read to the end. O(jobs): stats, requeue of all and the reclaim scan use it."""
        return await self.wire.scan(self.layout.records)


class Budget:
    """How many jobs a claim spread over several partitions may still take (one event loop: no lock)."""

    def __init__(self, left: int) -> None:
        self.left = left

    def reserve(self) -> bool:
        if self.left < 1:
            return False
        self.left -= 1
        return True

    def release(self) -> None:
        self.left += 1


def done_rows(done: list[Row]) -> list[Row]:
    """A claim's rows for the jobs it completed first (jobkit_claim's ``p_done_ids``), as the SQL answers."""
    return [dict.fromkeys(Job.model_fields) | {"id": r["id"], "status": "succeeded"} for r in done if r["ok"]]


def to_requeue(
    candidates: list[Job], type: str | None, limit: int, dead_before: datetime | None
) -> list[Job]:
    """The dead jobs of ``candidates`` a requeue takes: of ``type`` (None: any), dead before
    ``dead_before`` (None: any time), oldest first, at most ``limit``."""
    return sorted(
        (
            j
            for j in candidates
            if j.status == JobStatus.DEAD
            and (type is None or j.type == type)
            and (dead_before is None or j.updated_at <= dead_before)
        ),
        key=lambda j: (j.updated_at, j.id.bytes),
    )[: min(limit, MAX_ROWS)]


def check_many(p_jobs: Any) -> None:
    """jobkit_enqueue_many's refusals, before anything is read or written: a JSON array of at most
    MAX_ATOMIC_JOBS valid job objects."""
    if not isinstance(p_jobs, list | tuple):
        raise InvalidArgument("jobkit: p_jobs must be a JSON array of job objects")
    if len(p_jobs) > BATCH_LIMIT:
        raise InvalidArgument(f"jobkit: p_jobs holds {len(p_jobs)} jobs; at most {BATCH_LIMIT} per call")
    for idx, item in enumerate(p_jobs):
        problem = job_problem(item)
        if problem is not None:
            raise InvalidArgument(f"jobkit: job {idx}: {problem}")
    if len(p_jobs) > MAX_ATOMIC_JOBS:
        raise InvalidArgument(
            f"jobkit: the JetStream store enqueues at most {MAX_ATOMIC_JOBS} jobs per enqueue_many, all or "
            f"nothing (one atomic batch of at most {MAX_BATCH_MESSAGES} messages); got {len(p_jobs)}: "
            "split them into several calls"
        )


def _check_pairs(ids: list[UUID], tokens: list[UUID], ids_name: str, tokens_name: str) -> None:
    if len(ids) != len(tokens) or len(ids) > MAX_ROWS:
        raise InvalidArgument(
            f"jobkit: {ids_name} and {tokens_name} must be arrays of equal length (at most {MAX_ROWS})"
        )


def _as_json(value: Any) -> Any:
    if isinstance(value, UUID):
        return str(value)
    return value.isoformat() if isinstance(value, datetime) else value


def _row(job: Job, **extra: Any) -> Row:
    return {**job.__dict__, **extra}


def _new_job(new: Mapping[str, Any], now: datetime, job_id: UUID) -> Job:
    run_after = new.get("run_after")
    if isinstance(run_after, str):
        run_after = datetime.fromisoformat(run_after)
    delay = new.get("delay_seconds")
    user_id = new.get("user_id")
    return Job(
        id=job_id,
        user_id=UUID(user_id) if isinstance(user_id, str) else user_id,
        type=new["type"],
        status=JobStatus.QUEUED,
        payload=new.get("payload") or {},
        idempotency_key=new.get("idempotency_key"),
        attempts=0,
        max_attempts=new.get("max_attempts") or DEFAULT_MAX_ATTEMPTS,
        priority=0,
        run_after=run_after or now + timedelta(seconds=delay or 0),
        created_at=now,
        updated_at=now,
    )
