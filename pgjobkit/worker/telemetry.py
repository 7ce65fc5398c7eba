"""What a worker tells the outside about its jobs: each attempt's end tallied by the minute for its beats
(``pgjobkit.core.workers.Activity``, what the dashboard charts), and, when asked for, metrics in
Prometheus's format (``prometheus``) and through OpenTelemetry (``otel_metrics``), and a span per attempt
(``pgjobkit.exporters.otel``). ``ended`` is called once per attempt, on the worker's loop."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from pgjobkit.core.models import JobStatus
from pgjobkit.core.workers import Activity, QueueDepth
from pgjobkit.exporters.prometheus import Registry
from pgjobkit.stores.base_async import AsyncJobStore
from pgjobkit.version import __version__
from pgjobkit.worker.results import AttemptReport

DEPTH_EVERY = 5.0  # seconds a read of the queue's depth is reused for
DEPTH_SERIES = 200  # the depth's (type, status) series a worker's metrics show: the deepest (``bounded``)

try:
    from opentelemetry import metrics as otel_metrics
except ImportError:  # the [otel] extra is not installed
    otel_metrics = None  # type: ignore[assignment]


def otel_metrics_configured() -> bool:
    """Whether the app set an OpenTelemetry meter provider (else jobkit records no OpenTelemetry metrics)."""
    if otel_metrics is None:
        return False
    provider = otel_metrics.get_meter_provider()
    return type(provider).__name__ not in ("_ProxyMeterProvider", "NoOpMeterProvider")


def bounded(depth: Iterable[QueueDepth], limit: int = DEPTH_SERIES) -> list[QueueDepth]:
    """``depth`` as the metrics show it, in at most ``limit`` + 4 series: its ``limit`` deepest (type,
    status) rows, and the rest summed by status under the type ``""`` (no job's type is empty, so it
    names none of them), with the oldest of their ages. A metrics backend keeps every series it is shown:
    a queue of thousands of types would otherwise cost thousands of series per worker."""
    rows = sorted(depth, key=lambda d: (-d.jobs, d.type, d.status))
    shown, rest = rows[:limit], rows[limit:]
    other: dict[str, tuple[int, float | None]] = {}
    for d in rest:
        jobs, oldest = other.get(d.status, (0, None))
        if d.oldest_seconds is not None and (oldest is None or d.oldest_seconds > oldest):
            oldest = d.oldest_seconds
        other[d.status] = (jobs + d.jobs, oldest)
    return shown + [
        QueueDepth(type="", status=JobStatus(status), jobs=jobs, oldest_seconds=oldest)
        for status, (jobs, oldest) in sorted(other.items())
    ]


class Prometheus:
    """The worker's metrics, named in Prometheus's conventions."""

    def __init__(self) -> None:
        self.registry = r = Registry()
        self.finished = r.counter(
            "jobkit_jobs_finished_total",
            "Attempts this worker ended, by job type and outcome (succeeded, retrying, dead, lost).",
            ("type", "outcome"),
        )
        self.run_seconds = r.histogram(
            "jobkit_job_run_seconds", "Seconds from an attempt's start to its end, by job type.", ("type",)
        )
        self.wait_seconds = r.histogram(
            "jobkit_job_queue_wait_seconds",
            "Seconds a job waited from runnable until this worker claimed it, by job type.",
            ("type",),
        )
        self.running = r.gauge("jobkit_jobs_running", "Jobs running in this worker now, by type.", ("type",))
        self.lease_losses = r.counter(
            "jobkit_lease_losses_total",
            "Attempts whose job stopped being this worker's while it ran (lease lost, or cancelled), by type.",
            ("type",),
        )
        self.store_faults = r.counter(
            "jobkit_store_faults_total",
            "Store calls of the worker's loop that failed with a transient fault, by error class.",
            ("error",),
        )
        self.depth = r.gauge(
            "jobkit_queue_depth",
            "Unfinished jobs in the database by type and status (jobkit_queue_depth), read at scrape time: "
            f'the {DEPTH_SERIES} deepest (type, status) pairs, the rest summed by status under type="".',
            ("type", "status"),
        )
        self.oldest = r.gauge(
            "jobkit_queue_oldest_seconds",
            "Age of the oldest unfinished job of each type and status (runnable ones: since run_after), for "
            "the pairs jobkit_queue_depth shows.",
            ("type", "status"),
        )
        self._series: dict[tuple[str, str], tuple[Any, Any, Any, Any]] = {}
        self.info = r.gauge(
            "jobkit_worker_info", "This worker's name and jobkit version (value 1).", ("worker", "version")
        )

    def ended(self, result: AttemptReport) -> None:
        key = (result.type, result.outcome)
        series = self._series.get(key)
        if series is None:  # each (type, outcome)'s series, looked up once
            series = self._series[key] = (
                self.finished.labels(*key),
                self.run_seconds.labels(result.type),
                self.wait_seconds.labels(result.type),
                self.lease_losses.labels(result.type) if result.outcome == "lost" else None,
            )
        finished, run, wait, lost = series
        finished.inc()
        run.observe(result.seconds)
        wait.observe(result.wait)
        if lost is not None:
            lost.inc()

    def set_running(self, types: Iterable[str]) -> None:
        counts = Counter(types)
        self.running.clear()
        for type_, n in counts.items():
            self.running.labels(type_).set(n)

    def set_depth(self, depth: Iterable[QueueDepth]) -> None:
        self.depth.clear()
        self.oldest.clear()
        for d in depth:
            self.depth.labels(d.type, str(d.status)).set(d.jobs)
            if d.oldest_seconds is not None:
                self.oldest.labels(d.type, str(d.status)).set(d.oldest_seconds)


class OtelMetrics:
    """The same metrics as OpenTelemetry instruments (meter ``pgjobkit``), in its naming conventions. One
    set per meter provider (``get``): OpenTelemetry keeps the first instrument registered under a name, so
    each run points the observed gauges at its own jobs and depth (``observe``)."""

    _made: tuple[object, OtelMetrics] | None = None  # the provider they were made on, and they

    @classmethod
    def get(cls) -> OtelMetrics:
        provider = otel_metrics.get_meter_provider()
        if cls._made is None or cls._made[0] is not provider:
            cls._made = (provider, cls())
        return cls._made[1]

    def __init__(self) -> None:
        meter = otel_metrics.get_meter("pgjobkit", __version__)
        self.finished = meter.create_counter(
            "jobkit.jobs.finished", unit="{attempt}", description="Attempts ended"
        )
        self.duration = meter.create_histogram(
            "jobkit.job.duration", unit="s", description="Attempt run time"
        )
        self.wait = meter.create_histogram(
            "jobkit.job.queue_wait", unit="s", description="Wait until claimed"
        )
        self.lease_losses = meter.create_counter("jobkit.lease.losses", unit="{attempt}")
        self.store_faults = meter.create_counter("jobkit.store.faults", unit="{fault}")
        self._running: Callable[[], Iterable[str]] = list
        self._depth: Callable[[], Iterable[QueueDepth]] = list

        def observe_running(_: Any) -> Iterable[Any]:
            counts = Counter(self._running())
            return [otel_metrics.Observation(n, {"jobkit.job.type": t}) for t, n in counts.items()]

        def observe_depth(_: Any) -> Iterable[Any]:
            return [
                otel_metrics.Observation(
                    d.jobs, {"jobkit.job.type": d.type, "jobkit.job.status": str(d.status)}
                )
                for d in self._depth()
            ]

        meter.create_observable_gauge("jobkit.jobs.running", [observe_running], unit="{job}")
        meter.create_observable_gauge("jobkit.queue.depth", [observe_depth], unit="{job}")

    def observe(
        self, running: Callable[[], Iterable[str]], depth: Callable[[], Iterable[QueueDepth]]
    ) -> OtelMetrics:
        """The gauges read ``running`` (this run's jobs' types) and ``depth`` from now on."""
        self._running, self._depth = running, depth
        return self


class Telemetry:
    """One worker's: its ``activity`` for the next beat (None: it does not beat, so nothing is tallied),
    and the metrics it was asked to keep."""

    def __init__(
        self,
        *,
        activity: Activity | None = None,
        prometheus: Prometheus | None = None,
        otel: OtelMetrics | None = None,
    ) -> None:
        self.activity = activity
        self.prometheus = prometheus
        self.otel = otel
        self.depth: list[QueueDepth] = []  # the latest read of jobkit_queue_depth (read_depth)
        self._depth_read_at = -DEPTH_EVERY

    @classmethod
    def for_run(cls, worker: str, *, reports: bool, serves_metrics: bool) -> Telemetry:
        """What a run of the worker named ``worker`` keeps for the outside: activity for its reports in
        jobkit_workers when it ``reports``; Prometheus metrics when it ``serves_metrics`` (OpenTelemetry's are added by ``watch``)."""
        telemetry = cls(
            activity=Activity() if reports else None, prometheus=Prometheus() if serves_metrics else None
        )
        if telemetry.prometheus is not None:
            telemetry.prometheus.info.labels(worker, __version__).set(1)
        return telemetry

    def watch(self, running: Callable[[], Iterable[str]]) -> None:
        """Record OpenTelemetry metrics too, when the app set a meter provider: the gauges read ``running``
        (the run's jobs' types) and the latest depth read."""
        if otel_metrics_configured():
            self.otel = OtelMetrics.get().observe(running, lambda: self.depth)

    async def read_depth(self, store: AsyncJobStore) -> list[QueueDepth]:
        """The queue's depth as the metrics show it (``bounded``), read from ``store`` unless the latest
        read is under DEPTH_EVERY seconds old (a scrape and a beat share it)."""
        if time.monotonic() - self._depth_read_at >= DEPTH_EVERY:
            self._depth_read_at = time.monotonic()
            self.depth = bounded(await store.queue_depth())
        return self.depth

    def ended(self, result: AttemptReport) -> None:
        """One attempt ended (``pgjobkit.worker.exchange`` records each once)."""
        if self.activity is not None:
            self.activity.add(time.time(), result.type, result.outcome, result.seconds, result.wait)
        if self.prometheus is not None:
            self.prometheus.ended(result)
        o = self.otel
        if o is not None:
            attributes = {"jobkit.job.type": result.type, "jobkit.job.outcome": result.outcome}
            o.finished.add(1, attributes)
            o.duration.record(result.seconds, {"jobkit.job.type": result.type})
            o.wait.record(result.wait, {"jobkit.job.type": result.type})
            if result.outcome == "lost":
                o.lease_losses.add(1, {"jobkit.job.type": result.type})

    def fault(self, exc: BaseException) -> None:
        """A store call of the worker's loop failed with a transient fault."""
        if self.prometheus is not None:
            self.prometheus.store_faults.labels(type(exc).__name__).inc()
        if self.otel is not None:
            self.otel.store_faults.add(1, {"error.type": type(exc).__name__})
