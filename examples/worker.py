"""An async worker that embeds documents through one HTTP client shared by every job.

The client and the database pool live at module level, as they would in any async app: the worker runs
every async handler on one long-lived event loop, so kept-alive connections serve job after job, and
closes them in its ``on_stop`` hook. Run with
``JOBKIT_DATABASE_URL=... EMBEDDINGS_URL=... pgjobkit worker examples.worker:worker``.
"""

from __future__ import annotations

import json
import os

import httpx
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

from pgjobkit import AsyncPostgresStore, Permanent, Retry, Worker

DATABASE_URL = os.environ["JOBKIT_DATABASE_URL"]
api = httpx.AsyncClient(base_url=os.environ["EMBEDDINGS_URL"], timeout=30)
db = AsyncConnectionPool(DATABASE_URL, open=False)
worker = Worker(AsyncPostgresStore(DATABASE_URL))


class Embed(BaseModel):
    document_id: int


@worker.handler("embed", payload=Embed, max_attempts=5)
async def embed(payload: Embed) -> None:
    await db.open()  # safe to call again: the first job opens the pool on the worker's loop
    async with db.connection() as conn:
        cur = await conn.execute("select body from documents where id = %s", (payload.document_id,))
        row = await cur.fetchone()
    if row is None:
        raise Permanent(f"document {payload.document_id} is gone")
    response = await api.post("/embed", json={"input": row[0]})  # no database connection held meanwhile
    if response.status_code == 429:
        raise Retry("embedding API rate limit", after=float(response.headers.get("retry-after", 30)))
    response.raise_for_status()
    async with db.connection() as conn:  # idempotent: running twice writes the same vector
        await conn.execute(
            "update documents set embedding = %s where id = %s",
            (json.dumps(response.json()["embedding"]), payload.document_id),
        )


@worker.on_stop
async def close() -> None:
    """When the worker has finished its jobs: close the shared client and pool on the loop that used them."""
    await api.aclose()
    await db.close()
