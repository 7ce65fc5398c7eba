"""Live updates over Supabase Realtime (Broadcast from the database, private channels), with the ``realtime``
client supabase-py ships (async only: its sync client has no channels).

- ``watch_jobs``: a signed-in user's own jobs as they change, from the topic ``jobkit:user:<id>``, which RLS
  opens to that user alone (see pgjobkit/sql/schema/80_realtime.sql). ``AsyncUserJobs.watch()`` uses it;
  ``UserJobs.watch()`` runs the same on a loop of its own (``watch_jobs_blocking``).
- ``WorkerWakeups``: wakes a worker on the Supabase path when runnable jobs are enqueued (topic
  ``jobkit:workers``, service role only). It connects in the background and never delays or fails the
  worker: polling stays the fallback, and the client reconnects and rejoins by itself after a drop.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import datetime
from uuid import UUID

from pydantic import BaseModel, ConfigDict
from realtime import AsyncRealtimeChannel, AsyncRealtimeClient, RealtimeSubscribeStates
from realtime.types import BroadcastPayload, RealtimeChannelOptions

from pgjobkit.core.models import JobStatus
from pgjobkit.errors import InvalidArgument, PermissionDenied, TransientError

log = logging.getLogger("pgjobkit.stores.supabase.realtime")
WORKERS_TOPIC = "jobkit:workers"
JOIN_TIMEOUT = 10.0


class JobUpdate(BaseModel):
    """One change of a user's job, as broadcast: enough to redraw a status line or a progress bar."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    id: UUID
    type: str
    status: JobStatus
    progress: float | None = None
    progress_message: str | None = None
    attempts: int
    error: str | None = None
    updated_at: datetime
    pipeline_id: UUID | None = None  # the pipeline the job is one of (None: none)


def user_topic(user_id: UUID | str) -> str:
    return f"jobkit:user:{user_id}"


def token_subject(token: str) -> str:
    """The ``sub`` of a user's access token (not verified here: Realtime verifies it at join)."""
    try:
        body = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        return str(claims["sub"])
    except (IndexError, ValueError, KeyError, TypeError) as exc:
        raise InvalidArgument("jobkit: watch() needs the user's access token (a JWT with a sub)") from exc


def realtime_url(url: str) -> str:
    return url.rstrip("/") + "/realtime/v1"


async def _join(
    client: AsyncRealtimeClient, topic: str, event: str, on: Callable[[BroadcastPayload], None]
) -> AsyncRealtimeChannel:
    """Join a private channel, calling ``on`` with each broadcast ``event`` on it; raise at once when
    Realtime refuses it. ``on`` is in place before the join is asked for: a broadcast sent as soon as the
    join is answered reaches the client before this coroutine resumes, and a handler added then would
    miss it (a user's first update was lost so, now and then, under load)."""
    options: RealtimeChannelOptions = {
        "config": {"private": True, "broadcast": {"ack": False, "self": False}, "presence": None}
    }
    channel = client.channel(topic, options)
    channel.on_broadcast(event, on)
    joined: asyncio.Future[tuple[RealtimeSubscribeStates, Exception | None]] = (
        asyncio.get_running_loop().create_future()
    )

    def on_state(state: RealtimeSubscribeStates, error: Exception | None) -> None:
        if not joined.done():
            joined.set_result((state, error))

    await channel.subscribe(on_state)
    state, error = await asyncio.wait_for(joined, JOIN_TIMEOUT)
    if state != RealtimeSubscribeStates.SUBSCRIBED:
        raise PermissionDenied(f"jobkit: Realtime refused the channel {topic}: {error or state.value}")
    return channel


async def watch_jobs(url: str, key: str, token: str) -> AsyncIterator[JobUpdate]:
    """The user's jobs as they change, until the consumer stops iterating."""
    topic = user_topic(token_subject(token))
    client = AsyncRealtimeClient(realtime_url(url), key)
    updates: asyncio.Queue[JobUpdate] = asyncio.Queue()
    try:
        await client.set_auth(token)
        try:
            await _join(
                client,
                topic,
                "job",
                lambda message: updates.put_nowait(JobUpdate.model_validate(message["payload"])),
            )
        except OSError as exc:
            raise TransientError(f"jobkit: Realtime unreachable: {type(exc).__name__}") from exc
        while True:
            yield await updates.get()
    finally:
        await client.close()


def watch_jobs_blocking(url: str, key: str, token: str) -> Iterator[JobUpdate]:
    """``watch_jobs`` for blocking code: the same watch, under ``asyncio.run`` in a daemon thread (which
    also ends whatever tasks the Realtime client leaves), until the caller stops iterating."""
    updates: queue.Queue[JobUpdate | BaseException | None] = queue.Queue()
    started: queue.Queue[tuple[asyncio.AbstractEventLoop, asyncio.Task[None]]] = queue.Queue()

    async def pump() -> None:
        try:
            async for update in watch_jobs(url, key, token):
                updates.put(update)
        except Exception as exc:  # handed to the caller's thread
            updates.put(exc)

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(pump())
        started.put((asyncio.get_running_loop(), task))
        with contextlib.suppress(asyncio.CancelledError):
            await task
        updates.put(None)

    thread = threading.Thread(target=lambda: asyncio.run(main()), name="jobkit-watch", daemon=True)
    thread.start()
    loop, task = started.get()
    try:
        while (item := updates.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        loop.call_soon_threadsafe(task.cancel)
        thread.join(10)


class WorkerWakeups:
    """Calls ``wake`` whenever the database broadcasts that runnable jobs were enqueued."""

    def __init__(self, url: str, key: str, wake: Callable[[], None]) -> None:
        self._client = AsyncRealtimeClient(realtime_url(url), key)
        self._wake = wake
        self._task = asyncio.get_running_loop().create_task(self._run(), name="jobkit-realtime")

    async def _run(self) -> None:
        try:
            await _join(self._client, WORKERS_TOPIC, "enqueued", self._on_enqueued)
            log.info("jobkit: Realtime wake-ups on (%s)", WORKERS_TOPIC)
        except Exception as exc:  # anything: the worker polls, as it would without Realtime
            log.warning("jobkit: no Realtime wake-ups (%s); polling only", exc or type(exc).__name__)

    def _on_enqueued(self, message: BroadcastPayload) -> None:
        self._wake()

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._client.close()
