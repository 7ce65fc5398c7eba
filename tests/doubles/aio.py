"""Test-only: an AsyncJobStore's coroutines called as blocking methods, so that the contract's scenarios
run unchanged on every async store. One long-lived event loop per adapter, as a worker has."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from pgjobkit.stores.base_async import AsyncJobStore


class Blocking:
    """``Blocking(store).claim(...)`` runs ``await store.claim(...)`` on the adapter's own loop."""

    def __init__(self, store: AsyncJobStore) -> None:
        self.store = store
        self.loop = asyncio.new_event_loop()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.store, name)
        if not inspect.iscoroutinefunction(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.loop.run_until_complete(attr(*args, **kwargs))

        return call

    def close(self) -> None:
        self.loop.run_until_complete(self.store.close())
        self.loop.close()
