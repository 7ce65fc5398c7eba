"""A worker seen from outside, on real PostgreSQL (and the memory store): its row in jobkit_workers while it
runs, what it did by the minute, and its Prometheus endpoint read with curl and prometheus_client's parser."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import respx
from opentelemetry import metrics as otel_metrics
from opentelemetry.metrics import _internal as otel_metrics_state
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from opentelemetry.util._once import Once
from prometheus_client.parser import text_string_to_metric_families

from pgjobkit import JobStatus, MemoryStore, NewJob, Permanent, PostgresStore, Worker
from pgjobkit.errors import ConfigurationError, TransientError
from pgjobkit.stores.base import JobStore
from pgjobkit.stores.base_async import AsyncJobStore
from pgjobkit.stores.supabase import SupabaseStore
from pgjobkit.version import __version__
from pgjobkit.worker.telemetry import DEPTH_SERIES
from tests.doubles.router import BASE_URL, SECRET_KEY, SupabaseRouter


@pytest.fixture(params=["memory", "postgres"])
def store(request: pytest.FixtureRequest) -> Iterator[JobStore]:
    s: JobStore = (
        MemoryStore()
        if request.param == "memory"
        else PostgresStore(request.getfixturevalue("db_url"), max_size=4)
    )
    yield s
    s.close()


def _wait(condition: Callable[[], bool], what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _curl(*args: str) -> str:
    return subprocess.run(["curl", *args], capture_output=True, text=True, timeout=30, check=True).stdout


def _running(worker: Worker) -> threading.Thread:
    thread = threading.Thread(target=lambda: worker.run(install_signals=False), daemon=True)
    thread.start()
    return thread


def _worker(store: JobStore | AsyncJobStore, **options: Any) -> Worker:
    worker = Worker(store, schedules=False, poll_interval=0.05, presence_every=0.2, **options)

    @worker.handler("embed")
    def embed(payload: dict[str, Any]) -> None:
        time.sleep(0.01)

    @worker.handler("broken")
    def broken(payload: dict[str, Any]) -> None:
        raise Permanent("the model refused it")

    return worker


def test_a_worker_is_listed_while_it_runs_and_its_minutes_add_up(store: JobStore) -> None:
    store.enqueue_many([NewJob(type="embed") for _ in range(6)] + [NewJob(type="broken")])
    worker = _worker(store, concurrency=3)
    thread = _running(worker)
    try:
        _wait(
            lambda: (
                store.stats().count(type="embed")
                == store.stats().count(type="embed", status=JobStatus.SUCCEEDED)
            ),
            "the jobs",
        )
        _wait(lambda: any(w.name == worker.name for w in store.list_workers()), "its first beat")
        [me] = store.list_workers()
        assert (me.alive, me.types, me.concurrency, me.version) == (True, ("broken", "embed"), 3, __version__)
        _wait(
            lambda: sum(r.jobs for r in store.activity(datetime.now(UTC) - timedelta(minutes=5))) == 7,
            "its activity to be beaten in",
        )
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert store.list_workers() == []  # gone with its last beat
    rows = {(r.type, r.outcome): r for r in store.activity(datetime.now(UTC) - timedelta(minutes=5))}
    assert {k: r.jobs for k, r in rows.items()} == {("embed", "succeeded"): 6, ("broken", "dead"): 1}
    embed = rows[("embed", "succeeded")]
    assert embed.run_max >= 0.01 and embed.run_seconds >= 0.06
    assert embed.wait_max >= 0 and embed.wait_seconds <= embed.wait_max * 6 + 1e-9


def test_a_worker_that_cannot_beat_goes_on_working() -> None:
    store = MemoryStore()
    async_store = store.as_async()
    beats = []

    async def refuse(*args: Any, **kwargs: Any) -> int:
        beats.append(kwargs["activity"])
        raise TransientError("jobkit: the beat's connection dropped")

    async_store.worker_beat = refuse  # type: ignore[method-assign]
    worker = _worker(async_store)
    store.enqueue_many([NewJob(type="embed") for _ in range(3)])
    thread = _running(worker)
    try:
        _wait(lambda: store.stats().count(status=JobStatus.SUCCEEDED) == 3, "the jobs")
        _wait(lambda: len(beats) >= 2 and sum(r["jobs"] for r in beats[-1]) == 3, "beats that carry the jobs")
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()


def test_the_metrics_endpoint_counts_what_the_worker_did(db_url: str) -> None:
    with PostgresStore(db_url, max_size=4) as store:
        store.enqueue_many(
            [NewJob(type="embed") for _ in range(5)] + [NewJob(type="broken") for _ in range(2)]
        )
        store.enqueue(NewJob(type="later", delay=timedelta(hours=1)))  # never claimed: in the depth only
        worker = _worker(store, metrics_port=0)
        thread = _running(worker)
        try:
            _wait(
                lambda: store.stats().count(status=JobStatus.QUEUED, type="embed") == 0,
                "the jobs to be claimed",
            )
            _wait(lambda: store.stats().count(status=JobStatus.RUNNING) == 0, "the jobs to end")
            _wait(lambda: worker.metrics_port is not None, "the endpoint")
            text = _curl("-sf", f"http://127.0.0.1:{worker.metrics_port}/metrics")
            head = _curl("-sfI", f"http://127.0.0.1:{worker.metrics_port}/metrics")
        finally:
            worker.stop()
            thread.join(30)
        with psycopg.connect(db_url) as conn:
            depth: dict[str, int] = dict(
                conn.execute(
                    "select type || '/' || status, count(*) from public.jobkit_jobs "
                    "where status in ('queued', 'retrying', 'running', 'waiting') group by 1"
                ).fetchall()
            )
    assert "text/plain; version=0.0.4" in head
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("jobkit_jobs_finished_total", (("outcome", "succeeded"), ("type", "embed")))] == 5
    assert samples[("jobkit_jobs_finished_total", (("outcome", "dead"), ("type", "broken")))] == 2
    assert samples[("jobkit_job_run_seconds_count", (("type", "embed"),))] == 5
    assert samples[("jobkit_job_queue_wait_seconds_count", (("type", "broken"),))] == 2
    assert samples[("jobkit_job_run_seconds_bucket", (("le", "+Inf"), ("type", "embed")))] == 5
    assert samples[("jobkit_worker_info", (("version", __version__), ("worker", worker.name)))] == 1
    shown = {
        f"{dict(labels)['type']}/{dict(labels)['status']}": value
        for (name, labels), value in samples.items()
        if name == "jobkit_queue_depth"
    }
    assert shown == depth == {"later/queued": 1}
    assert not any(name == "jobkit_jobs_running" and value for (name, _), value in samples.items())
    assert worker.metrics_port is None  # closed with the run


# more (type, status) pairs than one call answers (1000), each type with 1 to 7 queued jobs
MANY_TYPES = 1100


def _many_types() -> list[NewJob]:
    return [NewJob(type=f"d{i:04}") for i in range(MANY_TYPES) for _ in range(i % 7 + 1)]


@pytest.mark.parametrize("kind", ["memory", "postgres", "supabase", "supabase, max rows 100"])
def test_the_queue_depth_reads_every_type_and_status(kind: str, request: pytest.FixtureRequest) -> None:
    """Past 1000 (type, status) pairs, and past a project's lowered Max Rows: every pair is read."""
    store: JobStore
    if kind == "memory":
        store = MemoryStore()
        store.enqueue_many(_many_types())
        depth = store.queue_depth()
    else:
        db_url = request.getfixturevalue("db_url")
        with PostgresStore(db_url, max_size=2) as direct:
            direct.enqueue_many(_many_types())
            if kind == "postgres":
                depth = direct.queue_depth()
        if kind.startswith("supabase"):
            max_rows = 100 if kind.endswith("100") else 1000
            router = SupabaseRouter(db_url, max_rows=max_rows)  # PostgREST's max-rows, as the project set it
            with respx.mock(assert_all_called=False) as mock:
                mock.route(host="supabase.test").mock(side_effect=router)
                with SupabaseStore(BASE_URL, SECRET_KEY, realtime=False, max_rows=max_rows) as api:
                    depth = api.queue_depth()
            router.close()
    assert len(depth) == MANY_TYPES
    assert {(d.type, d.status): d.jobs for d in depth} == {
        (f"d{i:04}", JobStatus.QUEUED): i % 7 + 1 for i in range(MANY_TYPES)
    }


def test_the_metrics_endpoint_shows_the_deepest_types_and_sums_the_rest() -> None:
    store = MemoryStore()
    store.enqueue_many(_many_types())
    worker = _worker(store, metrics_port=0)
    thread = _running(worker)
    try:
        _wait(lambda: worker.metrics_port is not None, "the endpoint")
        text = _curl("-sf", f"http://127.0.0.1:{worker.metrics_port}/metrics")
    finally:
        worker.stop()
        thread.join(30)
    [depth] = [f for f in text_string_to_metric_families(text) if f.name == "jobkit_queue_depth"]
    shown = {s.labels["type"]: s.value for s in depth.samples if s.labels["status"] == "queued"}
    assert len(depth.samples) == len(shown) == DEPTH_SERIES + 1  # bounded: the deepest, and one for the rest
    jobs = {f"d{i:04}": i % 7 + 1 for i in range(MANY_TYPES)}
    deepest = sorted(jobs, key=lambda t: (-jobs[t], t))[:DEPTH_SERIES]
    assert {t: v for t, v in shown.items() if t} == {t: jobs[t] for t in deepest}
    assert shown[""] == sum(jobs.values()) - sum(jobs[t] for t in deepest)  # summed, none lost
    assert "summed by status" in text  # and its help says so


@pytest.fixture
def meter_reader() -> Iterator[InMemoryMetricReader]:
    """An SDK meter provider read in memory, global for the test only (OpenTelemetry sets one once)."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    saved = otel_metrics_state._METER_PROVIDER, otel_metrics_state._METER_PROVIDER_SET_ONCE
    otel_metrics_state._METER_PROVIDER, otel_metrics_state._METER_PROVIDER_SET_ONCE = None, Once()
    otel_metrics.set_meter_provider(provider)
    try:
        yield reader
    finally:
        provider.shutdown()
        otel_metrics_state._METER_PROVIDER, otel_metrics_state._METER_PROVIDER_SET_ONCE = saved


def test_with_a_meter_provider_the_same_metrics_go_to_opentelemetry(
    db_url: str, meter_reader: InMemoryMetricReader
) -> None:
    with PostgresStore(db_url, max_size=4) as store:
        store.enqueue_many([NewJob(type="embed") for _ in range(4)] + [NewJob(type="broken")])
        store.enqueue(NewJob(type="later", delay=timedelta(hours=1)))
        worker = _worker(store)
        thread = _running(worker)
        try:
            _wait(lambda: store.stats().count(status=JobStatus.SUCCEEDED) == 4, "the jobs")
            _wait(lambda: store.stats().count(status=JobStatus.DEAD) == 1, "the broken one")
            _wait(lambda: _points(meter_reader).get(("jobkit.queue.depth", "later")) == 1, "a beat's depth")
        finally:
            worker.stop()
            thread.join(30)
    points = _points(meter_reader)
    # a second run in the same process: the gauges read its jobs, not the first run's
    with PostgresStore(db_url, max_size=4) as store:
        store.enqueue(NewJob(type="later", delay=timedelta(hours=2)))
        again = _worker(store)
        thread = _running(again)
        try:
            _wait(lambda: _points(meter_reader).get(("jobkit.queue.depth", "later")) == 2, "its beat's depth")
        finally:
            again.stop()
            thread.join(30)
    assert points[("jobkit.jobs.finished", "embed/succeeded")] == 4
    assert points[("jobkit.jobs.finished", "broken/dead")] == 1
    assert points[("jobkit.job.duration", "embed")] == 4  # a histogram's count
    assert points[("jobkit.job.queue_wait", "broken")] == 1


def _points(reader: InMemoryMetricReader) -> dict[tuple[str, str], float]:
    """Each data point by (instrument, its type[/outcome]): a sum's value, a histogram's count, a gauge's value."""
    data = reader.get_metrics_data()
    out: dict[tuple[str, str], float] = {}
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    attributes = point.attributes or {}
                    key = "/".join(
                        str(attributes[k])
                        for k in ("jobkit.job.type", "jobkit.job.outcome")
                        if k in attributes
                    )
                    # a histogram's count; a sum's or a gauge's value
                    out[(metric.name, key)] = float(
                        point.value if isinstance(point, NumberDataPoint) else point.count
                    )
    return out


def test_a_metrics_port_in_use_stops_the_run_saying_so_and_leaves_nothing_open() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        store = MemoryStore()
        worker = _worker(store, metrics_port=taken.getsockname()[1])
        with pytest.raises(ConfigurationError, match=r"cannot serve metrics on 127\.0\.0\.1"):
            worker.run(install_signals=False, until_empty=True)
        assert worker.metrics_port is None
        assert store._state.listeners == []  # its wake-up subscription was never left open
    finally:
        taken.close()
