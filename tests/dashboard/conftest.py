"""The dashboard on a store, driven in process: httpx's ASGI transport on one event loop kept between
requests (``asyncio.Runner``), so a PostgreSQL pool lives on the loop it was opened on. The blocking twin of
the same store arranges the jobs and checks what changed."""

from __future__ import annotations

import asyncio
import re
import socket
import threading
from collections.abc import Iterable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest
import uvicorn

from pgjobkit.dashboard import create_app, serving
from pgjobkit.stores.base import JobStore
from pgjobkit.stores.base_async import AsyncJobStore
from pgjobkit.stores.memory import MemoryStore
from pgjobkit.stores.postgres import AsyncPostgresStore, PostgresStore

TOKEN = "dashboard-test-token-0123456789"
BASE = "http://testserver"
ORIGIN = BASE  # what a browser sends as Origin from the dashboard's own pages
PASSWORD = "pw-jobkit-dashboard-7d1c0e"  # put in the app's database URL: no page may show it
HOSTILE = "<script>alert(1)</script>\"'&é✓"
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


class Clock:
    """Now, moved on by ``advance``."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, by: timedelta) -> None:
        self.offset += by


class Dash:
    """The dashboard app on ``app_store`` with a client that keeps its cookies (at 127.0.0.1); ``store``
    (blocking, on the same jobs) arranges and checks. ``secret``: a string no response may contain."""

    def __init__(
        self,
        store: JobStore,
        app_store: AsyncJobStore,
        secret: str | None = None,
        base: str = BASE,
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        self.store, self.secret, self.base = store, secret, base
        self.clock = Clock()
        self.app = create_app(app_store, TOKEN, clock=self.clock, allowed_hosts=allowed_hosts)
        self.bodies: list[str] = []  # every response's body, for the checks that span them all
        self._runner = asyncio.Runner()
        self._lifespan: AbstractAsyncContextManager[Any] = self.app.router.lifespan_context(self.app)
        self._runner.run(self._lifespan.__aenter__())
        self._clients: list[httpx.AsyncClient] = []
        self.http = self.client("127.0.0.1")

    def client(self, address: str) -> httpx.AsyncClient:
        """Another browser, with cookies of its own, connecting from ``address``."""
        transport = httpx.ASGITransport(app=self.app, client=(address, 40000))
        made = httpx.AsyncClient(transport=transport, base_url=self.base)
        self._clients.append(made)
        return made

    def request(
        self, method: str, url: str, *, via: httpx.AsyncClient | None = None, **kwargs: Any
    ) -> httpx.Response:
        """One request (redirects not followed), by ``via`` (default: ``http``); its body is kept in
        ``bodies``."""
        response = self._runner.run((via or self.http).request(method, url, **kwargs))
        self.bodies.append(response.text)
        return response

    def get(self, url: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, data: Any = None, **kwargs: Any) -> httpx.Response:
        return self.request("POST", url, data=data, **kwargs)

    def login(self) -> str:
        """Sign in with the token; the session's CSRF token."""
        response = self.post("/login", {"token": TOKEN})
        assert response.status_code == 303 and response.headers["location"] == "/", response.text
        return self.csrf()

    def csrf(self, page: str = "/") -> str:
        """The CSRF token the forms of ``page`` carry."""
        match = _CSRF.search(self.get(page).text)
        assert match is not None, f"no CSRF field on {page}"
        return match.group(1)

    def act(self, url: str, data: dict[str, Any]) -> httpx.Response:
        """A form posted as the dashboard's own page would (same Origin), expecting the redirect after it."""
        response = self.post(url, data, headers={"Origin": self.base})
        assert response.status_code == 303, response.text
        return response

    def flash(self, page: str) -> list[str]:
        """The messages ``page`` shows."""
        return re.findall(r'<p class="flash" role="status">(.*?)</p>', self.get(page).text, re.S)

    def close(self) -> None:
        for client in self._clients:
            self._runner.run(client.aclose())
        self._runner.run(self._lifespan.__aexit__(None, None, None))  # closes the app's store
        self._runner.close()


def with_password(url: str) -> tuple[str, str]:
    """``url`` with a password (its own, or PASSWORD: the test server trusts local connections, so any
    password is accepted), and that password."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    password = str(info.get("password") or PASSWORD)
    info["password"] = password
    return psycopg.conninfo.make_conninfo("", **{k: v for k, v in info.items() if v is not None}), password


def make_dash(kind: str, request: pytest.FixtureRequest) -> Dash:
    """A Dash on a fresh store of ``kind`` (memory, postgres)."""
    if kind == "memory":
        memory = MemoryStore()
        return Dash(memory, memory.as_async())
    db_url: str = request.getfixturevalue("db_url")
    url, password = with_password(db_url)
    return Dash(PostgresStore(db_url, max_size=2), AsyncPostgresStore(url, max_size=2), secret=password)


@pytest.fixture(params=["memory", "postgres"])
def dash(request: pytest.FixtureRequest) -> Iterator[Dash]:
    """The dashboard, signed out, on a memory store and on PostgreSQL."""
    made = make_dash(request.param, request)
    try:
        yield made
    finally:
        made.close()
        made.store.close()


@pytest.fixture
def memory_dash() -> Iterator[Dash]:
    """The dashboard on a memory store alone (checks that do not depend on the store)."""
    memory = MemoryStore()
    made = Dash(memory, memory.as_async())
    try:
        yield made
    finally:
        made.close()


@contextmanager
def served(app: Any, **bounds: Any) -> Iterator[int]:
    """``app`` served as ``pgjobkit dashboard`` serves it (``serving.config``, with ``bounds``), by uvicorn
    in a thread on 127.0.0.1; its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port: int = listener.getsockname()[1]
    server = uvicorn.Server(serving.config(app, "127.0.0.1", port, **bounds))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    started = threading.Event()
    while not started.wait(0.02):
        if server.started:
            started.set()
        elif not thread.is_alive():
            pytest.fail("uvicorn stopped before it served the dashboard (see its log above)")
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join()
        listener.close()
