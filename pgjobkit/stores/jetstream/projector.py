"""The users' view of a JetStream queue: every job's newest record written into a database's jobkit_jobs
(``jobkit_project``, pgjobkit/sql/schema/75_projection.sql), so that a signed-in user's listing (RLS),
``UserJobs``, stats and Realtime work for its jobs as they do for Postgres's own.

A record JetStream emptied (a job without a user, deleted on success: ``delete_succeeded``) deletes its
row. Each partition's stream has one durable consumer of its records (``<stream>_<name>``, every record subject,
from the first), which the projector pulls in batches: the batch's newest record of each job is written
(its stream sequence is its version, and the database writes only a newer one), then the batch is acked.
A projector that stops or crashes before its ack gets the batch again (after ``ack_wait``), and writing it
again changes nothing; a stream keeps one message a subject, so a projector that was away reads each job's
newest record once, not its history. Several projectors may share the consumer (each batch goes to one).

Lag: a record is written within ``wait`` of its write on JetStream plus one database call, when the
projector keeps up (measured in docs/operations/jetstream.md). A record the database refuses (a user_id
that is not in its auth.users, a key a live job of the database's own holds, a record that is not a job)
is passed over with a warning naming the job; the other jobs of its batch are written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from pydantic import ValidationError

from pgjobkit.core.models import Job
from pgjobkit.errors import JobkitError, TransientError
from pgjobkit.ops.projection import project
from pgjobkit.stores.base_async import AsyncJobStore
from pgjobkit.stores.jetstream.passes import keep_passing
from pgjobkit.stores.jetstream.store import AsyncJetStreamStore
from pgjobkit.stores.jetstream.wire import Wire

log = logging.getLogger("pgjobkit.projector")


@dataclass(frozen=True)
class Pass:
    """One pass over every partition: the records read and the jobs written (a job is not written when
    the database holds its version, or a newer one)."""

    read: int
    written: int


class Projector:
    """Writes the jobs of ``source`` into ``target`` (a Postgres or Supabase store, service role), each
    record only where it is newer. ``batch``: records a partition answers a pass (at most 1000);
    ``wait``: seconds a pass waits for a first record; ``name``: the consumer's (one a database);
    ``ack_wait``: seconds after which a batch a projector took and did not ack (it stopped) goes to another
    pass."""

    def __init__(
        self,
        source: AsyncJetStreamStore,
        target: AsyncJobStore,
        *,
        batch: int = 500,
        wait: float = 0.25,
        name: str = "projector",
        ack_wait: float = 5.0,
    ) -> None:
        if not 1 <= batch <= 1000:
            raise ValueError(f"jobkit: a projector's batch must be 1 to 1000 (got {batch})")
        self.source, self.target = source, target
        self.batch, self.wait, self.name, self.ack_wait = batch, wait, name, ack_wait
        self._pulls: list[tuple[Wire, Any]] = []  # each partition's wire and pull subscription

    async def _subscriptions(self) -> list[tuple[Wire, Any]]:
        if not self._pulls:
            for wire in await self.source.wires():
                durable = await wire.durable(
                    f"{wire.layout.stream}_{self.name}",
                    {
                        "filter_subject": wire.layout.records,
                        "ack_policy": "explicit",
                        "ack_wait": int(self.ack_wait * 1_000_000_000),
                        "max_deliver": -1,
                        "max_ack_pending": 10 * self.batch,
                        "deliver_policy": "all",
                        "description": "jobkit's projection of the jobs into a database",
                    },
                )
                sub = await wire.js.pull_subscribe_bind(durable=durable, stream=wire.layout.stream)
                self._pulls.append((wire, sub))
        return self._pulls

    async def once(self, wait: float = 0.0) -> Pass:
        """One pass: up to ``batch`` records of each partition (waiting up to ``wait`` seconds for a first),
        written, then acked. A database that does not answer (TransientError) is raised, the records left
        unacked to come again."""
        pulls = await self._subscriptions()
        batches = await asyncio.gather(
            *(wire.pull(sub, self.batch, max(wait, 0.01), "a pull of the records") for wire, sub in pulls)
        )
        msgs = [m for got in batches for m in got]
        if not msgs:
            return Pass(0, 0)
        newest: dict[UUID, tuple[Job | UUID, int]] = {}
        for msg in msgs:
            seq = int(msg.metadata.sequence.stream)
            try:
                job: Job | UUID = (
                    Job.model_validate_json(msg.data) if msg.data else UUID(msg.subject.rsplit(".", 1)[1])
                )
            except (ValidationError, ValueError) as exc:
                log.warning("jobkit: the record %s is not a job, passed over: %s", msg.subject, _first(exc))
                continue
            job_id = _id(job)
            held = newest.get(job_id)
            if held is None or held[1] < seq:
                newest[job_id] = (job, seq)
        written = await self._write(list(newest.values()))
        for msg in msgs:
            await msg.ack()
        return Pass(len(msgs), written)

    async def _write(self, jobs: Sequence[tuple[Job | UUID, int]]) -> int:
        """Write ``jobs`` in one call; when the database refuses it, each alone, so that only the one it
        refuses is passed over (said in the log). A fault that passes is raised."""
        if not jobs:
            return 0
        try:
            return len(await self.target.run(project(self.target.dialect, jobs)))
        except TransientError:
            raise
        except JobkitError as exc:
            if len(jobs) == 1:
                log.warning("jobkit: job %s not projected, the database refused it: %s", _id(jobs[0][0]), exc)
                return 0
        return sum([await self._write([one]) for one in jobs])

    async def drain(self) -> int:
        """Passes until one reads nothing: the jobs written."""
        total = 0
        while (done := await self.once()).read:
            total += done.written
        return total

    async def run(self, stop: asyncio.Event) -> None:
        """Passes until ``stop`` is set, each waiting up to ``wait`` for a record; a database or cluster that
        does not answer is waited out (said in the log), the records left to come again."""
        await keep_passing(stop, lambda: self.once(self.wait), log, "the projection")

    async def close(self) -> None:
        for _, sub in self._pulls:
            await sub.unsubscribe()
        self._pulls.clear()


def _first(exc: ValueError) -> str:
    if not isinstance(exc, ValidationError):
        return str(exc)
    error = exc.errors()[0]
    return f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"


def _id(job: Job | UUID) -> UUID:
    return job if isinstance(job, UUID) else job.id
