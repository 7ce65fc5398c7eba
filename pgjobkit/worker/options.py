"""A worker's options: ``Worker(store, concurrency=...)``, ``WorkerOptions.from_settings`` (the JOBKIT_*
variables) and ``pgjobkit worker``'s flags all start from the defaults in ``pgjobkit.core.bounds`` (a test
holds the three together)."""

from __future__ import annotations

import functools
import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pgjobkit.core import bounds, transitions
from pgjobkit.errors import InvalidArgument
from pgjobkit.settings import Settings


@dataclass(frozen=True)
class WorkerOptions:
    """How a worker runs.

    - ``name``: the worker's name in the jobs it claims (default: host:pid:random).
    - ``types``: claim only these of the registered types (default: every registered type).
    - ``concurrency``: jobs in flight at once.
    - ``batch_size``: jobs claimed per round trip; up to max(concurrency, batch_size) are held, two batches
      more while jobs run quick (``pgjobkit.worker.exchange``).
    - ``poll_interval``: seconds between claims when no wake-up arrives.
    - ``lease``: the lease of handlers registered without one.
    - ``backoff_base``, ``backoff_cap``, ``jitter``: a failure retries after base·2^(attempt-1) seconds,
      capped, scaled by up to ±jitter (``random``: the source of that jitter).
    - ``extend_leases``: extend the leases of handlers running past a third of theirs (the heartbeat).
    - ``schedules``: run a ``Scheduler`` alongside, enqueuing the schedules' jobs when due (any number of
      workers may run one).
    - ``delete_succeeded``: delete succeeded jobs that have no ``user_id`` instead of keeping them (faster;
      their results and idempotency keys are not kept; see ``JobStore.complete_many``).
    - ``presence_every``: seconds between the worker's reports of itself (its row in jobkit_workers, with
      what it did: what ``list_workers``, ``activity`` and the dashboard show); 0: none.

    ``heartbeat`` and ``beat``, the names before 0.6, still work and warn.
    - ``tracing``: run each attempt in an OpenTelemetry span continuing the enqueuer's trace (None: when the
      app has set a tracer provider; ``pgjobkit.exporters.otel``).
    - ``metrics_port``: serve Prometheus metrics at ``http://metrics_host:metrics_port/metrics`` while
      ``run()`` runs (None: not served).
    """

    name: str | None = None
    types: tuple[str, ...] | None = None
    concurrency: int = bounds.DEFAULT_CONCURRENCY
    batch_size: int = bounds.DEFAULT_BATCH_SIZE
    poll_interval: float = bounds.DEFAULT_POLL_INTERVAL
    lease: timedelta = timedelta(seconds=bounds.DEFAULT_LEASE_SECONDS)
    backoff_base: float = bounds.DEFAULT_BACKOFF_BASE
    backoff_cap: float = bounds.DEFAULT_BACKOFF_CAP
    jitter: float = bounds.DEFAULT_JITTER
    random: Callable[[], float] = field(default_factory=lambda: random.Random().random, compare=False)
    extend_leases: bool = True
    schedules: bool = bounds.DEFAULT_SCHEDULES
    delete_succeeded: bool = False
    presence_every: float = bounds.DEFAULT_BEAT
    tracing: bool | None = None
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"

    @classmethod
    def from_settings(cls, settings: Settings) -> WorkerOptions:
        """The options the JOBKIT_* variables set (the rest at their defaults)."""
        return cls(
            concurrency=settings.concurrency,
            batch_size=settings.batch_size,
            poll_interval=settings.poll_interval,
            lease=timedelta(seconds=settings.lease_seconds),
            backoff_base=settings.backoff_base,
            backoff_cap=settings.backoff_cap,
            jitter=settings.jitter,
            schedules=settings.schedules,
        )

    def __post_init__(self) -> None:
        if self.name is not None:
            transitions.check_worker(self.name)
        if self.types is not None and not self.types:
            raise InvalidArgument("jobkit: types must name at least one job type, or be None for all")
        if self.concurrency < 1:
            raise InvalidArgument("jobkit: concurrency must be >= 1")
        if self.batch_size < 1:
            raise InvalidArgument("jobkit: batch_size must be >= 1")
        if not self.poll_interval > 0:
            raise InvalidArgument("jobkit: poll_interval must be > 0 seconds")
        if not 0 <= self.presence_every <= 3600:
            raise InvalidArgument("jobkit: presence_every must be between 0 (no reports) and 3600 seconds")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise InvalidArgument("jobkit: metrics_port must be a TCP port, 0 to 65535 (0: any free port)")
        transitions.check_lease(self.lease)
        transitions.backoff(
            1, base=self.backoff_base, cap=self.backoff_cap, jitter=self.jitter, random=self.random
        )

    @property
    def heartbeat(self) -> bool:
        """Deprecated name of ``extend_leases``."""
        _warn("heartbeat")
        return self.extend_leases

    @property
    def beat(self) -> float:
        """Deprecated name of ``presence_every``."""
        _warn("beat")
        return self.presence_every


RENAMED = {"heartbeat": "extend_leases", "beat": "presence_every"}  # the 0.5 names of options


def _warn(old: str) -> None:
    warnings.warn(
        f"WorkerOptions.{old} is now WorkerOptions.{RENAMED[old]}", DeprecationWarning, stacklevel=3
    )


def _taking_old_names(init: Callable[..., None]) -> Callable[..., None]:
    """``init`` also taking the options' old names (``RENAMED``), each with a DeprecationWarning; an old
    name given wins over its new one (``dataclasses.replace`` passes every field)."""

    @functools.wraps(init)
    def __init__(self: WorkerOptions, *args: Any, **kwargs: Any) -> None:
        for old, new in RENAMED.items():
            if old in kwargs:
                _warn(old)
                kwargs[new] = kwargs.pop(old)
        init(self, *args, **kwargs)

    return __init__


WorkerOptions.__init__ = _taking_old_names(WorkerOptions.__init__)  # type: ignore[method-assign]
