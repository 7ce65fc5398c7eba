"""The asyncio worker on real PostgreSQL, through the examples docs/guide/handlers.md points to: a FastAPI
endpoint that enqueues in its own transaction, and async handlers sharing one module-level HTTP client
across jobs."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import psycopg
import pytest

from pgjobkit import AsyncPostgresStore, NewJob
from tests.cli.conftest import JOBKIT, clean_env

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = 300
SCHEMA = "create table public.documents (id bigint generated always as identity primary key, body text not null check (body <> ''), embedding jsonb)"


class _Embeddings(BaseHTTPRequestHandler):
    """A stand-in embeddings API on HTTP/1.1 with Content-Length, so clients keep connections open."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def do_POST(self) -> None:
        text = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["input"]
        body = json.dumps({"embedding": [len(text), 0.5]}).encode()
        with self.server.lock:
            self.server.requests += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Embeddings)
        self.lock = threading.Lock()
        self.connections = 0
        self.requests = 0


@pytest.fixture
def embeddings() -> Iterator[_Server]:
    server = _Server()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture
def documents(db_url: str) -> str:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(SCHEMA)
    return db_url


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_examples_end_to_end(
    documents: str, embeddings: _Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOBKIT_DATABASE_URL", documents)
    app = _load(ROOT / "examples" / "app.py").app

    async def post() -> list[int]:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://app") as client,
        ):
            ids = [
                (await client.post("/documents", json={"body": f"doc {i}"})).json()["id"]
                for i in range(DOCUMENTS)
            ]
            assert (
                await client.post("/documents", json={"body": ""})
            ).status_code == 500  # insert fails: no job
            return ids

    ids = asyncio.run(post())
    with psycopg.connect(documents) as conn:
        jobs = conn.execute(
            "select payload->>'document_id' from public.jobkit_jobs order by created_at"
        ).fetchall()
    assert [int(j[0]) for j in jobs] == ids

    done = subprocess.run(
        [
            str(JOBKIT),
            "worker",
            "examples.worker:worker",
            "--until-empty",
            "--concurrency",
            "16",
            "--batch",
            "10",
        ],
        cwd=ROOT,
        env=clean_env(
            JOBKIT_DATABASE_URL=documents, EMBEDDINGS_URL=f"http://127.0.0.1:{embeddings.server_port}"
        ),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr  # and it returned: no hang at exit
    assert f"{DOCUMENTS} claimed: {DOCUMENTS} succeeded, 0 retrying, 0 dead, 0 lost" in done.stderr
    with psycopg.connect(documents) as conn:
        rows = conn.execute(
            "select status, attempts, count(*) from public.jobkit_jobs group by 1, 2"
        ).fetchall()
        embedded = conn.execute(
            "select count(*) from public.documents where embedding = jsonb_build_array(length(body), 0.5)"
        ).fetchone()
    assert rows == [("succeeded", 1, DOCUMENTS)]  # every job on its first attempt
    assert embedded == (DOCUMENTS,)
    assert embeddings.requests == DOCUMENTS
    # One client, one pool: 30 batches of 10 reuse a few kept-alive connections (at most one per job in
    # flight), never a connection per job or per batch, which a fresh event loop per call would force.
    assert embeddings.connections <= 16, embeddings.connections


def test_async_enqueue_rolls_back_with_the_callers_transaction(db_url: str) -> None:
    async def main() -> list[str | None]:
        async with AsyncPostgresStore(db_url) as store:
            async with await psycopg.AsyncConnection.connect(db_url) as conn:
                await store.enqueue(NewJob(type="embed", idempotency_key="doc-1"), conn=conn)
                await conn.rollback()
                await store.enqueue_many([NewJob(type="embed", idempotency_key="doc-2")], conn=conn)
                await conn.commit()
            return [j.idempotency_key for j in await store.list_jobs()]

    assert asyncio.run(main()) == ["doc-2"]
