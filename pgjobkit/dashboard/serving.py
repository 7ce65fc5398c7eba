"""How ``pgjobkit dashboard`` serves the app: uvicorn, on its h11 protocol with the bounds uvicorn lacks.

uvicorn bounds the size of a request's head while it arrives (``h11_max_incomplete_event_size``: one
that arrives in one read is parsed whatever its size), how long a connection
may idle between requests (``timeout_keep_alive``) and how many requests run at once
(``limit_concurrency``: past it, a request is answered 503, but its connection stays open). It has no
timeout on reading a request: a client that opens a connection and sends nothing, or a header byte every
few seconds, or a body that never ends, holds its connection (a file descriptor) for as long as it likes.
``BoundedH11Protocol`` adds that timeout and a cap on open connections."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

READ_TIMEOUT = 15.0  # seconds a client has to send a request's head and body, from its first byte
MAX_CONNECTIONS = 100  # open connections at once (a browser opens 6 to a host); far below a 1,024 fd limit
MAX_HEAD = 16 * 1024  # bytes of a request's line and headers (h11's default, said here)
KEEP_ALIVE = 5  # seconds an idle connection is kept between requests (uvicorn's default, said here)
BACKLOG = 128  # connections the kernel queues before they are accepted


def _plain(status: str, text: str, *headers: str) -> bytes:
    """A whole response, written by the protocol itself: ``status``, then ``text`` and the connection
    closed."""
    body = text.encode()
    head = [f"HTTP/1.1 {status}", "content-type: text/plain; charset=utf-8", "connection: close", *headers]
    return "\r\n".join([*head, f"content-length: {len(body)}", "", ""]).encode() + body


TIMED_OUT = _plain("408 Request Timeout", "The request took too long to arrive.\n")
TOO_LARGE = _plain("431 Request Header Fields Too Large", "The request's headers are too large.\n")
BUSY = _plain("503 Service Unavailable", "Too many connections: try again.\n", "retry-after: 5")
_HEAD_END = re.compile(rb"\n\r?\n")  # where a request's head ends (h11 takes a bare LF too)
# a request has been read whole (or the connection is done with) once its client is in one of these
_READ = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR, h11.SWITCHED_PROTOCOL)


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, bounded: a client has ``read_timeout`` seconds, from the connection's
    opening or from the first byte of a request, to send that request's head and body (or be answered
    408 and closed); a head longer than ``max_head`` is answered 431 and closed, however it arrives; and
    past ``max_connections`` open connections a new one is answered 503 and closed at once, so that slow
    clients cannot take every file descriptor. Between requests uvicorn's keep-alive timeout applies. A
    subclass per server sets the timeout and the cap (see ``config``)."""

    read_timeout = READ_TIMEOUT
    max_connections = MAX_CONNECTIONS
    max_head = MAX_HEAD

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self.connections.discard(self)  # never counted: it is closed before it is read
            transport.write(BUSY)
            transport.close()
            return
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._deadline is None:
            self._arm()  # the first byte of a request (or of more than one)
        if self.conn.their_state is h11.IDLE and self._head_too_large(data):
            self.transport.write(TOO_LARGE)
            self.transport.close()
            return
        super().data_received(data)
        if self.conn.their_state in _READ:
            self._disarm()  # read whole: what the app then takes is not the client's to slow

    def on_response_complete(self) -> None:
        super().on_response_complete()  # arms uvicorn's keep-alive timer, then reads a pipelined request
        state = self.conn.their_state
        if state in _READ or (state is h11.IDLE and not self.conn.trailing_data[0]):
            self._disarm()  # nothing more sent yet: the keep-alive timer watches it
        elif self._deadline is None:
            self._arm()  # a pipelined request, or a body the app did not read, still coming

    def _head_too_large(self, data: bytes) -> bool:
        """Whether the request head that ``data`` begins or goes on is longer than ``max_head``. h11's own
        bound holds only for a head that arrives in pieces: one that arrives whole is parsed, however
        long."""
        start = self.conn.trailing_data[0][-3:]  # what was taken before: at most max_head (h11's bound)
        taken = len(self.conn.trailing_data[0])
        if taken + len(data) <= self.max_head:
            return False
        window = start + data[: self.max_head - taken + 1]
        return _HEAD_END.search(window) is None

    def _arm(self) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(self.read_timeout, self._timed_out)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _timed_out(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        writing = cycle is not None and cycle.response_started and not cycle.response_complete
        begun = self.conn.their_state is h11.SEND_BODY or bool(self.conn.trailing_data[0])
        if begun and not writing:  # a connection that never sent a byte is closed without a word
            self.transport.write(TIMED_OUT)  # (as a browser's spare one is, which it opened in advance)
        self.transport.close()


def config(
    app: Any,
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    read_timeout: float = READ_TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
) -> uvicorn.Config:
    """uvicorn's configuration for the dashboard ``app`` on ``host``:``port``: the bounded h11 protocol
    (``read_timeout`` seconds to send a request, ``max_connections`` open at once), no WebSocket, no
    Server header, warnings only in the log."""
    timeout, cap = read_timeout, max_connections

    class Bounded(BoundedH11Protocol):
        read_timeout = timeout
        max_connections = cap

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=Bounded,
        ws="none",
        # requests still running (a slow store) after their connections closed count here; one more than
        # the connections, since uvicorn refuses at the limit, counting the connection asking
        limit_concurrency=cap + 1,
        timeout_keep_alive=KEEP_ALIVE,
        h11_max_incomplete_event_size=MAX_HEAD,
        backlog=BACKLOG,
        log_level="warning",
        server_header=False,
    )
