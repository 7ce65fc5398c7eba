"""The metrics endpoint: Prometheus's scrape gets the registry; anything else a client sends gets a short answer
or is dropped, and the server goes on."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pgjobkit.exporters import metrics_server
from pgjobkit.exporters.metrics_server import MetricsServer, serve
from pgjobkit.exporters.prometheus import CONTENT_TYPE, Registry

HANG = 30  # seconds; only so that a broken server fails the test rather than hang it


def registry() -> Registry:
    reg = Registry()
    reg.counter("jobs_total", "Jobs done.", ["queue"]).labels('a "queue"\n').inc(3)
    reg.histogram("job_seconds", "Time.", buckets=[1]).observe(0.5)
    return reg


async def raw(server: MetricsServer, data: bytes) -> bytes:
    """Send ``data``, half-close, and read until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(data)
        await writer.drain()
        writer.write_eof()
        async with asyncio.timeout(HANG):
            return await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def status_of(response: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    version, status, _ = status_line.split(" ", 2)
    assert version == "HTTP/1.1"
    headers = dict(line.split(": ", 1) for line in lines)
    assert headers["Connection"] == "close"
    assert int(headers["Content-Length"]) == len(body)
    return int(status), headers, body


def test_a_scrape_gets_the_registry_in_the_text_format(caplog: pytest.LogCaptureFixture) -> None:
    reg = registry()

    async def main() -> None:
        with caplog.at_level(logging.INFO, logger="pgjobkit.observe"):
            server = await serve(reg, port=0)
        try:
            assert server.host == "127.0.0.1"
            assert f"metrics on http://127.0.0.1:{server.port}/metrics" in caplog.messages
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
                for path in ("/metrics", "/metrics?name[]=x&y"):
                    response = await client.get(path)
                    assert response.status_code == 200
                    assert response.headers["content-type"] == CONTENT_TYPE
                    assert response.headers["connection"] == "close"
                    assert response.content == reg.render()
                    families = {f.name: f for f in text_string_to_metric_families(response.text)}
                    assert [(s.labels, s.value) for s in families["jobs"].samples] == [
                        ({"queue": 'a "queue"\n'}, 3.0)
                    ]
                    assert families["job_seconds"].type == "histogram"
                head = await client.head("/metrics")
                assert head.status_code == 200
                assert head.content == b""
                assert head.headers["content-type"] == CONTENT_TYPE
                assert head.headers["content-length"] == str(len(reg.render()))
                index = await client.get("/")
                assert index.status_code == 200
                assert index.headers["content-type"].startswith("text/plain")
                assert "/metrics" in index.text
        finally:
            await server.close()

    asyncio.run(main())


def test_other_paths_are_404_and_other_methods_405() -> None:
    async def main() -> None:
        server = await serve(registry())
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
                for path in ("/nope", "/metrics/", "/metrics/x", "/METRICS", "/metrics%2F"):
                    assert (await client.get(path)).status_code == 404, path
                assert (await client.head("/nope")).status_code == 404
                for method in ("POST", "PUT", "DELETE", "OPTIONS", "PATCH"):
                    response = await client.request(method, "/metrics", content=b"x" * 100_000)
                    assert response.status_code == 405, method
                    assert response.headers["allow"] == "GET, HEAD"
                assert (await client.post("/nope")).status_code == 405
        finally:
            await server.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("request_bytes", "status"),
    [
        (b"GET /metrics HTTP/1.0\r\n\r\n", 200),
        (b"GET /metrics HTTP/1.1\nHost: x\n\n", 200),  # bare line feeds
        (b"\r\nGET /metrics HTTP/1.1\r\n\r\n", 200),  # one empty line before the request is skipped
        (b"GET http://example.com/metrics?x HTTP/1.1\r\n\r\n", 200),  # the absolute form
        (b"GET /metrics\r\n\r\n", 400),
        (b"GET /metrics HTTP/2.0\r\n\r\n", 400),
        (b"GET  /metrics HTTP/1.1\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1 extra\r\n\r\n", 400),
        (b"G(T /metrics HTTP/1.1\r\n\r\n", 400),
        (b"\x00\xff\xfe garbage\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nno colon here\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nA: b\r\n folded: c\r\n\r\n", 400),
        (b"BREW /metrics HTTP/1.1\r\n\r\n", 405),
        (b"GET //metrics HTTP/1.1\r\n\r\n", 404),
        (b"GET * HTTP/1.1\r\n\r\n", 404),
    ],
)
def test_request_lines_and_headers_are_checked(request_bytes: bytes, status: int) -> None:
    async def main() -> None:
        server = await serve(registry())
        try:
            got, _, body = status_of(await raw(server, request_bytes))
            assert got == status
            if status == 200:
                assert body == registry().render()
        finally:
            await server.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\n" + b"X-Many: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n" * 400 + b"\r\n",
        b"GET /" + b"m" * 20_000 + b" HTTP/1.1\r\n\r\n",
        b"x" * 100_000,
    ],
)
def test_a_request_head_over_8_kib_is_431(request_bytes: bytes) -> None:
    async def main() -> None:
        server = await serve(registry())
        try:
            assert status_of(await raw(server, request_bytes))[0] == 431
            async with httpx.AsyncClient() as client:  # and the server goes on
                assert (await client.get(f"http://127.0.0.1:{server.port}/metrics")).status_code == 200
        finally:
            await server.close()

    asyncio.run(main())


def test_a_silent_or_trickling_client_is_dropped_while_others_are_served(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics_server, "CLIENT_TIMEOUT", 0.2)

    async def trickle(writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 1000:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.02)

    async def main() -> None:
        server = await serve(registry())
        silent_reader, silent_writer = await asyncio.open_connection("127.0.0.1", server.port)
        slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", server.port)
        sender = asyncio.create_task(trickle(slow_writer))
        try:
            async with httpx.AsyncClient() as client:
                response = await client.get(f"http://127.0.0.1:{server.port}/metrics")
                assert response.status_code == 200
            async with asyncio.timeout(HANG):
                assert await silent_reader.read() == b""  # closed, unanswered
                with contextlib.suppress(ConnectionError):
                    assert await slow_reader.read() == b""
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
            for writer in (silent_writer, slow_writer):
                writer.close()
                with contextlib.suppress(ConnectionError):
                    await writer.wait_closed()
            await server.close()

    asyncio.run(main())


def test_before_scrape_runs_before_each_scrape() -> None:
    reg = Registry()
    depth = reg.gauge("queue_depth", "Jobs waiting.", ["queue"])
    calls: list[int] = []

    async def before_scrape() -> None:
        await asyncio.sleep(0)
        calls.append(1)
        depth.clear()
        depth.labels(f"q{len(calls)}").set(len(calls))

    async def main() -> None:
        server = await serve(reg, before_scrape=before_scrape)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
                for n in (1, 2, 3):
                    response = await client.get("/metrics")
                    [family] = text_string_to_metric_families(response.text)
                    assert [(s.labels, s.value) for s in family.samples] == [({"queue": f"q{n}"}, n)]
                await client.get("/")
                await client.get("/nope")
                assert len(calls) == 3
        finally:
            await server.close()

    asyncio.run(main())


def test_a_failing_or_slow_before_scrape_still_serves_the_registry(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(metrics_server, "BEFORE_SCRAPE_TIMEOUT", 0.05)
    reg = registry()
    cancelled: list[bool] = []

    async def failing() -> None:
        raise RuntimeError("the database is away")

    async def slow() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main() -> None:
        for before_scrape, says in (
            (failing, "before_scrape failed"),
            (slow, "before_scrape took over 0.05s"),
        ):
            caplog.clear()
            server = await serve(reg, before_scrape=before_scrape)
            try:
                async with httpx.AsyncClient() as client:
                    response = await client.get(f"http://127.0.0.1:{server.port}/metrics")
                assert response.status_code == 200
                assert response.content == reg.render()
                [record] = [
                    r for r in caplog.records if r.name == "pgjobkit.observe" and r.levelno == logging.WARNING
                ]
                assert says in record.getMessage()
            finally:
                await server.close()
        assert cancelled == [True]

    asyncio.run(main())


def test_an_error_in_a_connection_does_not_stop_the_server(caplog: pytest.LogCaptureFixture) -> None:
    class Flaky(Registry):
        failed = False

        def render(self) -> bytes:
            if not self.failed:
                self.failed = True
                raise RuntimeError("a bug")
            return super().render()

    async def main() -> None:
        server = await serve(Flaky())
        try:
            async with httpx.AsyncClient() as client:
                with (
                    caplog.at_level(logging.DEBUG, logger="pgjobkit.observe"),
                    pytest.raises(httpx.RemoteProtocolError),
                ):
                    await client.get(f"http://127.0.0.1:{server.port}/metrics")
                assert any(r.exc_info and "a bug" in str(r.exc_info[1]) for r in caplog.records)
                assert (await client.get(f"http://127.0.0.1:{server.port}/metrics")).status_code == 200
        finally:
            await server.close()

    asyncio.run(main())


def test_close_stops_listening_and_closes_open_connections() -> None:
    async def main() -> None:
        server = await serve(registry())
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            writer.write(b"GET /metr")  # and no more: the server waits for the rest (CLIENT_TIMEOUT is 5 s)
            await writer.drain()
            async with httpx.AsyncClient() as client:  # the half-sent request is being read by now
                assert (await client.get(f"http://127.0.0.1:{server.port}/")).status_code == 200
            async with asyncio.timeout(HANG):
                await server.close()
                assert await reader.read() == b""
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection("127.0.0.1", server.port)
            await server.close()  # twice is fine
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    asyncio.run(main())
