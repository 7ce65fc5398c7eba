"""The JetStream side of the store: a record's read and its compare-and-set write, the atomic batch, the
dispatch or schedule that follows a won write, and the retries of a fault that passes (a leader election
answers ``503 no responders`` or times out for 4 to 9 seconds: ``reference/jetstream-2.15.md``).

A write whose answer was lost is ambiguous: retried, it may meet its own earlier success as a
``wrong last sequence``. So after a fault a refused compare-and-set reads the subject back, and a record
holding exactly the bytes it sent (its ``updated_at`` to the microsecond, a claim's fresh lease token) is
its own write, won.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.errors import APIError, NotFoundError

from pgjobkit.core.models import Job, JobStatus
from pgjobkit.errors import ConfigurationError, StoreError, TransientError
from pgjobkit.stores.jetstream.layout import (
    EXPECT_SEQ,
    EXPECT_SUBJECT,
    LOST_RACE,
    Layout,
    at,
    purge_schedule_headers,
    record_data,
    wake_at,
)

log = logging.getLogger("pgjobkit.stores.jetstream")
T = TypeVar("T")
TRANSIENT = (
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    nats.errors.NoRespondersError,
    nats.errors.TimeoutError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.FlushTimeoutError,
    asyncio.TimeoutError,
)


def api_error(error: dict[str, Any]) -> APIError:
    """JetStream's JSON error as nats-py's APIError (its ``from_error`` raises rather than returns)."""
    return APIError(
        code=error.get("code"), err_code=error.get("err_code"), description=error.get("description")
    )


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, TRANSIENT):
        return True
    # 503: "JetStream system temporarily unavailable", or a stream without a leader yet
    return isinstance(exc, APIError) and exc.code == 503


@dataclass
class Message:
    """One message to publish: subject, body, headers."""

    subject: str
    data: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


class Wire:
    """Reads and writes of one store on one connection. ``patience``: seconds a call keeps retrying a
    passing fault before it raises TransientError."""

    def __init__(self, nc: Client, layout: Layout, *, patience: float = 30.0, timeout: float = 5.0) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=timeout)
        self.layout = layout
        self.patience = patience
        self.timeout = timeout
        self.get_subject = f"$JS.API.STREAM.MSG.GET.{layout.stream}"

    async def retrying(self, what: str, attempt: Callable[[bool], Awaitable[T]]) -> T:
        """``attempt(after_fault)`` until it returns, retrying passing faults for ``patience`` seconds."""
        deadline = time.monotonic() + self.patience
        pause, after_fault = 0.05, False
        while True:
            try:
                return await attempt(after_fault)
            except Exception as exc:
                if not is_transient(exc):
                    raise
                if time.monotonic() + pause > deadline:
                    raise TransientError(f"jobkit: JetStream did not answer {what} ({exc!r})") from exc
                log.warning("jobkit: %s: %r; retrying in %.2fs", what, exc, pause)
                after_fault = True
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)

    async def api(self, subject: str, body: bytes) -> dict[str, Any]:
        """One JetStream API request (``$JS.API.…``) and its JSON answer; an error it answers, raised as an
        APIError."""
        answer: dict[str, Any] = json.loads((await self.nc.request(subject, body, timeout=self.timeout)).data)
        if "error" in answer:
            raise api_error(answer["error"])
        return answer

    # --- subjects as registers ------------------------------------------------------------------------------
    async def last(self, subject: str) -> tuple[bytes | None, int]:
        """The last message's body on ``subject`` and its sequence (None, 0: none), read from the leader."""

        request = json.dumps({"last_by_subj": subject}).encode()

        async def attempt(_: bool) -> tuple[bytes | None, int]:
            # the stream API's own request, not JetStreamManager.get_last_msg: that one parses the stored
            # message's headers with the email package, a fifth of a worker's CPU per job, and none is read
            try:
                message = (await self.api(self.get_subject, request))["message"]
            except APIError as exc:
                if exc.code == 404:  # no message on the subject
                    return None, 0
                raise
            return base64.b64decode(message.get("data") or ""), int(message["seq"])

        return await self.retrying(f"a read of {subject}", attempt)

    async def read(self, job_id: uuid.UUID) -> tuple[Job | None, int]:
        """The job's record and its revision (None, 0: no such job)."""
        data, seq = await self.last(self.layout.record(job_id))
        return (Job.model_validate_json(data), seq) if data else (None, seq)

    async def put(
        self, subject: str, data: bytes, expect: int, headers: dict[str, str] | None = None
    ) -> int | None:
        """Publish ``data`` on ``subject`` if its last sequence is still ``expect`` (0: if it has none): the
        new sequence, or None when another write came first."""

        async def attempt(after_fault: bool) -> int | None:
            try:
                ack = await self.js.publish(
                    subject, data, headers={**(headers or {}), EXPECT_SEQ: str(expect)}, timeout=self.timeout
                )
            except APIError as exc:
                if exc.err_code not in LOST_RACE:
                    raise
                if after_fault:  # perhaps our own write, whose answer was lost
                    now, seq = await self.last(subject)
                    if now == data:
                        return seq
                return None
            return int(ack.seq)

        return await self.retrying(f"a write of {subject}", attempt)

    async def write(self, job: Job, expect: int, *, removed: bool = False) -> int | None:
        """The job's record, by compare-and-set on revision ``expect``; a finished job's write also purges its
        schedule. ``removed``: an empty record instead, which every read takes for no job (its key is free
        again; the projection removes its row). The new revision, or None: the record moved on (nothing
        changed)."""
        data = b"" if removed else record_data(job)
        return await self.put(
            self.layout.record(job.id), data, expect, purge_schedule_headers(self.layout, job)
        )

    async def arm(self, job: Job, revision: int, now: datetime) -> None:
        """After a won write of ``job`` at ``revision``: a dispatch now when it is runnable now, else its one
        schedule at the time it next needs a look (run_after, or its lease's end); conditional on the record
        still being at ``revision``, so a slower arming never replaces a newer one. Refused: the record moved
        on, and its writer armed it. A finished job needs nothing."""
        message = self.arming(job, now)
        if message is None:
            return
        message.headers |= {EXPECT_SUBJECT: self.layout.record(job.id), EXPECT_SEQ: str(revision)}

        async def attempt(_: bool) -> None:
            try:
                await self.js.publish(
                    message.subject, message.data, headers=message.headers, timeout=self.timeout
                )
            except APIError as exc:
                if exc.err_code not in LOST_RACE:
                    raise

        await self.retrying(f"a dispatch of job {job.id}", attempt)

    def arming(self, job: Job, now: datetime) -> Message | None:
        """The dispatch or schedule a job in its state needs (unconditional; ``arm`` adds the condition)."""
        due = wake_at(job)
        if due is None:
            return None
        dispatch = self.layout.dispatch(job.type, job.id)
        if due <= now and job.status != JobStatus.RUNNING:
            return Message(dispatch)
        return Message(
            self.layout.schedule(job.id), headers={"Nats-Schedule": at(due), "Nats-Schedule-Target": dispatch}
        )

    # --- atomic batches ----------------------------------------------------------------------------------------
    async def batch(self, messages: Sequence[Message]) -> int:
        """Publish ``messages`` as one atomic batch (all stored, or none): the last one's sequence. An
        expected-sequence header that fails refuses the whole batch (APIError 10071)."""
        batch_id = uuid.uuid4().hex
        last = len(messages)
        for n, message in enumerate(messages, 1):
            headers = message.headers | {"Nats-Batch-Id": batch_id, "Nats-Batch-Sequence": str(n)}
            if n == last:
                headers["Nats-Batch-Commit"] = "1"
            if n in (1, last):
                reply = await self.nc.request(
                    message.subject, message.data, headers=headers, timeout=self.timeout
                )
                answer = json.loads(reply.data) if reply.data else {}
                if isinstance(answer, dict) and "error" in answer:
                    raise api_error(answer["error"])
                if n == last:
                    if not isinstance(answer, dict) or "seq" not in answer:
                        raise StoreError(
                            f"jobkit: JetStream answered a batch commit with {reply.data[:200]!r}"
                        )
                    return int(answer["seq"])
            else:
                await self.nc.publish(message.subject, message.data, headers=headers)
        raise AssertionError("an empty batch")  # pragma: no cover - callers never send one

    async def ensure_consumer(self, type: str, ack_wait: float) -> str:
        """The durable consumer of ``type``'s dispatches (created if absent; the same config is a no-op)."""
        return await self.durable(
            self.layout.consumer(type),
            {
                "filter_subject": self.layout.dispatches(type),
                "ack_policy": "explicit",
                "ack_wait": int(ack_wait * 1_000_000_000),
                "max_deliver": -1,  # attempts are counted in the record; max_deliver would strand a job
                "max_ack_pending": 20_000,
                "deliver_policy": "all",
                "replay_policy": "instant",
                "description": f"jobkit dispatches of type {type[:100]!r}",
            },
        )

    async def durable(self, name: str, config: dict[str, Any]) -> str:
        """The durable consumer ``name`` of this stream with ``config`` (created if absent; the same config
        is a no-op)."""
        config = {"durable_name": name, **config}
        body = json.dumps({"stream_name": self.layout.stream, "config": config, "action": ""}).encode()

        async def attempt(_: bool) -> str:
            await self.api(f"$JS.API.CONSUMER.CREATE.{self.layout.stream}.{name}", body)
            return name

        return await self.retrying(f"the consumer {name}", attempt)

    async def pull(self, sub: Any, batch: int, wait: float, what: str) -> list[Any]:
        """Up to ``batch`` messages of the pull subscription ``sub``, waiting up to ``wait`` seconds for a
        first one (none: an empty list). A status JetStream answers a pull while its consumer has no leader
        (503) is a passing fault: pulled again."""

        async def attempt(_: bool) -> list[Any]:
            try:
                return list(await sub.fetch(batch, timeout=wait))
            except TimeoutError:
                return []

        return await self.retrying(what, attempt)

    async def scan(self, subjects: str) -> list[tuple[Job, int]]:
        """The last message of every subject matching ``subjects``, as records with their revisions: an
        ephemeral pull consumer (deliver last per subject, no acks) read until nothing is pending."""
        name = f"jobkit_scan_{uuid.uuid4().hex[:16]}"
        config = {
            "name": name,
            "filter_subject": subjects,
            "deliver_policy": "last_per_subject",
            "ack_policy": "none",
            "inactive_threshold": 30 * 1_000_000_000,
            "num_replicas": 1,
            "mem_storage": True,
        }
        body = json.dumps({"stream_name": self.layout.stream, "config": config}).encode()

        async def create(_: bool) -> int:
            answer = await self.api(f"$JS.API.CONSUMER.CREATE.{self.layout.stream}.{name}", body)
            return int(answer.get("num_pending", 0))

        pending = await self.retrying("a scan", create)
        out: list[tuple[Job, int]] = []
        try:
            if pending:
                sub = await self.js.pull_subscribe_bind(consumer=name, stream=self.layout.stream)
                try:
                    while True:
                        msgs = await self.retrying(
                            "a scan", lambda _: sub.fetch(min(1000, max(pending, 1)), timeout=self.timeout)
                        )
                        for msg in msgs:
                            if msg.data:
                                out.append(
                                    (Job.model_validate_json(msg.data), int(msg.metadata.sequence.stream))
                                )
                        if msgs[-1].metadata.num_pending == 0:
                            break
                finally:
                    await sub.unsubscribe()
        finally:
            try:
                await self.js.delete_consumer(self.layout.stream, name)
            except Exception:
                log.debug("jobkit: scan consumer %s left to expire", name)
        return out

    async def metadata(self) -> dict[str, str]:
        """The stream's metadata (``jobkit_layout``, ``jobkit_partitions``); ConfigurationError (not
        migrated) without the stream."""

        async def attempt(_: bool) -> dict[str, str]:
            try:
                info = await self.js.stream_info(self.layout.stream)
            except NotFoundError:
                raise ConfigurationError(
                    f"jobkit: no stream {self.layout.stream} on this NATS cluster: create it with "
                    "pgjobkit.stores.jetstream.migrate (pgjobkit migrate, once it knows JOBKIT_NATS_URL)",
                    code="42883",
                ) from None
            return dict(info.config.metadata or {})

        return await self.retrying("the stream's info", attempt)
