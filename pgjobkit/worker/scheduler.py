"""The scheduler: enqueues each schedule's jobs when they are due.

Any number of schedulers may run against one store (every ``pgjobkit worker`` runs one): each reads the
schedules and the database's clock, computes the due times after each schedule's ``last_due_at``, and
hands them to ``fire_schedule``, which enqueues them and moves ``last_due_at`` under the schedule's lock
only if no other scheduler moved it first. So each due time is enqueued once, and a scheduler that loses
the race enqueues nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from pgjobkit.core.schedules import MAX_FIRE
from pgjobkit.errors import InvalidArgument, JobkitError, NotAvailable, TransientError
from pgjobkit.ops import schedules as schedule_ops
from pgjobkit.stores.base_async import AsyncJobStore
from pgjobkit.worker.calls_async import AsyncWorkerCalls

log = logging.getLogger("pgjobkit.worker.scheduler")
IDLE_CHECK = 5.0  # seconds between looks for schedules while there are none


class Scheduler:
    """Enqueues the jobs of ``store``'s schedules when due; ``check_every`` caps the sleep between looks
    (so a new or changed schedule is seen within it)."""

    def __init__(self, store: AsyncJobStore, *, check_every: float = 1.0) -> None:
        if not check_every > 0:
            raise InvalidArgument("jobkit: check_every must be > 0 seconds")
        self.store = store
        self.check_every = check_every
        self._bad: set[tuple[str, str, str]] = set()  # schedules whose cron did not parse, logged once

    def __repr__(self) -> str:
        return f"Scheduler(store={self.store!r})"

    async def atick(self) -> tuple[int, float]:
        """Fire every schedule that is due: (jobs enqueued, seconds until the next due time or look)."""
        schedules, now = await self.store.run(schedule_ops.list_schedules(self.store.dialect))
        if now is None:
            return 0, IDLE_CHECK
        enqueued, wait = 0, self.check_every
        for schedule in schedules:
            if not schedule.enabled or schedule.last_due_at is None:
                continue
            try:
                # in a thread: catching up on a long gap computes many due times, off the event loop
                due = await asyncio.to_thread(schedule.due, now)
                fired = (
                    await AsyncWorkerCalls(self.store).fire_schedule(schedule.name, schedule.last_due_at, due)
                    if due
                    else None
                )
            except TransientError:
                raise
            except JobkitError as exc:  # a cron that does not parse, a job the database refuses
                if (schedule.name, schedule.cron, schedule.timezone) not in self._bad:
                    self._bad.add((schedule.name, schedule.cron, schedule.timezone))
                    log.error("schedule %r is skipped: %s", schedule.name, exc)
                continue
            if fired is not None:
                enqueued += fired.enqueued
                schedule = schedule.model_copy(update={"last_due_at": fired.last_due_at})
                if fired.fired and len(due) == MAX_FIRE:
                    wait = 0.0  # catching up: more are due
            wait = min(wait, (schedule.next_due(now) - now).total_seconds())
        return enqueued, max(wait, 0.0)

    async def arun(self, stop: asyncio.Event) -> None:
        """Fire schedules until ``stop`` is set; store errors are logged and retried (the worker beside it
        is what stops on a wrong key or a missing migration)."""
        while not stop.is_set():
            try:
                _, wait = await self.atick()
            except TransientError as exc:
                log.warning("scheduler: store error (%s); retrying", exc)
                wait = self.check_every
            except NotAvailable as exc:  # a store without cron schedules (JetStream): nothing to fire
                log.info("scheduler: schedules are not run here: %s", exc)
                return
            except JobkitError as exc:  # not a schedule's own fault (those are skipped): try again later
                log.error("scheduler: %s; trying again in %.0f s", exc, IDLE_CHECK)
                wait = IDLE_CHECK
            # a little past the due time, so the database's clock has reached it too
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait + 0.005)
