# WARNING: this file is generated from pgjobkit/stores/supabase/store_async.py by tools/async_to_sync.py: DO NOT CHANGE.
# Change pgjobkit/stores/supabase/store_async.py and run `python tools/async_to_sync.py`.
"""The Supabase store: ``AsyncSupabaseStore`` in ``store_async`` (the source) and ``SupabaseStore`` in
``store``, generated from it by tools/async_to_sync.py."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import httpx
from pydantic import SecretStr

from pgjobkit.errors import ConfigurationError, PermissionDenied
from pgjobkit.ops import Call
from pgjobkit.stores import unreadable
from pgjobkit.stores.base import JobStore, NoWakeups
from pgjobkit.stores.supabase.http import supabase_client
from pgjobkit.stores.supabase.rpc import (
    SupabaseConfig,
    answer,
    rpc_args,
    undecoded,
    unreachable,
)
from pgjobkit.stores.supabase.store_async import AsyncSupabaseStore
from supabase import Client


class SupabaseStore(SupabaseConfig, JobStore):
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
        transport: httpx.BaseTransport | None = None,
        **options: Any,
    ) -> None:
        super().__init__(url, service_key, **options)
        self._transport = transport
        self._made: tuple[Client, httpx.Client] | None = None
        self._open_lock = threading.Lock()  # threads may share a blocking store

    def as_async(self) -> AsyncSupabaseStore:
        return AsyncSupabaseStore(self._url, self._key, **self._config())

    def open(self, wait: bool = True) -> None:
        with self._open_lock:
            if self._made is None:
                self._made = supabase_client(
                    self._url,
                    self._key.get_secret_value(),
                    retry=self._retry,
                    timeout=self._timeout,
                    transport=self._transport,
                )

    def _execute(self, call: Call, conn: Any = None) -> Any:
        if self._made is None:
            self.open()
        assert self._made is not None
        try:
            data = (self._made[0].rpc(call.fn, rpc_args(call)).execute()).data
        except httpx.TransportError as exc:
            raise unreachable(call, exc, self._where) from None
        except (PermissionDenied, ConfigurationError) as exc:
            raise self._named(exc) from None
        except (ValueError, RecursionError):  # an answer supabase-py could not decode: read it value by value
            data = unreadable.read_value_by_value(undecoded())
        return answer(call, data)

    def listen(self, wake: Callable[[], None]) -> NoWakeups:
        """Wake on Realtime broadcasts of enqueued jobs (connecting in the background); polling stays the
        fallback, and the only way with ``realtime=False`` and for a blocking store (the worker works one
        through its async twin)."""
        return NoWakeups()

    def close(self) -> None:
        if self._made is not None:
            self._made[1].close()
            self._made = None
