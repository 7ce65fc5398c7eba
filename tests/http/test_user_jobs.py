"""A signed-in user starts, watches and cancels their own jobs through supabase-py and the test router,
into real SQL; a worker on the Supabase path stops a job its user cancelled within one heartbeat."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pgjobkit import AsyncUserJobs, JobNotFound, JobStatus, LimitReached, SupabaseStore, UserJobs, Worker
from pgjobkit.errors import InvalidArgument, PermissionDenied
from tests.doubles.router import BASE_URL, SupabaseRouter, make_jwt
from tests.sql.helpers import make_user


@pytest.fixture
def user(pg: psycopg.Connection[Any], router: SupabaseRouter) -> uuid.UUID:
    pg.execute("insert into public.jobkit_user_types (type, max_live_per_user) values ('transcribe', 3)")
    return uuid.UUID(make_user(pg))


def as_user(user: uuid.UUID, anon_key: str) -> UserJobs:
    return UserJobs(BASE_URL, anon_key, make_jwt("authenticated", sub=str(user)))


def test_start_read_and_cancel_my_job(user: uuid.UUID, anon_key: str, pg: psycopg.Connection[Any]) -> None:
    me = as_user(user, anon_key)
    started = me.enqueue("transcribe", {"upload": "a.mp3"}, idempotency_key="a.mp3")
    assert started.inserted and started.job.user_id == user and started.job.status == JobStatus.QUEUED
    assert not me.enqueue("transcribe", {"upload": "a.mp3"}, idempotency_key="a.mp3").inserted
    assert [j.id for j in me.list()] == [started.job.id]
    with pytest.raises(InvalidArgument, match="cannot be started by users"):
        me.enqueue("embed")
    other = as_user(uuid.UUID(make_user(pg)), anon_key)
    with pytest.raises(JobNotFound):
        other.cancel(started.job.id)
    assert me.cancel(started.job.id).status == JobStatus.CANCELLED
    assert me.get(started.job.id).status == JobStatus.CANCELLED  # type: ignore[union-attr]
    with pytest.raises(PermissionDenied):
        UserJobs(BASE_URL, anon_key, anon_key).enqueue("transcribe")  # the key alone is anon
    me.close()
    other.close()


def test_limits_say_so(user: uuid.UUID, anon_key: str) -> None:
    me = as_user(user, anon_key)
    for _ in range(3):
        me.enqueue("transcribe")
    with pytest.raises(LimitReached, match="at most 3 live jobs"):
        me.enqueue("transcribe")
    me.close()


def test_the_async_view_does_the_same(user: uuid.UUID, anon_key: str) -> None:
    async def main() -> tuple[bool, JobStatus | None]:
        me = AsyncUserJobs(BASE_URL, anon_key, make_jwt("authenticated", sub=str(user)))
        try:
            started = await me.enqueue("transcribe", {"upload": "b.mp3"})
            cancelled = await me.cancel(started.job.id)
            return started.inserted, cancelled.status
        finally:
            await me.close()

    assert asyncio.run(main()) == (True, JobStatus.CANCELLED)


def test_a_running_job_cancelled_by_its_user_stops_within_one_heartbeat(
    user: uuid.UUID, anon_key: str, service_key: str
) -> None:
    store = SupabaseStore(BASE_URL, service_key, realtime=False)
    worker = Worker(store, poll_interval=0.05, lease=timedelta(seconds=1.2))  # a beat every 0.2 s
    started, stopped = threading.Event(), threading.Event()

    @worker.handler("transcribe")
    async def transcribe(payload: dict[str, Any]) -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped.set()
            raise
        return "never"

    me = as_user(user, anon_key)
    job = me.enqueue("transcribe").job
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(worker.run(install_signals=False, until_empty=True)))
    thread.start()
    assert started.wait(10)
    cancelled_at = time.monotonic()
    me.cancel(job.id)
    assert stopped.wait(5)
    assert time.monotonic() - cancelled_at < 1.0  # a beat is 0.2 s; HTTP round trips included
    thread.join(10)
    assert not thread.is_alive() and out[0].lost == 1
    final = me.get(job.id)
    assert final is not None and (final.status, final.result) == (JobStatus.CANCELLED, None)
    me.close()
    store.close()
