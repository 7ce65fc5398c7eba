"""Store adapters behind the one JobStore seam."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pgjobkit.errors import ConfigurationError
from pgjobkit.extras import missing
from pgjobkit.redact import guard
from pgjobkit.stores.base import JobStore, Subscription
from pgjobkit.stores.memory import MemoryStore

if TYPE_CHECKING:
    from pgjobkit.settings import Settings

__all__ = ["JobStore", "MemoryStore", "Subscription", "open_store"]

# The loggers that repeat a driver's or a library's words (a URL, a websocket address with its apikey):
# what they log is masked, wherever the application sends it.
guard(
    "psycopg",
    "psycopg.pool",
    "pgjobkit.pgconnect",
    "pgjobkit.stores.postgres",
    "pgjobkit.stores.supabase.http",
    "pgjobkit.stores.supabase.realtime",
    "realtime._async.client",
)


def open_store(settings: Settings, kind: str | None = None) -> JobStore:
    """The store the settings describe (``Settings.worker_store``; ``kind``: that one instead):
    SupabaseStore, PostgresStore or JetStreamStore, each naming in its errors the settings it came from."""
    kind = kind or settings.worker_store()
    try:
        return _open(settings, kind)
    except ModuleNotFoundError as exc:
        what = {
            "supabase": f"the Supabase store of {settings.origin('supabase_url')}",
            "postgres": f"the PostgreSQL store of {settings.origin('database_url')}",
            "jetstream": f"the JetStream store of {settings.origin('nats_url')}",
        }[kind]
        hint = missing(exc, what)
        if hint is None:
            raise
        raise ConfigurationError(hint) from None


def jetstream_options(settings: Settings) -> dict[str, Any]:
    """The JetStream store's options from the settings, its URL aside."""
    return {
        "timeout": settings.connect_timeout,
        "origin": settings.origin("nats_url"),
        "partitions": settings.nats_partitions,
    }


def _open(settings: Settings, kind: str) -> JobStore:
    if kind == "jetstream":
        from pgjobkit.stores.jetstream import JetStreamStore

        assert settings.nats_url is not None
        return JetStreamStore(settings.nats_url, **jetstream_options(settings))
    if kind == "supabase":
        from pgjobkit.stores.supabase import SupabaseStore

        assert settings.supabase_service_role_key is not None
        return SupabaseStore(
            settings.url,
            settings.supabase_service_role_key,
            timeout=settings.connect_timeout,
            max_rows=settings.max_rows,
            realtime=settings.realtime,
            origin=f"{settings.origin('supabase_url')} with {settings.origin('supabase_service_role_key')}",
        )
    from pgjobkit.stores.postgres import PostgresStore

    assert settings.database_url is not None
    return PostgresStore(
        settings.database_url.get_secret_value(),
        timeout=settings.connect_timeout,
        prepare=settings.prepare,
        origin=settings.origin("database_url"),
    )
