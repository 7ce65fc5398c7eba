"""Test-only: a narrow Supabase Realtime server, enough for Broadcast from the database on private channels.

What it reproduces, from supabase/realtime v2.129.8 (read at commit 833cf36c3a36) and the Python client
realtime 2.34.1:
- the socket at ``/realtime/v1/websocket?apikey=...&vsn=1.0.0``, Phoenix V1 JSON frames (objects, no
  ``join_ref`` from the server: lib/realtime_web/endpoint.ex, Phoenix's V1 serializer);
- the API key rules of the gateway (``tests/doubles/router.py``: sb_ keys map to role JWTs; a user's JWT, HS256 or
  ES256, rides in the join payload's ``access_token``, and ``sb_`` tokens there are ignored);
- ``phx_join``: a private channel is joined only when the joining role can read a probe message of the
  topic, checked in the real database exactly as Realtime does (``may_join``;
  lib/realtime/tenants/authorization.ex get_read_policies_for_connection); the refusal's reason text is
  Realtime's; replies are ``phx_reply`` with status ok / error;
- heartbeats on topic ``phoenix`` are answered; ``phx_leave`` and ``access_token`` are taken;
- every row inserted into realtime.messages is delivered to the sockets joined to its topic with the same
  privacy, as ``{"topic", "event": "broadcast", "payload": {"event", "payload", "type": "broadcast",
  "meta": {"id"}}, "ref": null}`` (lib/realtime_web/socket/user_broadcast.ex). Realtime reads them by
  logical replication; here a test-only trigger on realtime.messages NOTIFYs the server.
- ``drop()`` cuts every connection, as a network fault would: the client must reconnect and rejoin.
Not reproduced: presence, postgres_changes, client-sent broadcasts, rate limits, replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qs, urlparse

import psycopg
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from tests.doubles.router import PUBLISHABLE_KEY, SECRET_KEY, SupabaseRouter

CHANNEL = "jobkit_test_realtime"
TRIGGER = f"""
create or replace function realtime.jobkit_test_notify() returns trigger language plpgsql as $$
begin
  perform pg_notify('{CHANNEL}', json_build_object('id', new.id, 'topic', new.topic, 'event', new.event,
    'payload', new.payload, 'private', new.private)::text);
  return null;
end $$;
drop trigger if exists jobkit_test_notify on realtime.messages;
create trigger jobkit_test_notify after insert on realtime.messages
  for each row execute function realtime.jobkit_test_notify();
"""


def may_join(db_url: str, topic: str, claims: dict[str, Any]) -> bool:
    """Realtime's read check for a private channel: as its own user, insert a probe message for the topic;
    as the joining role, with its claims and realtime.topic set, try to select it; roll back."""
    with psycopg.connect(db_url) as conn:
        probe = uuid.uuid4()
        conn.execute(
            "insert into realtime.messages (id, topic, extension, private) values (%s, %s, 'broadcast', true)",
            (probe, topic),
        )
        conn.execute(
            "select set_config('role', %s, true), set_config('realtime.topic', %s, true), "
            "set_config('request.jwt.claims', %s, true)",
            (claims["role"], topic, json.dumps(claims)),
        )
        seen = conn.execute("select id from realtime.messages where id = any(%s)", ([probe],)).fetchall()
        conn.rollback()
    return len(seen) == 1


class RealtimeServer:
    """The server on 127.0.0.1 in a thread of its own; ``url`` is what a Supabase client is given."""

    def __init__(self, db_url: str) -> None:
        self.db_url = db_url
        self.keys = SupabaseRouter(db_url)  # its gateway key rules and JWT checks
        self.joins: list[tuple[str, bool]] = []  # (topic, allowed), for tests to read
        self._members: dict[ServerConnection, dict[str, bool]] = {}  # socket -> {topic: private}
        self._claims: dict[ServerConnection, dict[str, Any]] = {}
        self._loop = asyncio.new_event_loop()
        self._server: Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="realtime-test", daemon=True)
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(TRIGGER)

    def start(self) -> RealtimeServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        port = next(iter(self._server.sockets)).getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _start(self) -> None:
        """Listen for messages, then accept sockets: a client that has joined receives every message sent
        after its join, as on the real server (whose replication slot is open before it serves)."""
        listening = asyncio.Event()
        self._listener = asyncio.create_task(self._deliver(listening))
        await listening.wait()
        self._server = await serve(self._serve, "127.0.0.1", 0, process_request=self._gateway)

    def _gateway(self, connection: ServerConnection, request: Request) -> Response | None:
        url = urlparse(request.path)
        query = parse_qs(url.query)
        if url.path != "/realtime/v1/websocket" or query.get("vsn") != ["1.0.0"]:
            return connection.respond(404, "not found\n")
        apikey = (query.get("apikey") or [""])[0]
        if apikey not in (SECRET_KEY, PUBLISHABLE_KEY):
            return Response(401, "Unauthorized", Headers(), b'{"message":"Invalid API key"}')
        self._claims[connection] = self.keys._claims(self.keys._role_jwts[apikey])
        return None

    async def _serve(self, ws: ServerConnection) -> None:
        self._members[ws] = {}
        try:
            async for raw in ws:
                await self._handle(ws, json.loads(raw))
        except ConnectionClosed:  # a dropped socket ends here, as on the real server
            return
        finally:
            self._members.pop(ws, None)
            self._claims.pop(ws, None)

    async def _handle(self, ws: ServerConnection, msg: dict[str, Any]) -> None:
        topic, event, ref = msg.get("topic", ""), msg.get("event"), msg.get("ref")

        async def reply(status: str, response: dict[str, Any]) -> None:
            payload = {"status": status, "response": response}
            await ws.send(json.dumps({"topic": topic, "event": "phx_reply", "payload": payload, "ref": ref}))

        if topic == "phoenix" and event == "heartbeat":
            await reply("ok", {})
        elif event == "phx_join":
            payload = msg.get("payload") or {}
            private = bool((payload.get("config") or {}).get("private"))
            claims = self._claims[ws]
            token = payload.get("access_token")
            if token and not token.startswith("sb_"):
                try:
                    claims = self.keys._claims(token)
                except Exception:
                    await reply("error", {"reason": "InvalidJWTToken: Token has expired or is invalid"})
                    return
            sub = topic.removeprefix("realtime:")
            allowed = not private or await asyncio.to_thread(may_join, self.db_url, sub, claims)
            self.joins.append((sub, allowed))
            if not allowed:
                await reply(
                    "error",
                    {
                        "reason": f"Unauthorized: You do not have permissions to read from this Channel topic: {sub}"
                    },
                )
                return
            self._members[ws][topic] = private
            await reply("ok", {"postgres_changes": []})
        elif event == "phx_leave":
            self._members[ws].pop(topic, None)
            await reply("ok", {})

    async def _deliver(self, listening: asyncio.Event) -> None:
        async with await psycopg.AsyncConnection.connect(self.db_url, autocommit=True) as conn:
            await conn.execute(f"listen {CHANNEL}")
            listening.set()
            async for note in conn.notifies():
                row = json.loads(note.payload)
                topic = "realtime:" + row["topic"]
                frame = json.dumps(
                    {
                        "topic": topic,
                        "event": "broadcast",
                        "payload": {
                            "event": row["event"],
                            "payload": row["payload"],
                            "type": "broadcast",
                            "meta": {"id": row["id"]},
                        },
                        "ref": None,
                    }
                )
                for ws, topics in list(self._members.items()):
                    if topics.get(topic) == bool(row["private"]):
                        with contextlib.suppress(ConnectionClosed):  # a socket closing meanwhile
                            await ws.send(frame)

    def drop(self) -> None:
        """Cut every connection (the TCP connection aborted, no closing handshake), as a network fault would."""

        def abort_all() -> None:
            for ws in list(self._members):
                ws.transport.abort()

        self._loop.call_soon_threadsafe(abort_all)

    def close(self) -> None:
        async def stop() -> None:
            self._listener.cancel()
            if self._server is not None:
                self._server.close()
                await self._server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self.keys.close()


@contextmanager
def realtime_server(db_url: str) -> Iterator[RealtimeServer]:
    server = RealtimeServer(db_url).start()
    try:
        yield server
    finally:
        server.close()
