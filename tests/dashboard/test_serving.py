"""The dashboard served as ``pgjobkit dashboard`` serves it, over real sockets on 127.0.0.1: slow clients
are cut off, connections past the cap are refused at once, and only the dashboard's own hosts are
served. Bounds are small here (a second to send a request, 8 connections); each wait is an upper bound
that only a failure reaches."""

from __future__ import annotations

import select
import socket
from collections.abc import Iterator

import pytest

from pgjobkit.dashboard import create_app
from pgjobkit.stores.memory import MemoryStore
from tests.dashboard.conftest import TOKEN, served

BOUND = 10.0  # seconds any answer may take; reached only when it never comes
CAP = 8


@pytest.fixture
def port() -> Iterator[int]:
    """A dashboard with a second for a client to send a request in."""
    with served(create_app(MemoryStore().as_async(), TOKEN), read_timeout=1.0, max_connections=64) as bound:
        yield bound


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=BOUND)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def answer(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection ('' when it closes without a word)."""
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def one_answer(sock: socket.socket) -> bytes:
    """One answer on a connection kept open: its head, and as many bytes as its Content-Length says."""
    out = b""
    while b"\r\n\r\n" not in out:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {out!r}"
        out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    length = int(
        next(
            line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        )
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed after {out!r}"
        body += chunk
    return head + b"\r\n\r\n" + body


def ask(port: int, request: bytes) -> bytes:
    """The whole answer to ``request`` on a new connection (which the request asks to close)."""
    with connect(port) as sock:
        sock.sendall(request)
        return answer(sock)


def get(path: str, host: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()


def test_a_client_that_sends_nothing_or_dribbles_its_head_or_body_is_cut_off(port: int) -> None:
    host = f"127.0.0.1:{port}"
    silent = connect(port)
    head = connect(port)
    head.sendall(f"GET /login HTTP/1.1\r\nHost: {host}\r\n".encode())
    body = connect(port)
    body.sendall(
        f"POST /login HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        "Content-Length: 1000\r\n\r\ntoken=".encode()
    )
    open_ = {"silent": silent, "head": head, "body": body}
    answers: dict[str, bytes] = {}
    for _ in range(int(BOUND / 0.1)):  # a byte each tenth of a second, for as long as the server takes it
        if not open_:
            break
        ready, _, _ = select.select(list(open_.values()), [], [], 0.1)
        for name, sock in list(open_.items()):
            if sock in ready:
                answers[name] = answer(sock)
                del open_[name]
            else:
                try:
                    sock.sendall(b"X-Slow: 1\r\n" if name == "head" else b"x" if name == "body" else b"")
                except (BrokenPipeError, ConnectionResetError):
                    answers[name], _ = b"", open_.pop(name)
    for sock in (silent, head, body):
        sock.close()
    assert not open_, f"still open after {BOUND}s: {sorted(open_)}"
    for name in ("silent", "head", "body"):
        assert answers[name] == b"" or answers[name].startswith(b"HTTP/1.1 408 "), (name, answers[name])
    assert ask(port, get("/healthz", host)).endswith(b"\r\n\r\nok")  # and the server still serves


def test_connections_past_the_cap_are_refused_at_once_and_served_again_once_one_closes() -> None:
    app = create_app(MemoryStore().as_async(), TOKEN)
    with served(app, read_timeout=BOUND, max_connections=CAP) as port:
        host = f"127.0.0.1:{port}"
        held = [connect(port) for _ in range(CAP)]
        try:
            for sock in held:  # each served once (so the server has it), then holding a head it never ends
                sock.sendall(f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                assert one_answer(sock).endswith(b"\r\n\r\nok")
                sock.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\n".encode())
            with connect(port) as extra:  # answered before it asks anything
                refused = answer(extra)
            assert refused.startswith(b"HTTP/1.1 503 ") and b"Too many connections" in refused, refused
            held.pop().close()
            served_again = b""
            for _ in range(50):  # until the server has seen that one close
                served_again = ask(port, get("/healthz", host))
                if served_again.startswith(b"HTTP/1.1 200 "):
                    break
                select.select([], [], [], 0.05)
            assert served_again.startswith(b"HTTP/1.1 200 ") and served_again.endswith(b"ok"), served_again
        finally:
            for sock in held:
                sock.close()


def test_a_head_or_a_body_too_large_is_refused_unread(port: int) -> None:
    host = f"127.0.0.1:{port}"
    huge_head = f"GET /login HTTP/1.1\r\nHost: {host}\r\nX-Big: {'a' * 20_000}\r\n\r\n".encode()
    assert ask(port, huge_head).startswith(b"HTTP/1.1 431 ")  # sent at once
    with connect(port) as sock:  # or a piece at a time
        sock.sendall(f"GET /login HTTP/1.1\r\nHost: {host}\r\n".encode())
        try:
            for _ in range(40):
                sock.sendall(b"X-Big: " + b"a" * 1000 + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        refused = answer(sock)  # nothing, when the pieces it sent after the answer reset the connection
        assert refused == b"" or refused.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 431 ")), refused
    ok = f"GET /login HTTP/1.1\r\nHost: {host}\r\nX-Fine: {'a' * 10_000}\r\nConnection: close\r\n\r\n"
    assert ask(port, ok.encode()).startswith(b"HTTP/1.1 200 ")
    huge_body = (
        f"POST /login HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        "Content-Length: 100000000\r\nConnection: close\r\n\r\ntoken="
    ).encode()
    assert ask(port, huge_body).startswith(b"HTTP/1.1 413 ")


def test_only_the_dashboards_own_hosts_are_served(port: int) -> None:
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost:{port}", f"[::1]:{port}"):
        assert ask(port, get("/healthz", host)).startswith(b"HTTP/1.1 200 "), host
    for host in (f"evil.test:{port}", "127.0.0.1", "localhost", f"localhost:{port + 1}", f"127.0.0.2:{port}"):
        refused = ask(port, get("/login", host))
        assert refused.startswith(b"HTTP/1.1 421 ") and b"<" not in refused, host
    no_host = ask(port, b"GET /login HTTP/1.0\r\n\r\n")
    assert no_host.startswith(b"HTTP/1.1 421 ")
    twice = ask(
        port,
        f"GET /login HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nHost: evil.test\r\nConnection: close\r\n\r\n".encode(),
    )
    assert twice.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 421 "))
