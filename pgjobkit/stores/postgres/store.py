# WARNING: this file is generated from pgjobkit/stores/postgres/store_async.py by tools/async_to_sync.py: DO NOT CHANGE.
# Change pgjobkit/stores/postgres/store_async.py and run `python tools/async_to_sync.py`.
"""The PostgreSQL store: ``AsyncPostgresStore`` in ``store_async`` (the source) and ``PostgresStore`` in
``store``, generated from it by tools/async_to_sync.py."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from pgjobkit.core.models import Enqueued, NewJob
from pgjobkit.errors import TransientError
from pgjobkit.exporters import otel
from pgjobkit.ops import Call
from pgjobkit.ops.jobs import enqueue, enqueue_many
from pgjobkit.pgconnect import reach
from pgjobkit.stores.base import JobStore, NoWakeups
from pgjobkit.stores.postgres import copy
from pgjobkit.stores.postgres.listen import Listener
from pgjobkit.stores.postgres.statements import (
    BROKEN_RETRIES,
    DIALECT,
    UNREACHABLE_AFTER,
    PostgresConfig,
    answer,
    configure,
    log,
    read_value_by_value,
    render,
    retry_on_fresh,
    unreachable,
    wrap,
)
from pgjobkit.stores.postgres.store_async import AsyncPostgresStore


class PostgresStore(PostgresConfig, JobStore):
    """A JobStore over PostgreSQL: ``conninfo`` is a libpq URL; the pool opens on first use (or ``open()``).
    ``min_size``/``max_size``: the pool's connections; ``timeout``: seconds a call waits for one;
    ``listen``/``listen_conninfo``: LISTEN for wake-ups (on another URL behind a transaction-mode pooler);
    ``prepare``: server-side prepared statements (see ``pgjobkit.stores.postgres``); ``origin``: where
    ``conninfo`` came from, named in errors. The first connection is made alone, before the pool's: a
    configuration error (an unknown database, a failed authentication) raises ConfigurationError at once."""

    dialect = DIALECT
    _pool: ConnectionPool[psycopg.Connection[Any]]

    def _setup(self) -> None:
        self._pool = ConnectionPool(self._conninfo, configure=configure, **self._pool_kwargs)
        self._open_lock = threading.Lock()  # threads may share a blocking store

    def as_async(self) -> AsyncPostgresStore:
        return AsyncPostgresStore(self._conninfo, **self._options)

    def open(self, wait: bool = True) -> None:
        if not self._opened:
            self._connect_first()
        with self._open_lock:
            if not self._opened:
                self._pool.open(wait=False)
                self._opened = True
        if wait:
            self._pool.putconn(self._borrow())

    def _connect_first(self) -> None:
        """One connection before the pool opens (``pgjobkit.pgconnect``; the async store's in a thread): the
        pool would retry a wrong URL for ever, a warning per attempt; this says a configuration error at
        once, and a network fault once until it passes."""
        origin, warn = self._origin or f"the database of {self!r}", not self._said_unreachable
        first = functools.partial(reach, self._conninfo, timeout=self._timeout, origin=origin, warn=warn)
        try:
            first()
        except TransientError:
            self._said_unreachable = True
            raise
        self._said_unreachable = False

    def _borrow(self) -> psycopg.Connection[Any]:
        """A pooled connection, waiting at most ``timeout`` seconds (then PoolTimeout: transient)."""
        if not self._opened:
            self.open(wait=False)
        deadline = time.monotonic() + self._timeout
        try:
            return self._pool.getconn(timeout=min(UNREACHABLE_AFTER, self._timeout))
        except PoolTimeout:
            if self._timeout <= UNREACHABLE_AFTER:
                raise
        why = unreachable(self._conninfo, repr(self), self._pool.max_size)
        log.warning("jobkit: no database connection within %.0f s: %s", UNREACHABLE_AFTER, why)
        return self._pool.getconn(timeout=max(deadline - time.monotonic(), 0.001))

    def _execute(self, call: Call, conn: psycopg.Connection[Any] | None = None) -> Any:
        query, params = render(call)
        for attempt in range(BROKEN_RETRIES + 1):
            used = conn
            try:
                if used is None:
                    used = self._borrow()
                try:
                    with used.cursor(row_factory=dict_row) as cur:
                        cur.execute(query, params)
                        try:
                            rows = cur.fetchall()
                        except Exception:  # a value Python cannot hold: the result is here, read it by value
                            rows = read_value_by_value(cur)
                        return answer(call, rows)
                finally:
                    if conn is None:
                        self._pool.putconn(used)
            except psycopg.Error as exc:
                if conn is None and retry_on_fresh(exc, used, attempt):
                    continue
                raise wrap(exc) from exc
        raise AssertionError("unreachable")

    def enqueue(self, job: NewJob, *, conn: psycopg.Connection[Any] | None = None) -> Enqueued:
        """Enqueue one job; with ``conn``, inside the caller's own transaction (rolled back with it)."""
        with otel.sending([job]) as traced:
            return self.run(enqueue(self.dialect, traced[0]), conn)

    def enqueue_many(
        self, jobs: Sequence[NewJob], *, conn: psycopg.Connection[Any] | None = None
    ) -> list[Enqueued]:
        """Enqueue many jobs in one round trip; with ``conn``, inside the caller's transaction."""
        with otel.sending(jobs) as traced:
            return self.run(enqueue_many(self.dialect, traced), conn)

    def enqueue_bulk(
        self, jobs: Sequence[NewJob], *, conn: psycopg.Connection[Any] | None = None
    ) -> list[UUID]:
        """Jobs without idempotency keys, written with COPY in one transaction: the fastest bulk path (see
        ``pgjobkit.stores.postgres.copy``); their ids in input order. With ``conn``, inside the caller's
        transaction."""
        with otel.sending(jobs) as traced:
            op = copy.enqueue_bulk(traced)
            used = conn or self._borrow()
            try:
                return copy.run(op, used, own=conn is None)
            except psycopg.Error as exc:
                raise wrap(exc) from exc
            finally:
                if conn is None:
                    self._pool.putconn(used)

    def listen(self, wake: Callable[[], None]) -> Listener | NoWakeups:
        return Listener(self._listen_conninfo, wake) if self._listen else NoWakeups()

    def close(self) -> None:
        with self._open_lock:
            if self._opened:
                self._pool.close()
                self._opened = False
