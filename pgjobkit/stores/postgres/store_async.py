"""The PostgreSQL store: ``AsyncPostgresStore`` in ``store_async`` (the source) and ``PostgresStore`` in
``store``, generated from it by tools/async_to_sync.py."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout

# SYNC: import threading
from pgjobkit.core.models import Enqueued, NewJob
from pgjobkit.errors import TransientError
from pgjobkit.exporters import otel
from pgjobkit.ops import Call
from pgjobkit.ops.jobs import enqueue, enqueue_many
from pgjobkit.pgconnect import reach
from pgjobkit.stores.base_async import AsyncJobStore, AsyncNoWakeups
from pgjobkit.stores.postgres import copy
from pgjobkit.stores.postgres.listen import AsyncListener
from pgjobkit.stores.postgres.statements import (
    BROKEN_RETRIES,
    DIALECT,
    UNREACHABLE_AFTER,
    PostgresConfig,
    aconfigure,
    answer,
    log,
    read_value_by_value,
    render,
    retry_on_fresh,
    unreachable,
    wrap,
)

# SYNC: from pgjobkit.stores.postgres.statements import configure
# SYNC: from pgjobkit.stores.postgres.store_async import AsyncPostgresStore


class AsyncPostgresStore(PostgresConfig, AsyncJobStore):
    """A JobStore over PostgreSQL: ``conninfo`` is a libpq URL; the pool opens on first use (or ``open()``).
    ``min_size``/``max_size``: the pool's connections; ``timeout``: seconds a call waits for one;
    ``listen``/``listen_conninfo``: LISTEN for wake-ups (on another URL behind a transaction-mode pooler);
    ``prepare``: server-side prepared statements (see ``pgjobkit.stores.postgres``); ``origin``: where
    ``conninfo`` came from, named in errors. The first connection is made alone, before the pool's: a
    configuration error (an unknown database, a failed authentication) raises ConfigurationError at once."""

    dialect = DIALECT
    _pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]]

    def _setup(self) -> None:
        self._pool = AsyncConnectionPool(self._conninfo, configure=aconfigure, **self._pool_kwargs)  # ASYNC
        # SYNC: self._pool = ConnectionPool(self._conninfo, configure=configure, **self._pool_kwargs)
        # SYNC: self._open_lock = threading.Lock()  # threads may share a blocking store

    # SYNC: def as_async(self) -> AsyncPostgresStore:
    # SYNC:     return AsyncPostgresStore(self._conninfo, **self._options)
    # SYNC:
    async def open(self, wait: bool = True) -> None:
        if not self._opened:
            await self._connect_first()
        # SYNC: with self._open_lock:
        # SYNC:     if not self._opened:
        # SYNC:         self._pool.open(wait=False)
        # SYNC:         self._opened = True
        if not self._opened:  # ASYNC
            self._opened = True  # ASYNC
            await self._pool.open(wait=False)  # ASYNC
        if wait:
            await self._pool.putconn(await self._borrow())

    async def _connect_first(self) -> None:
        """One connection before the pool opens (``pgjobkit.pgconnect``; the async store's in a thread): the
        pool would retry a wrong URL for ever, a warning per attempt; this says a configuration error at
        once, and a network fault once until it passes."""
        origin, warn = self._origin or f"the database of {self!r}", not self._said_unreachable
        first = functools.partial(reach, self._conninfo, timeout=self._timeout, origin=origin, warn=warn)
        try:
            await asyncio.to_thread(first)  # ASYNC
            # SYNC: first()
        except TransientError:
            self._said_unreachable = True
            raise
        self._said_unreachable = False

    async def _borrow(self) -> psycopg.AsyncConnection[Any]:
        """A pooled connection, waiting at most ``timeout`` seconds (then PoolTimeout: transient)."""
        if not self._opened:
            await self.open(wait=False)
        deadline = time.monotonic() + self._timeout
        try:
            return await self._pool.getconn(timeout=min(UNREACHABLE_AFTER, self._timeout))
        except PoolTimeout:
            if self._timeout <= UNREACHABLE_AFTER:
                raise
        why = await asyncio.to_thread(unreachable, self._conninfo, repr(self), self._pool.max_size)  # ASYNC
        # SYNC: why = unreachable(self._conninfo, repr(self), self._pool.max_size)
        log.warning("jobkit: no database connection within %.0f s: %s", UNREACHABLE_AFTER, why)
        return await self._pool.getconn(timeout=max(deadline - time.monotonic(), 0.001))

    async def _execute(self, call: Call, conn: psycopg.AsyncConnection[Any] | None = None) -> Any:
        query, params = render(call)
        for attempt in range(BROKEN_RETRIES + 1):
            used = conn
            try:
                if used is None:
                    used = await self._borrow()
                try:
                    async with used.cursor(row_factory=dict_row) as cur:
                        await cur.execute(query, params)
                        try:
                            rows = await cur.fetchall()
                        except Exception:  # a value Python cannot hold: the result is here, read it by value
                            rows = read_value_by_value(cur)
                        return answer(call, rows)
                finally:
                    if conn is None:
                        await self._pool.putconn(used)
            except psycopg.Error as exc:
                if conn is None and retry_on_fresh(exc, used, attempt):
                    continue
                raise wrap(exc) from exc
        raise AssertionError("unreachable")

    async def enqueue(self, job: NewJob, *, conn: psycopg.AsyncConnection[Any] | None = None) -> Enqueued:
        """Enqueue one job; with ``conn``, inside the caller's own transaction (rolled back with it)."""
        with otel.sending([job]) as traced:
            return await self.run(enqueue(self.dialect, traced[0]), conn)

    async def enqueue_many(
        self, jobs: Sequence[NewJob], *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> list[Enqueued]:
        """Enqueue many jobs in one round trip; with ``conn``, inside the caller's transaction."""
        with otel.sending(jobs) as traced:
            return await self.run(enqueue_many(self.dialect, traced), conn)

    async def enqueue_bulk(
        self, jobs: Sequence[NewJob], *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> list[UUID]:
        """Jobs without idempotency keys, written with COPY in one transaction: the fastest bulk path (see
        ``pgjobkit.stores.postgres.copy``); their ids in input order. With ``conn``, inside the caller's
        transaction."""
        with otel.sending(jobs) as traced:
            op = copy.enqueue_bulk(traced)
            used = conn or await self._borrow()
            try:
                return await copy.arun(op, used, own=conn is None)
            except psycopg.Error as exc:
                raise wrap(exc) from exc
            finally:
                if conn is None:
                    await self._pool.putconn(used)

    async def listen(self, wake: Callable[[], None]) -> AsyncListener | AsyncNoWakeups:
        return AsyncListener(self._listen_conninfo, wake) if self._listen else AsyncNoWakeups()

    async def close(self) -> None:
        # SYNC: with self._open_lock:
        # SYNC:     if self._opened:
        # SYNC:         self._pool.close()
        # SYNC:         self._opened = False
        if self._opened:  # ASYNC
            self._opened = False  # ASYNC
            await self._pool.close()  # ASYNC
