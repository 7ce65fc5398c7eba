"""What the worker tests share: a store of each kind on the test's own database."""

from __future__ import annotations

import pytest

from pgjobkit import MemoryStore
from pgjobkit.stores.base import JobStore
from pgjobkit.stores.postgres import PostgresStore
from pgjobkit.stores.supabase import SupabaseStore
from tests.doubles.router import BASE_URL, SECRET_KEY


def open_store(kind: str, request: pytest.FixtureRequest) -> JobStore:
    """A ``memory``, ``postgres`` (a small pool on ``db_url``) or ``supabase`` store (the Data API double,
    carried into the test's database, without Realtime); the caller closes it."""
    if kind == "memory":
        return MemoryStore()
    if kind == "postgres":
        return PostgresStore(request.getfixturevalue("db_url"), max_size=4)
    request.getfixturevalue("router")
    return SupabaseStore(BASE_URL, SECRET_KEY, realtime=False)
