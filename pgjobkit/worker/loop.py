"""The claim/complete loop of a run: round trips through the exchange while the executor runs the jobs
they claimed, sleeping until woken (a LISTEN notify, a finished job, stop()) or the poll interval, backing
off after transient store faults (any other store error ends the run); then, once stopped, the drain. A
tick is the same without the loop: one batch, claimed, run and completed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from pgjobkit.core.models import Job
from pgjobkit.errors import JobkitError, TransientError
from pgjobkit.stores.base_async import AsyncJobStore
from pgjobkit.version import check_schema
from pgjobkit.worker.exchange import FLUSH_AFTER, Exchange
from pgjobkit.worker.executor import JobExecutor
from pgjobkit.worker.results import error_text

log = logging.getLogger("pgjobkit.worker")


class Stopping:
    """How a run is told to stop, from any thread (``Worker.stop``, a signal): ``requested`` once asked to
    stop claiming, ``abandon`` once asked to give its in-flight jobs back too. A request wakes the run's
    loop while the run is ``reaching`` it."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.abandon = threading.Event()
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def clear(self) -> None:
        self.requested.clear()
        self.abandon.clear()

    def request(self, *, abandon: bool = False) -> None:
        self.requested.set()
        if abandon:
            self.abandon.set()
        if self._wake is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)

    @asynccontextmanager
    async def reaching(self, wake: asyncio.Event) -> AsyncIterator[None]:
        """A request sets ``wake``, on this loop, until exited."""
        self._wake, self._loop = wake, asyncio.get_running_loop()
        try:
            yield
        finally:
            self._loop = None


def fault_backoff(fault: TransientError, delay: float) -> float:
    """The wait after a store fault, ``delay`` the one before (0 for the first): doubling from 0.1 s to
    5 s, and logged."""
    delay = min(max(delay * 2, 0.1), 5.0)
    log.warning("store error (%s); retrying in %.1fs", error_text(fault), delay)
    return delay


async def sleep(wake: asyncio.Event, seconds: float) -> None:
    """Wait ``seconds``, or less when woken (a LISTEN notify, a finished job, stop())."""
    if wake.is_set():
        return
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):  # no task per wait, as wait_for would make
            await wake.wait()


async def stopped_within(stop: threading.Event, seconds: float) -> bool:
    """Wait ``seconds``, or less once ``stop`` (set from any thread) is set; whether it is."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not stop.is_set():
        await asyncio.sleep(0.05)
    return stop.is_set()


async def schema_checked(store: AsyncJobStore, stopping: Stopping, *, retry: bool = False) -> bool:
    """Refuse a database whose jobkit schema is not this jobkit's (what to run is in the error); whether it
    was checked. With ``retry``, a store that cannot be reached is asked again (backing off, as the loop
    does) until it answers or a stop is requested (False)."""
    delay = 0.0
    while True:
        try:
            check_schema(await store.schema_version())
            return True
        except TransientError as exc:
            if not retry:
                raise
            delay = fault_backoff(exc, delay)
            if await stopped_within(stopping.requested, delay):
                return False


async def tick(executor: JobExecutor, exchange: Exchange, limit: int) -> list[Job]:
    """One batch: claim up to ``limit`` jobs, run them, record how each ended and complete the successes;
    the jobs claimed."""
    jobs = await exchange.claim(limit)
    exchange.start(jobs)
    while executor.running_count or executor.has_outcomes:
        exchange.record_endings()
        if executor.running_count:
            await executor.wake.wait()
            executor.wake.clear()
    exchange.record_endings()
    await exchange.complete()
    await exchange.wind_down()
    await executor.wind_down()
    return jobs


@dataclass
class Loop:
    """A run's loop over ``exchange`` and ``executor``, until ``stopping`` is requested; asked to abandon
    too, it gives the jobs in flight back rather than finish them (``let_threads_go`` then gives up the sync
    handlers' threads, which cannot be stopped). ``on_fault`` hears of each transient store fault;
    ``poll_interval`` is the longest sleep while nothing wakes the loop."""

    executor: JobExecutor
    exchange: Exchange
    stopping: Stopping
    poll_interval: float
    on_fault: Callable[[TransientError], None]
    let_threads_go: Callable[[], None]

    async def run(self, *, max_jobs: int | None = None, until_empty: bool = False) -> int:
        """Claim and complete until stopped (or, with ``until_empty``, out of work, or ``max_jobs``
        claimed), then drain; the jobs claimed."""
        claimed = await self._until_stopped(max_jobs, until_empty)
        await self._drain()
        await self.exchange.wind_down()
        await self.executor.wind_down()
        return claimed

    async def _until_stopped(self, max_jobs: int | None, until_empty: bool) -> int:
        executor, exchange = self.executor, self.exchange
        claimed_total, fault_delay, rest = 0, 0.0, False
        wake = executor.wake
        try:
            while not self.stopping.requested.is_set():
                wake.clear()
                exchange.record_endings()
                fault: TransientError | None = None
                empty = False
                for answer in exchange.finished():  # any error but a transient one ends run()
                    if isinstance(answer, TransientError):
                        fault = answer
                        self.on_fault(answer)
                        continue
                    fault_delay = 0.0
                    exchange.start(answer)
                    claimed_total += len(answer)
                    rest = rest or exchange.drained  # the queue is drained, or every slot is busy: wait
                    empty = until_empty and not answer and not exchange.has_round_trips
                    empty = empty and not executor.running_count and not exchange.busy
                if empty:
                    break  # nothing was runnable and nothing is left to record
                if fault is not None:
                    fault_delay = fault_backoff(fault, fault_delay)
                    await sleep(wake, fault_delay)
                    continue
                if max_jobs is not None and claimed_total >= max_jobs:
                    break
                if not rest and exchange.send(None if max_jobs is None else max_jobs - claimed_total):
                    continue
                rest = False
                await sleep(wake, FLUSH_AFTER if executor.done_count else self.poll_interval)
        except BaseException:  # ending run(): jobs claimed by round trips still in flight are not started
            await exchange.in_flight()  # (their leases expire)
            raise
        # stopping: the jobs claimed by round trips still in flight run (the drain waits for them), or are
        # given back unstarted
        jobs = await exchange.in_flight()
        if self.stopping.abandon.is_set():
            await exchange.release(jobs)
        else:
            exchange.start(jobs)
        return claimed_total + len(jobs)

    async def _drain(self) -> None:
        """After stop: finish (or give back) in-flight jobs, then write how each ended. Finished jobs are
        completed as they are in a run, in batches within FLUSH_AFTER, not held until the longest job ends:
        a job that finished is not left running for others to see, nor reclaimed should this process
        die before the rest end."""
        executor, exchange = self.executor, self.exchange
        fault_delay, retry_at = 0.0, 0.0
        while executor.running_count and not self.stopping.abandon.is_set():
            await sleep(executor.wake, FLUSH_AFTER if executor.done_count else 0.05)
            executor.wake.clear()
            exchange.record_endings()
            if exchange.complete_due() and time.monotonic() >= retry_at:
                try:
                    await exchange.complete()
                    fault_delay = 0.0
                except JobkitError as exc:  # the jobs stay done, for the next try (or the final one)
                    fault_delay = min(max(fault_delay * 2, 0.1), 5.0)
                    retry_at = time.monotonic() + fault_delay
                    log.warning("complete failed (%s); retrying in %.1fs", error_text(exc), fault_delay)
        if self.stopping.abandon.is_set():
            await exchange.give_back()
        exchange.record_endings()
        await exchange.wind_down()
        for attempt in range(1, 6):
            try:
                await exchange.complete()
                break
            except JobkitError as exc:
                log.warning("final complete failed (%s); attempt %d of 5", error_text(exc), attempt)
                await asyncio.sleep(0.2 * attempt)
        if self.stopping.abandon.is_set():
            self.let_threads_go()
