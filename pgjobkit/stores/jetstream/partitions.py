"""A queue of P partitions: P streams, each with its own leader, behind the one ``Functions.table``.

**The rule.** A job's partition follows from its id, ``id.int % P``, so every call that names a job (complete,
fail, heartbeat, progress, release, cancel, requeue, get) goes straight to its stream. A new job's id is
drawn for the partition chosen for it: a job with an idempotency key goes to the key's partition
(``sha256(key) % P``), so the key's record and the job's are written in one atomic batch of one stream and a
key stays unique across the whole queue, as on PostgreSQL; a job without a key goes to the next partition
in turn. Every type is spread over every partition, so one busy type's writes are spread too, and a claim
pulls from all of them at once.

**What P changes.** ``enqueue_many`` is atomic per partition (one batch each, written concurrently): a call
whose jobs fall in several partitions can be refused in one and stored in another. A claim of ``limit``
jobs asks every partition at once for ``limit / P`` rounded up and takes at most ``limit`` (a surplus
dispatch is nak'ed: delivered again at once), so it finds a ready job in any partition, and returns fewer
than are ready when they sit in fewer partitions than P (the worker's next claim takes the rest). Its jobs
are answered oldest first; across claims the order is first in, first out within each partition, and
across partitions only as near as each claim's share of every partition makes it. Scans
(stats, requeue of all, reclaim_expired) read every partition. P is fixed when the queue is created: each
stream's metadata names it, and a store opened with another P stops at its first call, saying so.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from uuid import UUID

from pgjobkit.core import transitions
from pgjobkit.core.bounds import BATCH_LIMIT, MAX_ROWS
from pgjobkit.core.models import Job
from pgjobkit.errors import InvalidArgument, JobNotFound
from pgjobkit.stores.jetstream.functions import (
    CHANGES,
    Budget,
    Functions,
    check_many,
    done_rows,
    table,
    to_requeue,
)
from pgjobkit.stores.memory.admin import stats_rows

Row = dict[str, Any]


def id_partition(job_id: UUID, partitions: int) -> int:
    return job_id.int % partitions


def key_partition(key: str, partitions: int) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % partitions


def id_drawer(k: int, partitions: int) -> Callable[[], UUID]:
    """New ids of partition ``k``: random ids drawn until one falls in it (P draws on average)."""

    def draw() -> UUID:
        while True:
            job_id = uuid.uuid4()
            if job_id.int % partitions == k:
                return job_id

    return draw


class Partitions:
    """The calls of a partitioned queue on ``parts`` (one ``Functions`` a partition, in order)."""

    def __init__(self, parts: Sequence[Functions]) -> None:
        self.parts = list(parts)
        self.count = len(self.parts)
        self._turn = itertools.count()
        self.table = parts[0].table | table(self, CHANGES)

    def of(self, job_id: UUID) -> Functions:
        return self.parts[id_partition(job_id, self.count)]

    def _for_new(self, item: Any) -> int:
        """A new job's partition: its key's, or (no key) the next in turn."""
        key = item.get("idempotency_key") if isinstance(item, dict) else None
        if isinstance(key, str):
            return key_partition(key, self.count)
        return next(self._turn) % self.count

    async def _by_id(
        self,
        ids: Sequence[UUID],
        lists: Sequence[Sequence[Any]],
        call: Callable[..., Awaitable[list[Row]]],
    ) -> list[Row]:
        """``call(part, ids, *lists)`` on each partition with its ids (and the matching items of ``lists``),
        answering a row per id, the rows put back in the order of ``ids``. A call the stores refuse whole
        (lists of unequal length, more than MAX_ROWS ids) goes whole to partition 0, which refuses it as
        one stream does."""
        if any(len(items) != len(ids) for items in lists) or len(ids) > MAX_ROWS:
            return await call(self.parts[0], list(ids), *(list(items) for items in lists))
        where: dict[int, list[int]] = {}
        for n, job_id in enumerate(ids):
            where.setdefault(id_partition(job_id, self.count), []).append(n)
        answers = await asyncio.gather(
            *(
                call(self.parts[k], [ids[n] for n in ns], *([items[n] for n in ns] for items in lists))
                for k, ns in where.items()
            )
        )
        out: list[Row | None] = [None] * len(ids)
        for ns, rows in zip(where.values(), answers, strict=True):
            for n, row in zip(ns, rows, strict=True):
                out[n] = row
        return [row for row in out if row is not None]

    # --- enqueue ---------------------------------------------------------------------------------------------
    async def enqueue(self, **args: Any) -> list[Row]:
        k = self._for_new({"idempotency_key": args.get("p_idempotency_key")})
        return await self.parts[k].enqueue(**args)

    async def enqueue_many(self, p_jobs: Any) -> list[Row]:
        check_many(p_jobs)
        where: dict[int, list[int]] = {}
        for n, item in enumerate(p_jobs):
            where.setdefault(self._for_new(item), []).append(n)
        answers = await asyncio.gather(
            *(self.parts[k].insert([p_jobs[n] for n in ns]) for k, ns in where.items())
        )
        out: list[tuple[Job, bool] | None] = [None] * len(p_jobs)
        for ns, inserted in zip(where.values(), answers, strict=True):
            for n, answer in zip(ns, inserted, strict=True):
                out[n] = answer
        return [
            {**job.__dict__, "ord": n, "inserted": new}
            for n, (job, new) in enumerate((answer for answer in out if answer is not None), 1)
        ]

    # --- a worker's calls -----------------------------------------------------------------------------------
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
    ) -> list[Row]:
        """The done jobs completed where they are, then every partition asked at once for its share of
        ``p_limit``, rounded up (``Functions.claim`` says what a claim does with each dispatch); the claims
        share one ``Budget``, so at most ``p_limit`` are taken and a surplus dispatch (at most one a
        partition) is nak'ed for the next claim. First without waiting, so that an empty partition never
        holds up the others' jobs, and again of the partitions that gave all they were asked while the
        claim is short (jobs spread unevenly, as keyed ones may be, are still claimed ``p_limit`` at a
        time); when none had any, a long poll of each."""
        transitions.check_claim(p_types, p_worker, p_lease_seconds, p_limit)
        rows: list[Row] = []
        if p_done_ids is not None or p_done_tokens is not None:
            done = await self.complete(p_done_ids or [], p_done_tokens or [], p_done_results, p_done_delete)
            rows += done_rows(done)
        need = min(p_limit, MAX_ROWS - len(rows))
        if need < 1:
            return rows
        budget, claimed = Budget(need), []
        for first in (0.0, None):  # what is there now, from every partition; else a long poll of each
            asked, wait = dict.fromkeys(range(self.count), -(-need // self.count)), first
            while asked and budget.left > 0:
                answers = await asyncio.gather(
                    *(
                        self.parts[k].claim(p_types, p_worker, p_lease_seconds, n, budget=budget, wait=wait)
                        for k, n in asked.items()
                    )
                )
                claimed += [row for answer in answers for row in answer]
                full = [k for (k, n), answer in zip(asked.items(), answers, strict=True) if len(answer) >= n]
                asked = dict.fromkeys(full, -(-budget.left // len(full))) if full else {}
                wait = 0.0  # the rest is asked of what is there now
            if claimed:
                break
        # each partition answers its oldest first; the claim answers all of them oldest first
        return rows + sorted(claimed, key=lambda row: row["created_at"])

    async def prune(self, p_older_than_seconds: float, p_statuses: Sequence[str], p_limit: int) -> int:
        """Each partition's, in turn, while the call's ``p_limit`` is not reached."""
        removed = 0
        for part in self.parts:
            if removed >= p_limit:
                break
            removed += await part.prune(p_older_than_seconds, p_statuses, p_limit - removed)
        return removed

    async def complete(
        self,
        p_ids: list[UUID],
        p_lease_tokens: list[UUID],
        p_results: dict[str, Any] | None = None,
        p_delete: bool = False,
    ) -> list[Row]:
        return await self._by_id(
            p_ids, [p_lease_tokens], lambda part, ids, tokens: part.complete(ids, tokens, p_results, p_delete)
        )

    async def fail(
        self, p_id: UUID, p_lease_token: UUID, p_error: str, *args: Any, **kwargs: Any
    ) -> list[Row]:
        return await self.of(p_id).fail(p_id, p_lease_token, p_error, *args, **kwargs)

    async def heartbeat(
        self, p_ids: list[UUID], p_lease_tokens: list[UUID], p_lease_seconds: float
    ) -> list[Row]:
        return await self._by_id(
            p_ids, [p_lease_tokens], lambda part, ids, tokens: part.heartbeat(ids, tokens, p_lease_seconds)
        )

    async def progress(
        self,
        p_ids: list[UUID],
        p_lease_tokens: list[UUID],
        p_progress: list[float],
        p_messages: list[str | None],
    ) -> list[Row]:
        return await self._by_id(p_ids, [p_lease_tokens, p_progress, p_messages], Functions.progress)

    async def release(self, p_id: UUID, p_lease_token: UUID) -> list[Row]:
        return await self.of(p_id).release(p_id, p_lease_token)

    # --- an operator's calls --------------------------------------------------------------------------------
    async def cancel(self, p_ids: list[UUID], p_reason: str | None) -> list[Row]:
        return await self._by_id(p_ids, [], lambda part, ids: part.cancel(ids, p_reason))

    async def requeue(
        self, p_ids: list[UUID] | None, p_type: str | None, p_limit: int, p_dead_before: Any
    ) -> list[Row]:
        """The dead jobs chosen as one stream chooses them (``to_requeue``) from the given ids' records or
        from every partition's, then requeued each on its partition."""
        transitions.check_limit(p_limit, "p_limit")
        if p_ids is not None:
            if len(p_ids) > BATCH_LIMIT:
                raise InvalidArgument(
                    f"jobkit: p_ids must be a one-dimensional array of at most {BATCH_LIMIT} job ids"
                )
            found = await asyncio.gather(*(self.of(i).wire.read(i) for i in p_ids))
            for job_id, (job, _) in zip(p_ids, found, strict=True):
                if job is None:
                    raise JobNotFound(f"jobkit: job {job_id} not found", job_id=job_id)
            candidates = [j for j, _ in found if j is not None]
        else:
            candidates = [job for part in await self._scans() for job in part]
        chosen = [j.id for j in to_requeue(candidates, p_type, p_limit, p_dead_before)]
        where: dict[int, list[UUID]] = {}
        for job_id in chosen:
            where.setdefault(id_partition(job_id, self.count), []).append(job_id)
        answers = await asyncio.gather(
            *(self.parts[k].requeue(ids, None, len(ids), None) for k, ids in where.items())
        )
        order = {job_id: n for n, job_id in enumerate(chosen)}  # a job a live key keeps dead answers no row
        return sorted((row for rows in answers for row in rows), key=lambda row: order[row["id"]])

    async def reclaim_expired(self, p_limit: int) -> list[Row]:
        """Partition after partition, until ``p_limit`` leases are reclaimed."""
        rows: list[Row] = []
        for part in self.parts:
            if len(rows) >= p_limit:
                break
            rows += await part.reclaim_expired(p_limit - len(rows))
        return rows

    async def stats(self, p_after_type: str | None, p_after_status: str | None, p_limit: int) -> list[Row]:
        jobs = [job for part in await self._scans() for job in part]
        return stats_rows(jobs, self.parts[0].clock(), p_after_type, p_after_status, p_limit)

    async def get(self, p_id: UUID) -> list[Row]:
        return await self.of(p_id).get(p_id)

    async def schema_version(self) -> str:
        """Partition 0's stream first (its metadata names the queue's partitions), then every other's: the
        first answer that is not partition 0's, if any."""
        first = await self.parts[0].schema_version()
        others = await asyncio.gather(*(part.schema_version() for part in self.parts[1:]))
        return next((v for v in others if v != first), first)

    async def _scans(self) -> list[list[Job]]:
        return [
            [job for job, _ in scanned] for scanned in await asyncio.gather(*(p.scan() for p in self.parts))
        ]

    async def close(self) -> None:
        for part in self.parts:
            await part.close()
