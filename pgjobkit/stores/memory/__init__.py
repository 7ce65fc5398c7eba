"""MemoryStore: the whole JobStore in process, a product for users' tests; AsyncMemoryStore, its async view.

It runs the same ``pgjobkit.ops`` operations as the SQL stores: its transport is an in-process version of
each ``jobkit_*`` SQL function (``functions.FUNCTIONS``, over a ``state.State``), driven by ``pgjobkit.core``,
with the same argument checks and the same per-call limits (1000 rows, 10,000 jobs), so the operations'
splitting and paging run here too. Thread-safe; inspect it with ``jobs()``, reset it with ``reset()``, and
pass ``clock`` to control time. It passes the contract suite the SQL stores pass (tests/contract/); the one
thing it cannot check is that a ``user_id`` exists in ``auth.users``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pgjobkit.core.models import Job
from pgjobkit.ops import Call, Dialect
from pgjobkit.stores.base import JobStore
from pgjobkit.stores.base_async import AsyncJobStore
from pgjobkit.stores.memory.functions import FUNCTIONS
from pgjobkit.stores.memory.state import Row, State, Woken


def _utcnow() -> datetime:
    return datetime.now(UTC)


class _Unsubscribe:
    def __init__(self, store: MemoryStore, wake: Callable[[], None]) -> None:
        self._store, self._wake = store, wake

    def close(self) -> None:
        with self._store._lock:
            if self._wake in self._store._state.listeners:
                self._store._state.listeners.remove(self._wake)


class MemoryStore(JobStore):
    """An in-process JobStore. ``clock`` returns the current time (timezone-aware); default: UTC now."""

    dialect = Dialect(job=Job.from_row, time=lambda value: value)

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self._clock = clock or _utcnow
        self._lock = threading.RLock()
        self._state = State()

    def __repr__(self) -> str:
        return f"MemoryStore(jobs={len(self._state.jobs)})"

    def as_async(self) -> AsyncMemoryStore:
        return AsyncMemoryStore(self)

    # --- inspection, for tests -------------------------------------------------------------------
    def jobs(self) -> list[Job]:
        """Every job, oldest first."""
        with self._lock:
            return sorted(self._state.jobs.values(), key=lambda j: (j.created_at, str(j.id)))

    def reset(self) -> None:
        """Forget every job, limit and schedule."""
        with self._lock:
            self._state = State(listeners=self._state.listeners)

    def listen(self, wake: Callable[[], None]) -> _Unsubscribe:
        with self._lock:
            self._state.listeners.append(wake)
        return _Unsubscribe(self, wake)

    def close(self) -> None:
        with self._lock:
            self._state.listeners.clear()

    # what tests reach into to set a job's times or age the start log and schedules
    def _put(self, job: Job) -> None:
        self._state.put(job)

    @property
    def _starts(self) -> dict[str, list[datetime]]:
        return self._state.starts

    @property
    def _schedules(self) -> dict[str, Row]:
        return self._state.schedules

    # --- the transport: jobkit's SQL functions, in process ---------------------------------------
    def _execute(self, call: Call, conn: Any = None) -> Any:
        function = FUNCTIONS[call.fn]
        woken: Woken = []
        with self._lock:
            answer = function(self._state, self._clock(), woken, **{k: v for k, (_, v) in call.args.items()})
        for wake in woken:
            wake()
        return answer


class AsyncMemoryStore(AsyncJobStore):
    """The async view of a MemoryStore (a new one by default): the same jobs, from coroutines."""

    dialect = MemoryStore.dialect

    def __init__(self, store: MemoryStore | None = None) -> None:
        self.sync = store or MemoryStore()

    async def _execute(self, call: Call, conn: Any = None) -> Any:
        return self.sync._execute(call)  # in process and brief: nothing to wait for

    async def listen(self, wake: Callable[[], None]) -> _AsyncUnsubscribe:
        loop = asyncio.get_running_loop()

        def on_loop() -> None:
            loop.call_soon_threadsafe(wake)

        return _AsyncUnsubscribe(self.sync.listen(on_loop))


class _AsyncUnsubscribe:
    def __init__(self, inner: _Unsubscribe) -> None:
        self._inner = inner

    async def close(self) -> None:
        self._inner.close()
