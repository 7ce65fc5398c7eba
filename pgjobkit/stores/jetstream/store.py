"""``AsyncJetStreamStore``: the store seam (``AsyncJobStore``) on a NATS JetStream cluster, and ``migrate``,
which creates or updates its stream."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import nats
from nats.aio.client import Client

from pgjobkit.core.models import Job
from pgjobkit.errors import ConfigurationError, InvalidArgument, TransientError
from pgjobkit.ops import Call, Dialect
from pgjobkit.redact import redact
from pgjobkit.stores.base_async import AsyncJobStore, AsyncSubscription
from pgjobkit.stores.jetstream.functions import Clock, Functions, not_available, utcnow
from pgjobkit.stores.jetstream.layout import Layout
from pgjobkit.stores.jetstream.wire import Wire, api_error

STREAM_EXISTS = 10058  # stream name already in use with a different configuration
NO_SUITABLE_PEERS = 10005  # "no suitable peers for placement": fewer servers than replicas


def parse_urls(url: str | Sequence[str], origin: str = "a NATS URL") -> list[str]:
    """JOBKIT_NATS_URL's comma-separated server URLs (or a list of them); ``origin``: where it came from."""
    urls = [u.strip() for u in (url.split(",") if isinstance(url, str) else url) if u.strip()]
    if not urls or any(not u.startswith(("nats://", "tls://", "ws://", "wss://")) for u in urls):
        raise ConfigurationError(
            f"jobkit: {origin} is one or more server URLs, comma-separated, each nats://host:port "
            f"(got {redact(str(url))!r}); `pgjobkit nats up` starts a local cluster and prints one"
        )
    return urls


class AsyncJetStreamStore(AsyncJobStore):
    """Jobs on JetStream (see ``pgjobkit.stores.jetstream`` for what works and what is refused).
    ``prefix``/``stream``: the queue's subjects and stream (several queues can share a cluster);
    ``clock``: the time the transitions are given (the client's: keep workers' clocks in step, as NTP does);
    ``claim_wait``, ``ack_wait``: see ``Functions``; ``patience``: how long a call retries a passing fault
    (a leader election) before it raises TransientError; ``origin``: the setting the URL came from, for
    errors (``JOBKIT_NATS_URL (from .env)``)."""

    dialect = Dialect(job=Job.from_row, time=lambda v: v)

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        prefix: str = "jobkit",
        stream: str = "JOBKIT",
        clock: Clock = utcnow,
        claim_wait: float = 0.1,
        ack_wait: float = 30.0,
        patience: float = 30.0,
        timeout: float = 5.0,
        origin: str = "JOBKIT_NATS_URL",
    ) -> None:
        self.urls = parse_urls(url, origin)
        self._origin = origin
        self.layout = Layout(prefix=prefix, stream=stream)
        self._clock = clock
        self._claim_wait = claim_wait
        self._ack_wait = ack_wait
        self._patience = patience
        self._timeout = timeout
        self._nc: Client | None = None
        self._functions: Functions | None = None
        self._opening = asyncio.Lock()  # bound to the loop of its first use (Python >= 3.10)

    async def open(self, wait: bool = True) -> None:
        """Connect now rather than at the first call (which connects, as the other stores' pools do)."""
        if self._functions is not None:
            return
        async with self._opening:
            if self._functions is None:
                await self._connect()

    async def _connect(self) -> None:
        try:
            # reconnects never give up once connected; the first connect is bounded (nats-py would retry
            # it as often as max_reconnect_attempts says: forever)
            self._nc = await asyncio.wait_for(
                nats.connect(
                    servers=self.urls,
                    connect_timeout=self._timeout,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.25,
                    allow_reconnect=True,
                    error_cb=_quiet,
                ),
                timeout=self._timeout,
            )
        except TimeoutError:
            raise ConfigurationError(
                f"jobkit: no NATS server answered at {','.join(self.urls)} within {self._timeout:g}s "
                f"({self._origin}): is the cluster up? `pgjobkit nats up` starts one here"
            ) from None
        except Exception as exc:  # nats-py raises its own and OSError kinds
            raise ConfigurationError(
                f"jobkit: no NATS server answers at {','.join(self.urls)} ({self._origin}: {exc!r})"
            ) from None
        wire = Wire(self._nc, self.layout, patience=self._patience, timeout=self._timeout)
        self._functions = Functions(wire, self._clock, claim_wait=self._claim_wait, ack_wait=self._ack_wait)

    async def close(self) -> None:
        if self._functions is not None:
            await self._functions.close()
            self._functions = None
        if self._nc is not None:
            await self._nc.close()
            self._nc = None
        self._opening = asyncio.Lock()  # a store opened again may be on another loop (JetStreamStore's)

    @property
    def functions(self) -> Functions:
        if self._functions is None:
            raise ConfigurationError(
                "jobkit: the JetStream store is not open: `await store.open()` or `async with`"
            )
        return self._functions

    async def _execute(self, call: Call, conn: Any = None) -> Any:
        if conn is not None:
            raise InvalidArgument("jobkit: the JetStream store takes no connection of the caller's")
        if self._functions is None:
            await self.open()
        function = self.functions.table.get(call.fn)
        if function is None:
            raise not_available(call.fn)
        return await function(**{name: value for name, (_, value) in call.args.items()})

    async def listen(self, wake: Callable[[], None]) -> AsyncSubscription:
        """``wake`` on each dispatch the stream republishes (headers only, a core publish: a wake-up, not a
        feed; polling is the fallback)."""
        await self.open()
        sub = await self.functions.wire.nc.subscribe(self.layout.wakeups, cb=_waker(wake))
        return _Subscription(sub)

    async def drop(self) -> None:
        """Delete this store's stream and every job in it (the demo's own stream, at its end)."""
        await self.open()
        await self.functions.wire.js.delete_stream(self.layout.stream)

    async def migrate(self, replicas: int | None = None) -> int:
        """Create the stream, or update it to this version's configuration: idempotent. ``replicas``
        (JOBKIT_NATS_REPLICAS): default 3 on a cluster, 1 on a single server; a cluster with fewer servers
        than the replicas is told to set JOBKIT_NATS_REPLICAS. The replicas."""
        await self.open()
        return await migrate(self.functions.wire, replicas)


async def migrate(wire: Wire, replicas: int | None = None) -> int:
    """The stream of ``wire``'s layout, created or updated (see ``Layout.stream_config``)."""
    defaulted = replicas is None
    if replicas is None:
        # The server's INFO names its cluster only when it is clustered. Its list of peers
        # (connect_urls) is gossiped and can lag the cluster's forming, so it is not counted: a
        # cluster of fewer than 3 servers is told below to set JOBKIT_NATS_REPLICAS.
        replicas = 3 if wire.nc._server_info.get("cluster") else 1
    if not 1 <= replicas <= 5:
        raise ConfigurationError(f"jobkit: JOBKIT_NATS_REPLICAS must be 1 to 5 (got {replicas})")
    body = json.dumps(wire.layout.stream_config(replicas)).encode()

    async def attempt(_: bool) -> int:
        for verb in ("CREATE", "UPDATE"):
            reply = await wire.nc.request(
                f"$JS.API.STREAM.{verb}.{wire.layout.stream}", body, timeout=wire.timeout
            )
            answer: dict[str, Any] = json.loads(reply.data)
            if "error" not in answer:
                return replicas
            error = api_error(answer["error"])
            if verb == "CREATE" and error.err_code == STREAM_EXISTS:
                continue
            if error.code == 503:
                raise error  # the meta leader is being elected: retried
            if error.err_code == NO_SUITABLE_PEERS:
                raise _TooFewPeers  # peers may still be joining: retried, then said below
            raise ConfigurationError(
                f"jobkit: JetStream refused the stream {wire.layout.stream}: {error.description}"
            )
        raise AssertionError("unreachable")  # pragma: no cover

    try:
        return await wire.retrying(f"the stream {wire.layout.stream}", attempt)
    except TransientError as exc:
        if not isinstance(exc.__cause__, _TooFewPeers):
            raise
        where = "by default on a cluster" if defaulted else "from JOBKIT_NATS_REPLICAS"
        raise ConfigurationError(
            f"jobkit: JetStream has no {replicas} servers to place the stream {wire.layout.stream}'s "
            f"replicas on ({replicas} {where}): set JOBKIT_NATS_REPLICAS to at most the cluster's "
            "servers (3 or 5 for a cluster that survives a lost server, 1 for none)"
        ) from None


class _TooFewPeers(asyncio.TimeoutError):
    """The cluster has fewer servers than the replicas asked for: a passing fault while peers join
    (``wire.is_transient`` retries timeouts), a setting to change once the retries end."""


log = logging.getLogger("pgjobkit.stores.jetstream")


async def _quiet(exc: Exception) -> None:
    """nats-py's error callback: a lost server is logged (the client reconnects), not printed."""
    log.info("jobkit: NATS connection: %r", exc)


def _waker(wake: Callable[[], None]) -> Callable[[Any], Any]:
    async def on_message(_: Any) -> None:
        wake()

    return on_message


class _Subscription:
    def __init__(self, sub: Any) -> None:
        self._sub = sub

    async def close(self) -> None:
        await self._sub.unsubscribe()
