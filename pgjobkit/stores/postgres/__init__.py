"""PostgresStore and AsyncPostgresStore: the direct path, psycopg 3 over a sync or an async pool, calling
jobkit's SQL functions. Both run ``pgjobkit.ops`` calls; ``statements`` holds what they share, ``store_async``
the async store, and ``store`` its blocking twin, generated from it (tools/async_to_sync.py).

Pooler-safe: autocommit connections, every name schema-qualified, and by default no server-side prepared
statements (``prepare_threshold=None``). ``prepare=True`` lets psycopg prepare a statement from its fifth
use on a connection (psycopg's default): a call then skips parsing and planning (measured: one enqueue
650 to 525 us). Only for a direct connection or a session-mode pooler; a transaction-mode pooler may hand the
next statement to a session that never saw the prepared one. LISTEN/NOTIFY on channel ``jobkit_jobs``
wakes workers at once; polling stays the fallback (a pooler in transaction mode cannot LISTEN: pass
``listen_conninfo`` pointing at a session-mode or direct URL, or ``listen=False``). A call waits at most
``timeout`` seconds for a pooled connection; a wait past a second is said in jobkit's log, with the reason
(psycopg's pool logs alone).
"""

from pgjobkit.stores.postgres.store import PostgresStore
from pgjobkit.stores.postgres.store_async import AsyncPostgresStore

__all__ = ["AsyncPostgresStore", "PostgresStore"]
