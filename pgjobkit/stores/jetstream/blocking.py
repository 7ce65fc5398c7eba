"""``JetStreamStore``: the JetStream store for blocking callers (the CLI, a web app's request thread).

nats-py is async only, so this twin is not generated from the async source as the other stores' are: it
owns an event loop on a thread of its own, and runs every call of ``AsyncJetStreamStore`` on it. The store
seam is a transport (``_execute`` of one ``pgjobkit.ops.Call``), so nothing of an operation is written
twice: each method of ``JobStore`` reaches the async store's ``_execute`` through ``_submit``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from pgjobkit.errors import ConfigurationError
from pgjobkit.ops import Call
from pgjobkit.stores.base import JobStore, Subscription
from pgjobkit.stores.jetstream.layout import Layout
from pgjobkit.stores.jetstream.store import AsyncJetStreamStore

T = TypeVar("T")


class JetStreamStore(JobStore):
    """Jobs on JetStream, blocking: ``AsyncJetStreamStore``'s arguments and behaviour (see
    ``pgjobkit.stores.jetstream``). Thread-safe: calls from several threads share the one connection.
    ``as_async()`` gives the worker its own async store on the same stream."""

    dialect = AsyncJetStreamStore.dialect

    def __init__(self, url: str | Sequence[str], **options: Any) -> None:
        self._url = url
        self._options = options
        self._async = AsyncJetStreamStore(url, **options)  # checks the URL now
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def layout(self) -> Layout:
        return self._async.layout

    def as_async(self) -> AsyncJetStreamStore:
        return AsyncJetStreamStore(self._url, **self._options)

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="jobkit-nats", daemon=True)
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _submit(self, work: Coroutine[Any, Any, T]) -> T:
        loop = self._running_loop()
        if threading.current_thread() is self._thread:
            work.close()
            raise ConfigurationError(
                "jobkit: a JetStreamStore call from its own loop: use AsyncJetStreamStore"
            )
        return asyncio.run_coroutine_threadsafe(work, loop).result()

    def open(self, wait: bool = True) -> None:
        self._submit(self._async.open(wait))

    def close(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._async.close(), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()

    def _execute(self, call: Call, conn: Any = None) -> Any:
        return self._submit(self._async._execute(call, conn))

    def listen(self, wake: Callable[[], None]) -> Subscription:
        """``wake`` is called on this store's loop thread (``JobStore.listen`` allows any thread)."""

        inner = self._submit(self._async.listen(wake))
        loop = self._loop

        def close() -> None:
            if self._loop is loop:  # else the store was closed, and the subscription with its connection
                self._submit(inner.close())

        return _Subscription(close)

    def drop(self) -> None:
        """``AsyncJetStreamStore.drop``: delete the stream and every job in it."""
        self._submit(self._async.drop())

    def migrate(self, replicas: int | None = None) -> int:
        """``AsyncJetStreamStore.migrate``: create or update the stream, idempotently; the replicas."""
        return self._submit(self._async.migrate(replicas))


class _Subscription:
    def __init__(self, close: Callable[[], None]) -> None:
        self._close = close

    def close(self) -> None:
        self._close()
