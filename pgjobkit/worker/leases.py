"""The leases of a worker's running jobs: a heartbeat extends those past a third of their time, writes the
progress handlers report (the latest of each job, at most once a second), and stops the handler of a job
that is no longer this worker's (cancelled, or reclaimed after its lease ran out)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

from pgjobkit.errors import JobkitError
from pgjobkit.stores.base_async import AsyncJobStore
from pgjobkit.worker.calls_async import AsyncWorkerCalls
from pgjobkit.worker.context import Attempt
from pgjobkit.worker.executor import JobExecutor
from pgjobkit.worker.registry import Handler
from pgjobkit.worker.results import error_text

log = logging.getLogger("pgjobkit.worker")
PROGRESS_EVERY = 1.0  # seconds between progress writes: a chatty handler writes a row a second at most


class Leases:
    """The heartbeat of ``executor``'s running jobs against ``store``; ``lease_of`` gives each job's lease
    (its handler's, or the worker's)."""

    def __init__(
        self, store: AsyncJobStore, executor: JobExecutor, lease_of: Callable[[Handler], timedelta]
    ) -> None:
        self.calls, self.executor, self.lease_of = AsyncWorkerCalls(store), executor, lease_of

    def run(self, leases: Sequence[timedelta], *, extend: bool = True) -> asyncio.Task[None]:
        """A task writing progress every PROGRESS_EVERY seconds and, with ``extend``, extending leases often enough
        for the shortest of ``leases`` (every sixth of it, at most 5 s); cancel it to stop."""
        interval = min(5.0, max(0.05, min(lease.total_seconds() for lease in leases) / 6))
        tick = min(interval, PROGRESS_EVERY)

        async def loop() -> None:
            due = time.monotonic() + interval
            while True:
                await asyncio.sleep(tick)
                await self.write_progress()
                if extend and time.monotonic() >= due:
                    due += interval
                    await self.extend()

        return asyncio.get_running_loop().create_task(loop(), name="jobkit-heartbeat")

    async def extend(self) -> None:
        """One heartbeat for every running job, one call per lease: leases past a third are extended, and
        a job that is no longer this worker's (cancelled, reclaimed) has its handler stopped."""
        groups: dict[timedelta, list[Attempt]] = {}
        for r in self.executor.running_jobs():
            if not r.lost:
                groups.setdefault(self.lease_of(r.handler), []).append(r)
        for lease, runs in groups.items():
            try:
                beats = await self.calls.heartbeat([(r.job.id, r.lease_token) for r in runs], lease)
            except JobkitError as exc:
                log.warning("heartbeat failed (%s); will try again", error_text(exc))
                continue
            for r in runs:
                beat = beats.get(r.job.id)
                if beat is not None and not beat.held:
                    self.executor.lose(r, beat.status)  # if it still runs

    async def write_progress(self) -> None:
        """Write the latest progress each running job reported since the last call, in one call."""
        reports = []
        for r in self.executor.running_jobs():
            if r.progress is not None and not r.lost:
                (fraction, message), r.progress = r.progress, None
                reports.append((r.job.id, r.lease_token, fraction, message))
        if not reports:
            return
        try:
            await self.calls.progress(reports)
        except JobkitError as exc:
            log.warning("progress of %d job(s) not recorded (%s)", len(reports), error_text(exc))
