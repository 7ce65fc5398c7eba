"""A FastAPI endpoint that saves a document and enqueues its embedding in one transaction.

Both rows commit together or neither does: a failed insert leaves no orphan job, and a job never points
at a document that was rolled back. Run with ``JOBKIT_DATABASE_URL=... uvicorn examples.app:app``.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel

from pgjobkit import AsyncPostgresStore, NewJob

DATABASE_URL = os.environ["JOBKIT_DATABASE_URL"]
db = AsyncConnectionPool(DATABASE_URL, open=False)  # the app's own pool
jobs = AsyncPostgresStore(DATABASE_URL, listen=False)  # enqueues ride on the app's connection


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    await db.open()
    yield
    await db.close()
    await jobs.close()


app = FastAPI(lifespan=lifespan)


class Document(BaseModel):
    body: str


@app.post("/documents")
async def create_document(document: Document) -> dict[str, int]:
    async with db.connection() as conn, conn.transaction():
        cur = await conn.execute("insert into documents (body) values (%s) returning id", (document.body,))
        row = await cur.fetchone()
        assert row is not None
        doc_id = int(row[0])
        await jobs.enqueue(
            NewJob(type="embed", payload={"document_id": doc_id}, idempotency_key=f"embed:{doc_id}"),
            conn=conn,
        )
    return {"id": doc_id}
