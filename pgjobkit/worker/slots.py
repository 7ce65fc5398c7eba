"""How a worker's held jobs get to run within its ``concurrency`` slots: ``Slots``, taken by async jobs
(each a task once it has one) and by ``SyncLane``'s runners (sync handlers in pool threads)."""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from typing import Any

from pgjobkit.worker.context import Attempt, running_as

WIDEN_AFTER = 0.001  # seconds sync jobs wait in the lane before each gets a runner of its own
LINGER = 0.05  # seconds a runner with no job waits for the next before giving back its slot and thread

Spawn = Callable[[Attempt, Awaitable[Any] | None], None]  # start a job's task in the slot it now holds
SyncReturn = Callable[[Attempt, Any, BaseException | None], None]  # what a sync handler returned or raised


def _close(awaitable: Awaitable[Any] | None) -> None:
    """Close what a sync handler returned to be awaited and never will be (no never-awaited warning)."""
    if inspect.iscoroutine(awaitable):
        awaitable.close()


class Slots:
    """``n`` slots on one event loop. An async job (or what a sync handler returned to be awaited) that
    finds none free waits in line, not as a task parked on a semaphore: ``spawn`` starts its task when a
    slot is given back. Runners wait for theirs with ``take``; the line goes first."""

    def __init__(self, n: int, spawn: Spawn) -> None:
        self.free = n
        self._spawn = spawn
        self._line: deque[tuple[Attempt, Awaitable[Any] | None]] = deque()
        self._waiters: deque[asyncio.Future[None]] = deque()

    def run(self, run: Attempt, awaitable: Awaitable[Any] | None = None) -> None:
        """Spawn ``run`` now if a slot is free, else when one is given back."""
        if self._take_free():
            self._spawn(run, awaitable)
        else:
            self._line.append((run, awaitable))

    def leave(self, run: Attempt) -> bool:
        """Take ``run`` out of the line; whether it was in it."""
        for waiting in self._line:
            if waiting[0] is run:
                self._line.remove(waiting)
                _close(waiting[1])
                return True
        return False

    def clear(self) -> None:
        """Empty the line: none of it will run."""
        while self._line:
            _close(self._line.popleft()[1])

    async def take(self) -> None:
        """Take a slot, waiting for one (cancel-safe: a slot handed over as the wait is cancelled is given
        back, not lost)."""
        if self._take_free():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.give()
            raise

    def _take_free(self) -> bool:
        """Take a free slot if nobody is waiting for one."""
        if self.free > 0 and not self._waiters and not self._line:
            self.free -= 1
            return True
        return False

    def give(self) -> None:
        """Give a slot back: to the line's first job, else to the longest waiting runner, else free."""
        if self._line:
            self._spawn(*self._line.popleft())
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self.free += 1


class SyncLane:
    """Sync handlers: runners, each holding one slot, take waiting jobs from the lane one after another in
    a pool thread and hand each outcome to ``outcome`` on the loop as soon as it is known. One runner
    starts at once; jobs still waiting WIDEN_AFTER later (slow ones, or jobs behind a long one) get a runner
    each, up to ``concurrency``. A runner that finds the lane empty lingers LINGER seconds for the next job
    (at batch 1 that is the next claim's), unless async jobs want the slots. So quick jobs cost a thread
    hand-off each way, not a task and a pool submission per job, and blocking jobs still run
    ``concurrency`` wide. ``keep`` holds the runners' tasks until they end."""

    def __init__(
        self,
        slots: Slots,
        concurrency: int,
        executor: Executor,
        outcome: SyncReturn,
        keep: Callable[[asyncio.Task[None]], None],
    ) -> None:
        self.slots, self.concurrency, self.executor = slots, concurrency, executor
        self._outcome, self._keep = outcome, keep
        self._lane: deque[Attempt] = deque()  # sync jobs waiting for a runner
        self._ready = threading.Condition()  # a lingering runner waits on it for the lane's next job
        self._linger = True  # off once async jobs want the slots, or the run ends
        self._runners = 0
        self._widen: asyncio.TimerHandle | None = None
        # outcomes handed from the runners' threads to the loop: one wake-up for all of those that arrive
        # before the loop takes them, so a batch of quick jobs costs a few, not one per job
        self._outcomes: deque[tuple[Attempt, Any, BaseException | None]] = deque()
        self._outcomes_lock = threading.Lock()
        self._outcomes_wake = False

    def add(self, run: Attempt) -> None:
        """Queue ``run`` for a runner (starting one, or more if jobs wait)."""
        with self._ready:
            self._lane.append(run)
            self._ready.notify()
        self._add_runners(asyncio.get_running_loop())

    def remove(self, run: Attempt) -> bool:
        """Take ``run`` out of the lane before it runs; whether it was there."""
        try:
            self._lane.remove(run)
        except ValueError:
            return False
        return True

    def clear(self) -> None:
        """Drop the jobs still waiting: none of them will run."""
        self._lane.clear()

    def yield_slots(self) -> None:
        """Async jobs want the slots: a lingering runner gives its back now."""
        if self._linger and self._runners:
            self.stop_lingering()

    def stop_lingering(self) -> None:
        """Runners with no job return at once instead of lingering (the run ends, or async jobs came)."""
        with self._ready:
            self._linger = False
            self._ready.notify_all()

    def _add_runners(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._runners == 0:
            self._add_runner(loop)
        if self._lane and self._widen is None and self._runners < self.concurrency:
            self._widen = loop.call_later(WIDEN_AFTER, self._widen_now, loop)

    def _widen_now(self, loop: asyncio.AbstractEventLoop) -> None:
        self._widen = None
        for _ in range(min(len(self._lane), self.concurrency - self._runners)):
            self._add_runner(loop)

    def _add_runner(self, loop: asyncio.AbstractEventLoop) -> None:
        self._runners += 1
        self._keep(loop.create_task(self._runner(loop)))

    async def _runner(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            await self.slots.take()
            try:
                await loop.run_in_executor(self.executor, self._run_lane, loop)
            finally:
                self.slots.give()
        finally:
            self._runners -= 1
            if self._lane:  # added after the thread found the lane empty
                self._add_runners(loop)

    def _run_lane(self, loop: asyncio.AbstractEventLoop) -> None:
        """In a pool thread: run waiting sync jobs until none has come for LINGER seconds, handing each
        outcome to the loop."""
        while True:
            with self._ready:
                if not self._lane and self._linger:
                    self._ready.wait_for(lambda: self._lane or not self._linger, timeout=LINGER)
                if not self._lane:
                    return
                run = self._lane.popleft()
            if run.abandoned:
                continue
            result: Any = None
            error: BaseException | None = None
            try:
                with running_as(run):
                    result = run.handler.invoke(run.job)
            except BaseException as exc:  # recorded on the job, as an async handler's would be
                error = exc
            self._outcomes.append((run, result, error))
            with self._outcomes_lock:
                if self._outcomes_wake:
                    continue  # the loop has yet to take the outcomes before this one: it takes this too
                self._outcomes_wake = True
            try:
                loop.call_soon_threadsafe(self._take_outcomes)
            except RuntimeError:  # the loop has closed: the worker gave this job back and left
                return

    def _take_outcomes(self) -> None:
        """On the loop: every outcome the runners have handed over since the last call."""
        with self._outcomes_lock:
            self._outcomes_wake = False
        while self._outcomes:
            self._outcome(*self._outcomes.popleft())
