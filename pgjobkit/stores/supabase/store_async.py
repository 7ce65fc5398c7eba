"""The Supabase store: ``AsyncSupabaseStore`` in ``store_async`` (the source) and ``SupabaseStore`` in
``store``, generated from it by tools/async_to_sync.py."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
from pydantic import SecretStr

# SYNC: import threading
from pgjobkit.errors import ConfigurationError, PermissionDenied
from pgjobkit.ops import Call
from pgjobkit.stores import unreadable
from pgjobkit.stores.base_async import AsyncJobStore, AsyncNoWakeups
from pgjobkit.stores.supabase.http_async import async_supabase_client
from pgjobkit.stores.supabase.realtime import WorkerWakeups
from pgjobkit.stores.supabase.rpc import (
    SupabaseConfig,
    answer,
    rpc_args,
    undecoded,
    unreachable,
)
from supabase import AsyncClient

# SYNC: from pgjobkit.stores.supabase.store_async import AsyncSupabaseStore


class AsyncSupabaseStore(SupabaseConfig, AsyncJobStore):
    """A JobStore over a Supabase project's API (supabase-py's client, made on first use or ``open()``).
    ``service_key``: the secret / service_role key; ``retry``, ``timeout``: how calls are retried and
    bounded; ``max_rows``: the project's Max Rows, if lowered; ``realtime``: wake a worker on Realtime
    broadcasts (the project's own, another URL, or off); ``origin``: where the URL and key came from, named
    in errors. A wrong key is a PermissionDenied at the first call; a network fault or a 5xx is retried."""

    def __init__(
        self,
        url: str,
        service_key: str | SecretStr,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        **options: Any,
    ) -> None:
        super().__init__(url, service_key, **options)
        self._transport = transport
        self._made: tuple[AsyncClient, httpx.AsyncClient] | None = None
        # SYNC: self._open_lock = threading.Lock()  # threads may share a blocking store

    # SYNC: def as_async(self) -> AsyncSupabaseStore:
    # SYNC:     return AsyncSupabaseStore(self._url, self._key, **self._config())
    # SYNC:
    async def open(self, wait: bool = True) -> None:
        # SYNC: with self._open_lock:
        # SYNC:     if self._made is None:
        # SYNC:         self._made = supabase_client(
        # SYNC:             self._url,
        # SYNC:             self._key.get_secret_value(),
        # SYNC:             retry=self._retry,
        # SYNC:             timeout=self._timeout,
        # SYNC:             transport=self._transport,
        # SYNC:         )
        if self._made is None:  # ASYNC
            self._made = await async_supabase_client(  # ASYNC
                self._url,  # ASYNC
                self._key.get_secret_value(),  # ASYNC
                retry=self._retry,  # ASYNC
                timeout=self._timeout,  # ASYNC
                transport=self._transport,  # ASYNC
            )  # ASYNC

    async def _execute(self, call: Call, conn: Any = None) -> Any:
        if self._made is None:
            await self.open()
        assert self._made is not None
        try:
            data = (await self._made[0].rpc(call.fn, rpc_args(call)).execute()).data
        except httpx.TransportError as exc:
            raise unreachable(call, exc, self._where) from None
        except (PermissionDenied, ConfigurationError) as exc:
            raise self._named(exc) from None
        except (ValueError, RecursionError):  # an answer supabase-py could not decode: read it value by value
            data = unreadable.read_value_by_value(undecoded())
        return answer(call, data)

    # SYNC: def listen(self, wake: Callable[[], None]) -> NoWakeups:
    async def listen(self, wake: Callable[[], None]) -> WorkerWakeups | AsyncNoWakeups:  # ASYNC
        """Wake on Realtime broadcasts of enqueued jobs (connecting in the background); polling stays the
        fallback, and the only way with ``realtime=False`` and for a blocking store (the worker works one
        through its async twin)."""
        if self._realtime is None:  # ASYNC
            return AsyncNoWakeups()  # ASYNC
        return WorkerWakeups(self._realtime, self._key.get_secret_value(), wake)  # ASYNC
        # SYNC: return NoWakeups()

    async def close(self) -> None:
        if self._made is not None:
            await self._made[1].aclose()
            self._made = None
