"""LISTEN for the Postgres stores: a thread (blocking store) or a task (async store) holding one LISTEN
connection on channel ``jobkit_jobs``, reconnecting with backoff; polling covers the gaps."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

import psycopg

log = logging.getLogger("pgjobkit.stores.postgres")
CHANNEL = "jobkit_jobs"  # its notifications say only that a job may be runnable: any role may LISTEN
_LISTEN_POLL = 0.05  # seconds between stop checks of the LISTEN thread: how long close() may take


class Listener:
    """A thread holding one LISTEN connection; reconnects with backoff, calls ``wake`` on each notify."""

    def __init__(self, conninfo: str, wake: Callable[[], None]) -> None:
        self._conninfo, self._wake = conninfo, wake
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jobkit-listen", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        delay = 0.1
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"listen {CHANNEL}")
                    delay = 0.1
                    self._wake()  # anything enqueued while we were not listening
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=_LISTEN_POLL, stop_after=1):
                            self._wake()
            except psycopg.Error as exc:
                log.warning(
                    "jobkit: LISTEN connection lost (%s); polling until it is back", type(exc).__name__
                )
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


class AsyncListener:
    """A task holding one LISTEN connection on the loop; reconnects with backoff, wakes on each notify."""

    def __init__(self, conninfo: str, wake: Callable[[], None]) -> None:
        self._conninfo, self._wake = conninfo, wake
        self._task = asyncio.get_running_loop().create_task(self._run(), name="jobkit-listen")

    async def _run(self) -> None:
        delay = 0.1
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._conninfo, autocommit=True, connect_timeout=5
                )
                async with conn:
                    await conn.execute(f"listen {CHANNEL}")
                    delay = 0.1
                    self._wake()  # anything enqueued while we were not listening
                    async for _ in conn.notifies():
                        self._wake()
            except psycopg.Error as exc:
                log.warning(
                    "jobkit: LISTEN connection lost (%s); polling until it is back", type(exc).__name__
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
