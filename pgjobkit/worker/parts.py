"""What a run or a tick of a Worker is made of, built from its options on the loop it runs on: the executor
(``pgjobkit.worker.executor``), the exchange (``pgjobkit.worker.exchange``) making its round trips, and the
heartbeat of their leases (``pgjobkit.worker.leases``); and the threads its sync handlers run in, which
outlive a run."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import Executor as ThreadPool
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import timedelta

from pgjobkit.errors import InvalidArgument
from pgjobkit.exporters import otel
from pgjobkit.stores.base_async import AsyncJobStore
from pgjobkit.worker import services
from pgjobkit.worker.calls_async import AsyncWorkerCalls
from pgjobkit.worker.exchange import Exchange
from pgjobkit.worker.executor import Backoff, JobExecutor
from pgjobkit.worker.options import WorkerOptions
from pgjobkit.worker.registry import Handler, Registry
from pgjobkit.worker.results import AttemptReport


class HandlerThreads:
    """The thread pool sync handlers run in: made on first use, the same for every tick and run until
    ``close``; let go, not waited for, after in-flight jobs were given back (``let_go``)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None

    def pool(self, size: int) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(size, thread_name_prefix="jobkit-handler")
        return self._pool

    def let_go(self) -> None:
        """Their threads cannot be stopped: the pool is left to them (the next run makes another)."""
        self.close(wait=False)

    def close(self, *, wait: bool) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=wait, cancel_futures=True)
            self._pool = None


def lease_groups(
    handlers: Registry, types: Sequence[str], lease_of: Callable[[Handler], timedelta]
) -> dict[timedelta, list[str]]:
    """The claimed ``types``, grouped by lease: one claim call per group."""
    if not handlers.types:
        raise InvalidArgument("jobkit: register a handler before claiming jobs")
    groups: dict[timedelta, list[str]] = {}
    for t in types:
        groups.setdefault(lease_of(handlers[t]), []).append(t)
    return groups


@dataclass(frozen=True)
class Parts:
    """A run's (or a tick's) executor and exchange, on ``store``; ``leases`` are its handlers' leases,
    ``lease_of`` gives each job's (its handler's, or the worker's)."""

    store: AsyncJobStore
    executor: JobExecutor
    exchange: Exchange
    leases: Sequence[timedelta]
    lease_of: Callable[[Handler], timedelta]
    extend_leases: bool

    @classmethod
    def build(
        cls,
        store: AsyncJobStore,
        handlers: Registry,
        options: WorkerOptions,
        *,
        worker: str,
        types: Sequence[str],
        threads: ThreadPool,
        record: Callable[[AttemptReport], None],
    ) -> Parts:
        """The parts of a run or tick of the worker named ``worker`` starting now, on this loop: claiming
        ``types`` (one claim call per lease), running sync handlers in ``threads``; each job's end goes to
        ``record``."""
        o = options

        def lease_of(h: Handler) -> timedelta:
            return h.lease or o.lease

        groups = lease_groups(handlers, types, lease_of)
        tracing = otel.configured() if o.tracing is None else o.tracing and otel.configured()
        executor = JobExecutor(
            handlers=handlers,
            concurrency=o.concurrency,
            batch_size=o.batch_size,
            backoff=Backoff(o.backoff_base, o.backoff_cap, o.jitter, o.random),
            threads=threads,
            wake=asyncio.Event(),
            dependencies=AsyncWorkerCalls(store).dependencies,
            tracing=tracing,
        )
        exchange = Exchange(
            store,
            executor,
            worker=worker,
            groups=groups,
            concurrency=o.concurrency,
            batch_size=o.batch_size,
            record=record,
            delete=o.delete_succeeded,
            tracing=tracing,
        )
        leases = [lease_of(h) for h in handlers.values()] or [o.lease]
        return cls(store, executor, exchange, leases, lease_of, o.extend_leases)

    def heartbeat(self) -> AbstractAsyncContextManager[None]:
        """The running jobs' leases kept and their progress written, while it is entered."""
        return services.heartbeat(
            self.store, self.executor, self.lease_of, self.leases, extend=self.extend_leases
        )

    def running_types(self) -> list[str]:
        """The types of the jobs running now, one per job (for the metrics)."""
        return [r.job.type for r in self.executor.running_jobs()]
