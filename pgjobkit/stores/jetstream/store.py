"""``AsyncJetStreamStore``: the store seam (``AsyncJobStore``) on a NATS JetStream cluster, and ``migrate``,
which creates or updates its stream."""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import nats
from nats.aio.client import Client
from nats.js.errors import APIError

from pgjobkit.core.bounds import MAX_NATS_PARTITIONS
from pgjobkit.core.models import Job
from pgjobkit.errors import ConfigurationError, InvalidArgument, TransientError
from pgjobkit.ops import Call, Dialect
from pgjobkit.redact import redact
from pgjobkit.stores.base_async import AsyncJobStore, AsyncSubscription
from pgjobkit.stores.jetstream.functions import Clock, Functions, not_available, utcnow
from pgjobkit.stores.jetstream.layout import Layout
from pgjobkit.stores.jetstream.partitions import Partitions, id_drawer
from pgjobkit.stores.jetstream.wire import Wire

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
    ``claim_wait``, ``ack_wait``: see ``Functions``; ``partitions`` (JOBKIT_NATS_PARTITIONS): the queue's
    streams, fixed when it is created (see ``partitions``); ``patience``: how long a call retries a passing fault
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
        partitions: int = 1,
        origin: str = "JOBKIT_NATS_URL",
    ) -> None:
        self.urls = parse_urls(url, origin)
        self._origin = origin
        if not 1 <= partitions <= MAX_NATS_PARTITIONS:
            raise ConfigurationError(
                f"jobkit: JOBKIT_NATS_PARTITIONS must be 1 to {MAX_NATS_PARTITIONS} (got {partitions})"
            )
        self.layout = Layout(prefix=prefix, stream=stream, partitions=partitions)
        self._clock = clock
        self._claim_wait = claim_wait
        self._ack_wait = ack_wait
        self._patience = patience
        self._timeout = timeout
        self._nc: Client | None = None
        self._functions: Functions | None = None  # partition 0's
        self._parts: list[Functions] = []
        self._table: dict[str, Callable[..., Awaitable[Any]]] = {}
        self._checked = False  # the streams' partitions, once, before the first call
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
        count = self.layout.partitions
        self._parts = [
            Functions(
                Wire(self._nc, self.layout.partition(k), patience=self._patience, timeout=self._timeout),
                self._clock,
                claim_wait=self._claim_wait,
                ack_wait=self._ack_wait,
                new_id=id_drawer(k, count) if count > 1 else uuid.uuid4,
            )
            for k in range(count)
        ]
        self._table = self._parts[0].table if count == 1 else Partitions(self._parts).table
        self._functions = self._parts[0]

    async def close(self) -> None:
        for part in self._parts:
            await part.close()
        self._parts, self._table, self._functions, self._checked = [], {}, None, False
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
        if not self._checked:
            await self._check_partitions()
        function = self._table.get(call.fn)
        if function is None:
            raise not_available(call.fn)
        return await function(**{name: value for name, (_, value) in call.args.items()})

    async def _check_partitions(self) -> None:
        """A queue's partitions are fixed when it is created (partition 0's metadata names them): a store
        opened with another number would look for jobs on the wrong streams, so every call stops, naming
        the setting and the number. No stream yet: the call says so itself (migrate first)."""
        try:
            metadata = await self.functions.wire.metadata()
        except ConfigurationError:
            return
        made_for = int(metadata.get("jobkit_partitions", "1"))  # streams made before partitions: 1
        if made_for != self.layout.partitions:
            raise ConfigurationError(
                f"jobkit: the stream {self.layout.stream} holds a queue of {made_for} partition(s), and this "
                f"store was opened with {self.layout.partitions} (JOBKIT_NATS_PARTITIONS): set it to "
                f"{made_for}; a queue's partitions are fixed when it is created"
            )
        self._checked = True

    async def wires(self) -> list[Wire]:
        """Each partition's connection to its stream, in order (the projector reads the records through
        them)."""
        await self.open()
        return [part.wire for part in self._parts]

    async def listen(self, wake: Callable[[], None]) -> AsyncSubscription:
        """``wake`` on each dispatch the stream republishes (headers only, a core publish: a wake-up, not a
        feed; polling is the fallback)."""
        await self.open()
        nc = self.functions.wire.nc
        return _Subscription([await nc.subscribe(p.layout.wakeups, cb=_waker(wake)) for p in self._parts])

    async def drop(self) -> None:
        """Delete this store's streams and every job in them (the demo's own stream, at its end)."""
        await self.open()
        for part in self._parts:
            await part.wire.js.delete_stream(part.layout.stream)

    async def migrate(self, replicas: int | None = None) -> int:
        """Create the stream, or update it to this version's configuration: idempotent. ``replicas``
        (JOBKIT_NATS_REPLICAS): default 3 on a cluster, 1 on a single server; a cluster with fewer servers
        than the replicas is told to set JOBKIT_NATS_REPLICAS. Each partition's stream, in turn. The
        replicas."""
        await self.open()
        made = [await migrate(part.wire, replicas) for part in self._parts]
        return made[0]


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
            try:
                await wire.api(f"$JS.API.STREAM.{verb}.{wire.layout.stream}", body)
            except APIError as error:
                if verb == "CREATE" and error.err_code == STREAM_EXISTS:
                    continue
                if error.code == 503:
                    raise  # the meta leader is being elected: retried
                if error.err_code == NO_SUITABLE_PEERS:
                    raise _TooFewPeers from None  # peers may still be joining: retried, then said below
                raise ConfigurationError(
                    f"jobkit: JetStream refused the stream {wire.layout.stream}: {error.description}"
                ) from None
            return replicas
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
    def __init__(self, subs: list[Any]) -> None:
        self._subs = subs

    async def close(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
