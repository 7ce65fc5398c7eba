"""Live updates, the client half, against the narrow Realtime server (tests/doubles/realtime_server.py) over a real
websocket and the real database: a user's watch(), who may join what, and workers woken by Realtime."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from realtime import AsyncRealtimeClient

from pgjobkit import AsyncSupabaseStore, AsyncUserJobs, JobStatus, PermissionDenied, UserJobs, Worker
from pgjobkit.stores.supabase.realtime import WORKERS_TOPIC, JobUpdate, _join, realtime_url, user_topic
from tests.doubles import pgtemplate
from tests.doubles.realtime_server import RealtimeServer, realtime_server
from tests.doubles.router import BASE_URL, PUBLISHABLE_KEY, SECRET_KEY, SupabaseRouter, make_jwt
from tests.sql.helpers import make_user


@pytest.fixture
def server(db_url: str) -> Iterator[RealtimeServer]:
    with realtime_server(db_url) as s:
        yield s


def test_a_user_watches_their_own_jobs_live(server: RealtimeServer, pg: psycopg.Connection[Any]) -> None:
    a, b = make_user(pg), make_user(pg)

    async def main() -> list[JobUpdate]:
        jobs = AsyncUserJobs(
            BASE_URL, PUBLISHABLE_KEY, make_jwt("authenticated", sub=a), realtime_url=server.url
        )
        seen: list[JobUpdate] = []
        watching = jobs.watch()
        first = asyncio.ensure_future(anext(watching))
        while not any(t == user_topic(a) and ok for t, ok in server.joins):
            await asyncio.sleep(0.01)
        await asyncio.to_thread(_lifecycle, pg, a, b)
        seen.append(await asyncio.wait_for(first, 5))
        while seen[-1].status != JobStatus.SUCCEEDED:
            seen.append(await asyncio.wait_for(anext(watching), 5))
        await watching.aclose()  # type: ignore[attr-defined]
        return seen

    seen = asyncio.run(main())
    assert [(u.status, u.progress, u.progress_message) for u in seen] == [
        (JobStatus.QUEUED, None, None),
        (JobStatus.RUNNING, None, None),
        (JobStatus.RUNNING, 0.5, "half"),
        (JobStatus.SUCCEEDED, 1.0, "half"),
    ]
    assert len({u.id for u in seen}) == 1  # b's job, changing in between, never arrived


def _lifecycle(pg: psycopg.Connection[Any], a: str, b: str) -> None:
    for owner in (b, a):
        pg.execute("select public.jobkit_enqueue('transcribe', p_user_id => %s)", (owner,))
    for _ in range(2):
        job = pg.execute("select * from public.jobkit_claim(array['transcribe'], 'w', 30, 1)").fetchone()
        assert job is not None
        ids, tokens = [job["id"]], [job["lease_token"]]
        pg.execute("select public.jobkit_progress(%s, %s, array[0.5], array['half'])", (ids, tokens))
        pg.execute("select public.jobkit_complete(%s, %s)", (ids, tokens))


def test_nobody_joins_another_users_topic_or_the_workers(
    server: RealtimeServer, pg: psycopg.Connection[Any]
) -> None:
    a, b = make_user(pg), make_user(pg)

    async def refused(token: str, topic: str, key: str = PUBLISHABLE_KEY) -> bool:
        client = AsyncRealtimeClient(realtime_url(server.url), key)
        await client.set_auth(token)
        try:
            await _join(client, topic, "job", lambda message: None)
        except PermissionDenied:
            return True
        finally:
            await client.close()
        return False

    async def main() -> list[bool]:
        user = make_jwt("authenticated", sub=a)
        return [
            await refused(user, user_topic(b)),
            await refused(user, WORKERS_TOPIC),
            await refused(PUBLISHABLE_KEY, user_topic(a)),  # the publishable key alone is anon
            await refused(user, user_topic(a)),
            await refused(SECRET_KEY, WORKERS_TOPIC, SECRET_KEY),
        ]

    assert asyncio.run(main()) == [True, True, True, False, False]


def _worker(realtime: str, picked: threading.Event, poll: float) -> Worker:
    store = AsyncSupabaseStore(BASE_URL, SECRET_KEY, realtime=realtime)
    worker = Worker(store, poll_interval=poll, lease=timedelta(seconds=30))
    worker.register("ping", lambda p: picked.set())
    return worker


def test_a_worker_on_the_supabase_path_wakes_on_realtime_and_rejoins_after_a_drop(
    server: RealtimeServer, router: SupabaseRouter, pg: psycopg.Connection[Any]
) -> None:
    picked = threading.Event()
    worker = _worker(server.url, picked, poll=30.0)  # polling alone would take 30 s
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not any(t == WORKERS_TOPIC and ok for t, ok in server.joins) and time.monotonic() < deadline:
            time.sleep(0.01)
        for _ in range(3):
            time.sleep(0.3)  # the worker has found nothing and sleeps
            sent = time.monotonic()
            pg.execute("select public.jobkit_enqueue('ping')")
            assert picked.wait(5) and time.monotonic() - sent < 2
            picked.clear()
        server.drop()  # a network fault: the client reconnects and rejoins by itself
        deadline = time.monotonic() + 15
        while len(server.joins) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.joins == [(WORKERS_TOPIC, True)] * 2
        time.sleep(0.3)
        sent = time.monotonic()
        pg.execute("select public.jobkit_enqueue('ping')")
        assert picked.wait(5) and time.monotonic() - sent < 2  # woken again, not by the 30 s poll
    finally:
        worker.stop()
        thread.join(15)
    assert not thread.is_alive()


def test_without_realtime_the_worker_polls(
    router: SupabaseRouter, pg: psycopg.Connection[Any], caplog: Any
) -> None:
    picked = threading.Event()
    nothing = f"http://127.0.0.1:{pgtemplate.free_port()}"  # no Realtime listens there
    worker = _worker(nothing, picked, poll=0.2)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        pg.execute("select public.jobkit_enqueue('ping')")
        assert picked.wait(5)
    finally:
        worker.stop()
        thread.join(15)
    assert not thread.is_alive()


def test_the_test_server_speaks_the_protocol_as_realtime_does(server: RealtimeServer) -> None:
    """The double itself: heartbeats answered, unknown keys refused at the handshake, V1 replies."""
    import json

    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    base = server.url.replace("http://", "ws://") + "/realtime/v1/websocket"

    async def main() -> tuple[dict[str, Any], int]:
        async with connect(f"{base}?apikey={PUBLISHABLE_KEY}&vsn=1.0.0") as ws:
            await ws.send(json.dumps({"event": "heartbeat", "payload": {}, "topic": "phoenix", "ref": "7"}))
            reply = json.loads(await ws.recv())
        try:
            async with connect(f"{base}?apikey=sb_publishable_unknown&vsn=1.0.0"):
                pass
        except InvalidStatus as exc:
            return reply, exc.response.status_code
        return reply, 101

    reply, refused = asyncio.run(main())
    assert reply == {
        "topic": "phoenix",
        "event": "phx_reply",
        "payload": {"status": "ok", "response": {}},
        "ref": "7",
    }
    assert refused == 401


def test_the_blocking_watch_runs_the_same_watch(
    server: RealtimeServer, db_url: str, pg: psycopg.Connection[Any]
) -> None:
    a, b = make_user(pg), make_user(pg)
    jobs = UserJobs(BASE_URL, PUBLISHABLE_KEY, make_jwt("authenticated", sub=a), realtime_url=server.url)

    def later() -> None:
        deadline = time.monotonic() + 10
        while (user_topic(a), True) not in server.joins and time.monotonic() < deadline:
            time.sleep(0.01)
        with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as conn:
            _lifecycle(conn, a, b)

    thread = threading.Thread(target=later)
    thread.start()
    watching = jobs.watch()
    statuses = [next(watching).status for _ in range(4)]
    watching.close()  # type: ignore[attr-defined]  # leaves the channel and stops its loop
    thread.join(10)
    jobs.close()
    assert statuses == [JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.RUNNING, JobStatus.SUCCEEDED]
