"""A minimal HTTP endpoint for Prometheus to scrape: ``GET /metrics``, one request per connection, on asyncio."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from pgjobkit.exporters.prometheus import CONTENT_TYPE, Registry

log = logging.getLogger("pgjobkit.observe")

CLIENT_TIMEOUT = 5.0
"""Seconds a client has to send its request, and again to take the response; a slower one is dropped."""

BEFORE_SCRAPE_TIMEOUT = 2.0
"""Seconds ``before_scrape`` may take; after that the scrape goes on with what the registry has."""

LINGER_TIMEOUT = 1.0
"""Seconds, after the response, to read and drop what the client still sends before the connection closes."""

MAX_HEAD = 8192
"""Bytes of request line and headers a request may have; a longer one is answered 431."""

_REQUEST_LINE = re.compile(r"([!#$%&'*+.^_`|~0-9A-Za-z-]+) (\S+) HTTP/1\.[0-9]")
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
}


_Reply = tuple[int, dict[str, str], bytes, str]  # status, headers, body, the request's method


class _TooLarge(Exception):
    pass


class MetricsServer:
    """A running metrics endpoint: where it listens, and ``close()``."""

    def __init__(
        self, registry: Registry, host: str, before_scrape: Callable[[], Awaitable[None]] | None
    ) -> None:
        self.host = host
        self.port = 0
        self._registry, self._before_scrape = registry, before_scrape
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._closing = False

    async def close(self) -> None:
        """Stop listening, close the open connections, and wait until both are done."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            if not self._closing:  # (a connection accepted just before close() is closed unanswered)
                await self._respond(reader, writer)
        except Exception:  # a client's mistakes, or ours: the connection ends, the server goes on
            log.debug("metrics connection failed", exc_info=True)
        except asyncio.CancelledError:  # close(); nothing awaits this task but close(), and Python 3.11's
            pass  # streams log a handler that ends cancelled as an error
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _respond(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(CLIENT_TIMEOUT):
                head = await _read_head(reader)
        except TimeoutError:
            log.debug("metrics client sent no request in %ss; dropped", CLIENT_TIMEOUT)
            return
        except _TooLarge:
            reply: _Reply = (431, {}, b"request line and headers are too large\n", "GET")
        else:
            if head is None:  # the client closed before the end of its headers
                return
            reply = await self._route(head)
        status, headers, body, method = reply
        data = _message(status, headers, b"" if method == "HEAD" else body, len(body))
        async with asyncio.timeout(CLIENT_TIMEOUT):
            writer.write(data)
            await writer.drain()
        # Read what the client still sends (a body, or the rest of a header too large) until it closes, so
        # that closing with unread input does not reset the connection under a response it has not read.
        with contextlib.suppress(TimeoutError, ConnectionError):
            if writer.can_write_eof():
                writer.write_eof()
            async with asyncio.timeout(LINGER_TIMEOUT):
                while await reader.read(65536):
                    pass

    async def _route(self, head: list[str]) -> _Reply:
        match = _REQUEST_LINE.fullmatch(head[0])
        if match is None or any(":" not in line or line[0] in " \t" for line in head[1:]):
            return 400, {}, b"malformed request\n", "GET"
        method, target = match.group(1), match.group(2)
        if method not in ("GET", "HEAD"):
            return 405, {"Allow": "GET, HEAD"}, b"only GET and HEAD\n", method
        if target.startswith(("http://", "https://")):  # the absolute form, as sent to a proxy
            target = urlsplit(target).path or "/"
        path = target.partition("?")[0]
        if path == "/":
            return 200, {}, b"jobkit metrics: /metrics\n", method
        if path != "/metrics":
            return 404, {}, b"not found; metrics are at /metrics\n", method
        if self._before_scrape is not None:
            try:
                async with asyncio.timeout(BEFORE_SCRAPE_TIMEOUT):
                    await self._before_scrape()
            except TimeoutError:
                log.warning(
                    "before_scrape took over %ss; serving the metrics as they are", BEFORE_SCRAPE_TIMEOUT
                )
            except Exception:
                log.warning("before_scrape failed; serving the metrics as they are", exc_info=True)
        return 200, {"Content-Type": CONTENT_TYPE}, self._registry.render(), method


async def _read_head(reader: asyncio.StreamReader) -> list[str] | None:
    """The request line and header lines, or None if the client closed first; _TooLarge past MAX_HEAD."""
    lines: list[str] = []
    size = 0
    while True:
        try:
            line = await reader.readline()
        except ValueError as exc:  # one line longer than the reader's limit
            raise _TooLarge from exc
        size += len(line)
        if size > MAX_HEAD:
            raise _TooLarge
        if not line.endswith(b"\n"):
            return None
        text = line.rstrip(b"\r\n").decode("latin-1")
        if text:
            lines.append(text)
        elif lines:  # the empty line that ends the headers (empty lines before the request line are skipped)
            return lines


def _message(status: int, headers: dict[str, str], body: bytes, length: int) -> bytes:
    head = [f"HTTP/1.1 {status} {_REASONS[status]}"]
    head += [f"{k}: {v}" for k, v in {"Content-Type": "text/plain; charset=utf-8", **headers}.items()]
    head += [f"Content-Length: {length}", "Connection: close", "", ""]
    return "\r\n".join(head).encode("latin-1") + body


async def serve(
    registry: Registry,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    before_scrape: Callable[[], Awaitable[None]] | None = None,
) -> MetricsServer:
    """Serve ``registry`` at ``http://host:port/metrics`` (port 0: any free port, see ``.port``) until closed.

    ``before_scrape``, if given, is awaited before each scrape renders (to set gauges such as queue depth)."""
    metrics = MetricsServer(registry, host, before_scrape)
    metrics._server = await asyncio.start_server(metrics._handle, host, port, limit=MAX_HEAD)
    metrics.port = metrics._server.sockets[0].getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    log.info("metrics on http://%s:%s/metrics", shown, metrics.port)
    return metrics
