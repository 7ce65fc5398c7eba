"""What runs beside a worker's loop, each started and stopped in one place: a context manager per service,
entered on one exit stack by ``Worker.arun`` (and the heartbeat by ``Worker.atick`` too), so that a
service that fails to start stops those started before it, and a run's end stops them all, the last
started first. A new background task of a run belongs here, not in ``arun``."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pgjobkit.errors import ConfigurationError
from pgjobkit.exporters import metrics_server
from pgjobkit.stores.base_async import AsyncJobStore
from pgjobkit.worker.executor import JobExecutor
from pgjobkit.worker.leases import Leases
from pgjobkit.worker.loop import Stopping
from pgjobkit.worker.presence import Presence
from pgjobkit.worker.registry import Handler
from pgjobkit.worker.scheduler import Scheduler
from pgjobkit.worker.telemetry import Telemetry

if TYPE_CHECKING:
    from pgjobkit.worker import Worker
    from pgjobkit.worker.parts import Parts

log = logging.getLogger("pgjobkit.worker")


def for_run(
    worker: Worker, parts: Parts, telemetry: Telemetry, stopping: Stopping, *, install_signals: bool
) -> list[AbstractAsyncContextManager[None]]:
    """What runs beside the loop of a run of ``worker`` (on ``parts``), in the order it starts; it stops in
    the reverse order. A request to ``stopping`` wakes the loop while it runs; the signals (when
    ``install_signals``) request it; ``worker.metrics_port`` says where metrics are served meanwhile."""
    o, store = worker.options, parts.store

    def serving(port: int | None) -> None:
        worker.metrics_port = port

    return [
        stopping.reaching(parts.executor.wake),
        signals(stopping, install=install_signals),
        metrics(store, parts.executor, telemetry, host=o.metrics_host, port=o.metrics_port, serving=serving),
        subscription(store, parts.executor.wake),
        presence(
            store,
            worker.name,
            types=worker.types,
            concurrency=o.concurrency,
            telemetry=telemetry,
            interval=o.presence_every,
        ),
        scheduler(store, enabled=o.schedules),
        parts.heartbeat(),
    ]


async def start(services: Sequence[AbstractAsyncContextManager[None]]) -> AsyncExitStack:
    """``services`` started in order, on a stack that stops them in the reverse order when it is exited;
    should one fail to start, those started before it are stopped and its error raised."""
    async with AsyncExitStack() as starting:
        for service in services:
            await starting.enter_async_context(service)
        return starting.pop_all()


@asynccontextmanager
async def on_stop_hooks(hooks: Sequence[Callable[[], Awaitable[None] | None]]) -> AsyncIterator[None]:
    """``hooks`` (``Worker.on_stop``) run on the way out, in order, each on the loop; one that fails is
    logged and the next runs."""
    try:
        yield
    finally:
        for fn in hooks:
            try:
                result = fn()
                if result is not None:
                    await result
            except Exception:
                log.exception("on_stop hook %s failed", getattr(fn, "__name__", fn))


@asynccontextmanager
async def heartbeat(
    store: AsyncJobStore,
    executor: JobExecutor,
    lease_of: Callable[[Handler], timedelta],
    leases: Sequence[timedelta],
    *,
    extend: bool,
) -> AsyncIterator[None]:
    """The leases of ``executor``'s running jobs kept, and their progress written (``Leases.run``)."""
    task = Leases(store, executor, lease_of).run(leases, extend=extend)
    try:
        yield
    finally:
        task.cancel()


@asynccontextmanager
async def subscription(store: AsyncJobStore, wake: asyncio.Event) -> AsyncIterator[None]:
    """``wake`` set when jobs are enqueued (LISTEN, or the store's own way; polling is the fallback)."""
    listening = await store.listen(wake.set)
    try:
        yield
    finally:
        await listening.close()


@asynccontextmanager
async def presence(
    store: AsyncJobStore,
    name: str,
    *,
    types: Sequence[str],
    concurrency: int,
    telemetry: Telemetry,
    interval: float,
) -> AsyncIterator[None]:
    """The worker's reports in jobkit_workers (``Presence``), when it reports (its telemetry tallies
    activity); its last report, and its row deleted, on the way out."""
    if telemetry.activity is None:
        yield
        return
    reports = Presence(
        store,
        name,
        types=types,
        concurrency=concurrency,
        telemetry=telemetry,
        activity=telemetry.activity,
        interval=interval,
    )
    async with _until_stopped(reports.run, "jobkit-presence"):
        yield


@asynccontextmanager
async def scheduler(store: AsyncJobStore, *, enabled: bool) -> AsyncIterator[None]:
    """The schedules' jobs enqueued when due (``Scheduler``), when ``enabled``."""
    if not enabled:
        yield
        return
    async with _until_stopped(Scheduler(store).arun, "jobkit-scheduler"):
        yield


@asynccontextmanager
async def _until_stopped(
    run: Callable[[asyncio.Event], Coroutine[Any, Any, None]], name: str
) -> AsyncIterator[None]:
    """``run(stop)`` as the task ``name`` while entered; on the way out, ``stop`` set and the task awaited."""
    stop = asyncio.Event()
    task = asyncio.create_task(run(stop), name=name)
    try:
        yield
    finally:
        stop.set()
        await task


@asynccontextmanager
async def metrics(
    store: AsyncJobStore,
    executor: JobExecutor,
    telemetry: Telemetry,
    *,
    host: str,
    port: int | None,
    serving: Callable[[int | None], None],
) -> AsyncIterator[None]:
    """``telemetry``'s Prometheus metrics served on ``host``:``port``, if asked: running jobs counted and
    the queue's depth read (``Telemetry.read_depth``) at each scrape. ``serving`` hears the port it is
    served on, then None once it is closed."""
    prometheus = telemetry.prometheus
    if prometheus is None or port is None:
        yield
        return

    async def before_scrape() -> None:
        prometheus.set_running(r.job.type for r in executor.running_jobs())
        prometheus.set_depth(await telemetry.read_depth(store))

    try:
        server = await metrics_server.serve(
            prometheus.registry, host=host, port=port, before_scrape=before_scrape
        )
    except OSError as exc:
        raise ConfigurationError(
            f"jobkit: cannot serve metrics on {host}:{port} ({exc.strerror or exc}); "
            "choose another --metrics-port"
        ) from None
    serving(server.port)
    try:
        yield
    finally:
        await server.close()
        serving(None)


@asynccontextmanager
async def signals(stopping: Stopping, *, install: bool) -> AsyncIterator[None]:
    """SIGINT and SIGTERM handled, when ``install`` and the loop runs in the main thread: the first requests
    a stop (in-flight jobs finish); one once a stop was requested, that they be given back."""
    if not install or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(sig: signal.Signals) -> None:
        if stopping.requested.is_set():
            log.warning("second %s: giving in-flight jobs back", sig.name)
            stopping.request(abandon=True)
        else:
            log.warning("%s: finishing in-flight jobs (send again to give them back)", sig.name)
            stopping.request()

    loop = asyncio.get_running_loop()
    installed = []
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
