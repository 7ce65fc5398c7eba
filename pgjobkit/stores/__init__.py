"""Store adapters behind the one JobStore seam."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pgjobkit.errors import ConfigurationError
from pgjobkit.extras import missing
from pgjobkit.stores.base import JobStore, Subscription
from pgjobkit.stores.memory import MemoryStore

if TYPE_CHECKING:
    from pgjobkit.settings import Settings

__all__ = ["JobStore", "MemoryStore", "Subscription", "open_store"]


def open_store(settings: Settings) -> JobStore:
    """The store the settings describe: SupabaseStore when SUPABASE_URL is set, else PostgresStore."""
    settings.require_worker_store()
    try:
        return _open(settings)
    except ModuleNotFoundError as exc:
        hint = missing(exc, "SupabaseStore" if settings.supabase_url is not None else "PostgresStore")
        if hint is None:
            raise
        raise ConfigurationError(hint) from exc


def _open(settings: Settings) -> JobStore:
    if settings.supabase_url is not None:
        from pgjobkit.stores.supabase import SupabaseStore

        assert settings.supabase_service_role_key is not None
        return SupabaseStore(
            settings.url,
            settings.supabase_service_role_key,
            timeout=settings.connect_timeout,
            max_rows=settings.max_rows,
            realtime=settings.realtime,
        )
    from pgjobkit.stores.postgres import PostgresStore

    assert settings.database_url is not None
    return PostgresStore(
        settings.database_url.get_secret_value(), timeout=settings.connect_timeout, prepare=settings.prepare
    )
