"""A PostgreSQL server that refuses every login as a real one does, on the wire: the test server trusts
127.0.0.1, so a wrong password cannot be provoked there. It answers an SSL or GSS request with 'N', asks
for the password in clear text (as ``password`` auth does), reads it, then sends PostgreSQL's own FATAL
ErrorResponse (SQLSTATE 28P01, its message text) and closes, like the real server's auth failure.

Its sources: the frontend/backend protocol of PostgreSQL 15 (docs, "Message Flow: Start-up" and "Message
Formats": SSLRequest/GSSENCRequest codes, AuthenticationCleartextPassword, PasswordMessage, ErrorResponse
fields S, V, C, M), and src/backend/libpq/auth.c's auth_failed(), which reports ERRCODE_INVALID_PASSWORD
with 'password authentication failed for user "..."' at FATAL. It is no friendlier than the server: it
refuses every password, and it never sends AuthenticationOk."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from types import TracebackType

_SSL_REQUEST, _GSS_REQUEST = 80877103, 80877104


def _read_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("client went away")
        data += chunk
    return data


def _error(fields: dict[str, str]) -> bytes:
    body = b"".join(k.encode() + v.encode() + b"\0" for k, v in fields.items()) + b"\0"
    return b"E" + struct.pack("!I", len(body) + 4) + body


class RefusingPostgres:
    """``with RefusingPostgres() as server:`` then connect to ``server.port``; ``passwords`` holds what
    each client sent (the secret did reach the server: the refusal is the server's, not a parse error)."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]
        self.passwords: list[str] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> RefusingPostgres:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._sock.close()
        self._thread.join(5)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            with conn, contextlib.suppress(ConnectionError, OSError):  # the client gave up first
                self._refuse(conn)

    def _refuse(self, conn: socket.socket) -> None:
        while True:
            (length,) = struct.unpack("!I", _read_exact(conn, 4))
            packet = _read_exact(conn, length - 4)
            (code,) = struct.unpack("!I", packet[:4])
            if code in (_SSL_REQUEST, _GSS_REQUEST):
                conn.sendall(b"N")
                continue
            break
        parts = packet[4:].split(b"\0")
        params = dict(zip(parts[0::2], parts[1::2], strict=False))
        user = params.get(b"user", b"").decode()
        conn.sendall(b"R" + struct.pack("!II", 8, 3))  # AuthenticationCleartextPassword
        kind = _read_exact(conn, 1)
        (length,) = struct.unpack("!I", _read_exact(conn, 4))
        password = _read_exact(conn, length - 4)
        if kind == b"p":
            self.passwords.append(password.rstrip(b"\0").decode())
        conn.sendall(
            _error(
                {
                    "S": "FATAL",
                    "V": "FATAL",
                    "C": "28P01",
                    "M": f'password authentication failed for user "{user}"',
                    "F": "auth.c",
                    "L": "323",
                    "R": "auth_failed",
                }
            )
        )
