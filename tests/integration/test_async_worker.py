"""The asyncio worker on real PostgreSQL: async handlers sharing one long-lived client across jobs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobkit import NewJob, PostgresStore

JOBS = 300


class _KeepAlive(BaseHTTPRequestHandler):
    """HTTP/1.1 with Content-Length, so a client keeps each connection open for its next request."""

    protocol_version = "HTTP/1.1"
    server: _CountingServer

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.requests += 1
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _CountingServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _KeepAlive)
        self.lock = threading.Lock()
        self.connections = 0
        self.requests = 0


@pytest.fixture
def http_server() -> Iterator[_CountingServer]:
    server = _CountingServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# A user's worker module as the docs show it: one module-level httpx.AsyncClient, shared by every job.
APP = """
    import dataclasses, json, sys

    import httpx

    from jobkit import PostgresStore, Worker

    client = httpx.AsyncClient(base_url=sys.argv[2], timeout=10)
    worker = Worker(PostgresStore(sys.argv[1]), concurrency=16, batch_size=10, poll_interval=0.05)


    @worker.handler("fetch")
    async def fetch(payload):
        response = await client.get("/", params={"n": payload["n"]})
        response.raise_for_status()


    if __name__ == "__main__":
        print(json.dumps(dataclasses.asdict(worker.run(until_empty=True))))
"""


def test_async_handlers_share_one_module_level_client_across_batches(
    db_url: str, http_server: _CountingServer, tmp_path: Path
) -> None:
    with PostgresStore(db_url) as store:
        store.enqueue_many([NewJob(type="fetch", payload={"n": i}) for i in range(JOBS)])
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent(APP))
    url = f"http://127.0.0.1:{http_server.server_address[1]}"
    done = subprocess.run(
        [sys.executable, str(app), db_url, url], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr  # and it returned: no hang at exit
    summary = json.loads(done.stdout)
    assert (summary["claimed"], summary["succeeded"], summary["retrying"], summary["dead"]) == (
        JOBS,
        JOBS,
        0,
        0,
    )
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "select status, attempts, count(*) from public.jobkit_jobs group by 1, 2"
        ).fetchall()
    assert rows == [("succeeded", 1, JOBS)]  # every job on its first attempt
    assert http_server.requests == JOBS
    # One client, one pool: 30 batches of 10 reuse a handful of kept-alive connections, never a
    # connection per job or per batch (which a fresh event loop per call would force, and break).
    assert http_server.connections <= 16, http_server.connections
