"""The outbox's relay: jobs an app enqueued in its own SQL transaction (``jobkit_outbox_enqueue``,
pgjobkit/sql/schema/76_outbox.sql) moved into the JetStream queue, oldest first, by their idempotency keys.

A pass takes up to ``batch`` waiting jobs, enqueues them on JetStream (``enqueue_many``: atomic up to 333
jobs, a partition's at a time), then removes them from the outbox. A pass repeated after a stop between
the two (or by a second relay) enqueues by the same keys, and JetStream answers the jobs the first made:
exactly once per key while its job is live. A job JetStream refuses (``InvalidArgument``, ``NotAvailable``)
stays in the outbox with its error, passed over by later passes; a fault that passes (``TransientError``)
leaves the whole pass to be done again.
"""

from __future__ import annotations

import asyncio
import logging

from pydantic import ValidationError

from pgjobkit.core.bounds import MAX_ROWS
from pgjobkit.core.models import NewJob
from pgjobkit.errors import InvalidArgument, JobkitError, TransientError
from pgjobkit.ops.projection import outbox_done, outbox_take
from pgjobkit.stores.base_async import AsyncJobStore
from pgjobkit.stores.jetstream.layout import MAX_ATOMIC_JOBS
from pgjobkit.stores.jetstream.passes import keep_passing
from pgjobkit.stores.jetstream.store import AsyncJetStreamStore

log = logging.getLogger("pgjobkit.relay")


class Relay:
    """Moves ``database``'s outbox into ``queue``. ``batch``: jobs a pass moves (at most 333, one atomic
    ``enqueue_many``)."""

    def __init__(self, database: AsyncJobStore, queue: AsyncJetStreamStore, *, batch: int = MAX_ATOMIC_JOBS):
        if not 1 <= batch <= MAX_ATOMIC_JOBS:
            raise ValueError(f"jobkit: a relay's batch must be 1 to {MAX_ATOMIC_JOBS} (got {batch})")
        self.database, self.queue, self.batch = database, queue, batch

    async def once(self) -> tuple[int, int]:
        """One pass: the jobs it moved (those JetStream already held by their keys included) and those it
        kept with their error."""
        taken = await self.database.run(outbox_take(min(self.batch, MAX_ROWS)))
        if not taken:
            return 0, 0
        errors: list[str | None] = []
        jobs: list[NewJob] = []
        for _, job in taken:
            try:
                jobs.append(NewJob.model_validate({k: v for k, v in job.items() if v is not None}))
                errors.append(None)
            except (InvalidArgument, ValidationError) as exc:
                errors.append(f"jobkit: not a job: {exc}")
        ready = [seq for (seq, _), error in zip(taken, errors, strict=True) if error is None]
        try:
            if jobs:
                await self.queue.enqueue_many(jobs)
        except TransientError:
            raise
        except JobkitError:  # one of them: each alone, so that only that one stays behind
            failed = dict(zip(ready, await _one_by_one(self.queue, jobs), strict=True))
            errors = [failed.get(seq, error) for (seq, _), error in zip(taken, errors, strict=True)]
        for (seq, _), error in zip(taken, errors, strict=True):
            if error is not None:
                log.warning(
                    "jobkit: outbox job %s not moved to JetStream, kept with its error: %s", seq, error
                )
        await self.database.run(outbox_done([seq for seq, _ in taken], errors))
        moved = sum(error is None for error in errors)
        return moved, len(errors) - moved

    async def drain(self) -> int:
        """Passes until the outbox holds nothing to move: the jobs moved."""
        total = 0
        while sum(done := await self.once()):
            total += done[0]
        return total

    async def run(self, stop: asyncio.Event, every: float = 0.25) -> None:
        """Drains every ``every`` seconds until ``stop`` is set; a database or cluster that does not answer
        is waited out (said in the log), the jobs left in the outbox to move."""
        await keep_passing(stop, self.drain, log, "the relay", every)


async def _one_by_one(queue: AsyncJetStreamStore, jobs: list[NewJob]) -> list[str | None]:
    out: list[str | None] = []
    for job in jobs:
        try:
            await queue.enqueue(job)
            out.append(None)
        except TransientError:
            raise
        except JobkitError as exc:
            out.append(str(exc))
    return out
