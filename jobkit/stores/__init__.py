"""Store adapters behind the one JobStore seam."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jobkit.stores.base import JobStore, Subscription
from jobkit.stores.memory import MemoryStore

if TYPE_CHECKING:
    from jobkit.settings import Settings

__all__ = ["JobStore", "MemoryStore", "Subscription", "open_store"]


def open_store(settings: Settings) -> JobStore:
    """The store the settings describe: SupabaseStore when SUPABASE_URL is set, else PostgresStore."""
    settings.require_worker_store()
    if settings.supabase_url is not None:
        from jobkit.stores.supabase import SupabaseStore

        assert settings.supabase_service_role_key is not None
        return SupabaseStore(
            settings.url,
            settings.supabase_service_role_key,
            timeout=settings.connect_timeout,
            max_rows=settings.max_rows,
            realtime=settings.realtime,
        )
    from jobkit.stores.postgres import PostgresStore

    assert settings.database_url is not None
    return PostgresStore(
        settings.database_url.get_secret_value(), timeout=settings.connect_timeout, prepare=settings.prepare
    )
