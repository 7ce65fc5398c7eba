"""Rounds: a worker's round trips to the store in flight, each completing the jobs that finished and
claiming more. One at a time; while the jobs run quick (``Held.quick``) and claims come back full, up to
1 + AHEAD, each claiming a batch ahead, so that the database works on some while the worker's process
handles the jobs of another (measured at batch 1: 850 jobs/s with one, 1,200 with two, 1,350 with three)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from jobkit.errors import TransientError
from jobkit.handlers import Running
from jobkit.held import Held
from jobkit.models import Job

Claimer = Callable[[int], Coroutine[Any, Any, list[Job]]]  # claim up to n jobs
Completer = Callable[[int, list[Running]], Coroutine[Any, Any, list[Job]]]  # complete these, claim up to n
AHEAD = 2  # batches a worker may hold beyond max(concurrency, batch_size) while its jobs run quick


class Rounds:
    """The round trips in flight for ``held``: it holds up to max(concurrency, batch_size) jobs, and while
    its jobs run quick AHEAD batches more; a claim goes out when half a batch of room is free (a whole batch
    when another is in flight)."""

    def __init__(
        self, held: Held, *, concurrency: int, batch_size: int, claim: Claimer, complete: Completer
    ) -> None:
        self.held, self.batch_size, self._claim, self._complete = held, batch_size, claim, complete
        self.capacity = max(concurrency, batch_size)
        self.drained = False  # the latest claim came back with fewer jobs than it asked for
        self._calls: deque[tuple[asyncio.Task[list[Job]], int]] = deque()  # oldest first, and how many asked

    def __bool__(self) -> bool:
        return bool(self._calls)

    def send(self, left: int | None = None) -> bool:
        """Send the next round trip if there is one (finished jobs to complete, or room to claim; at most
        ``left`` more jobs) and room for it in flight; whether one went."""
        ahead = self.held.quick and not self.drained
        if len(self._calls) > (AHEAD if ahead else 0):
            return False
        asked = sum(n for _, n in self._calls)
        due = self.held.complete_due()
        count = len(self.held.running) + (0 if due else len(self.held.done)) + asked
        free = self.capacity + (AHEAD * self.batch_size if ahead else 0) - count
        if left is not None:
            free = min(free, left - asked)
        least = self.batch_size if ahead and self._calls else (self.batch_size + 1) // 2
        want = min(free, self.batch_size) if count == 0 or free >= least else 0
        if not due and want <= 0:
            return False
        # the finished jobs are taken now: a second round trip sent before this one runs must not count them
        call = self._complete(want, self.held.take_done()) if due else self._claim(want)
        task = asyncio.get_running_loop().create_task(call)
        task.add_done_callback(lambda _: self.held.wake.set())
        self._calls.append((task, want))
        return True

    def finished(self) -> Iterator[list[Job] | TransientError]:
        """The answers of the round trips back so far, in the order they were sent: the jobs claimed (to be
        started in that order), or the transient fault that failed it; any other error is raised."""
        while self._calls and self._calls[0][0].done():
            task, asked = self._calls.popleft()
            try:
                jobs = task.result()
            except TransientError as exc:
                yield exc
                continue
            if asked:  # a round trip that only completed says nothing about the queue
                self.drained = len(jobs) < asked
            yield jobs

    async def settle(self) -> list[Job]:
        """Wait for every round trip still in flight; the jobs they claimed (a failed one claimed none)."""
        jobs: list[Job] = []
        for answer in await asyncio.gather(*(task for task, _ in self._calls), return_exceptions=True):
            if isinstance(answer, list):
                jobs.extend(answer)
        self._calls.clear()
        return jobs
