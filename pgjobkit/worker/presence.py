"""A running worker's row in jobkit_workers: a report (jobkit_worker_beat) when it starts, one every
``interval`` seconds, and a last one when it stops, after which its row is deleted. Each report carries the
attempts ended since the last one (``pgjobkit.core.workers.Activity``). A report that fails is logged and
its activity kept for the next: a worker never stops over its reports."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Sequence

from pgjobkit.core.workers import Activity
from pgjobkit.errors import JobkitError
from pgjobkit.stores.base_async import AsyncJobStore
from pgjobkit.version import __version__
from pgjobkit.worker.results import error_text
from pgjobkit.worker.telemetry import Telemetry

log = logging.getLogger("pgjobkit.worker")
STALE_BEATS = 6  # a worker silent for this many intervals (at least 30 s) counts as gone


class Presence:
    """Beats for the worker ``name`` (claiming ``types``, ``concurrency`` at once) through ``store``, each
    with what ``activity`` tallied since the last."""

    def __init__(
        self,
        store: AsyncJobStore,
        name: str,
        *,
        types: Sequence[str],
        concurrency: int,
        telemetry: Telemetry,
        activity: Activity,
        interval: float,
    ) -> None:
        self.store, self.name, self.types, self.concurrency = store, name, list(types), concurrency
        self.telemetry, self.activity, self.interval = telemetry, activity, interval
        self.stale = min(max(interval * STALE_BEATS, 30.0), 86400.0)
        self.host, self.pid = socket.gethostname()[:200], os.getpid()

    async def run(self, stop: asyncio.Event) -> None:
        """Report until ``stop`` is set, then once more, and leave."""
        while not stop.is_set():
            await self.report()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await stop.wait()
        await self.report()
        try:
            await self.store.worker_stop(self.name)
        except JobkitError as exc:
            log.warning(
                "worker %s: its row was not deleted (%s); it goes once stale", self.name, error_text(exc)
            )

    async def report(self) -> None:
        """One report: the worker's row, and the activity since the last (kept for the next if it fails)."""
        activity = self.activity.take()
        try:
            await self.store.worker_beat(
                self.name,
                host=self.host,
                pid=self.pid,
                version=__version__,
                types=self.types,
                concurrency=self.concurrency,
                stale_seconds=self.stale,
                activity=activity,
            )
        except JobkitError as exc:
            self.activity.give_back(activity)
            log.warning("worker %s: beat not recorded (%s)", self.name, error_text(exc))
        if self.telemetry.otel is not None:  # its queue-depth gauge reads what the latest read found
            with contextlib.suppress(JobkitError):
                await self.telemetry.read_depth(self.store)
