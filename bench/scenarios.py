"""jobkit's figures: the real Worker and stores, measured end to end."""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import respx

from pgjobkit import NewJob, Worker
from pgjobkit.core.bounds import DEFAULT_BATCH_SIZE
from pgjobkit.core.pipelines import Pipeline
from pgjobkit.ops import Call
from pgjobkit.stores.postgres import PostgresStore
from pgjobkit.stores.supabase import SupabaseStore
from pgjobkit.worker.calls import WorkerCalls
from pgjobkit.worker.options import WorkerOptions


def _fill(store: PostgresStore | SupabaseStore, jobs: int, type_: str = "noop", keys: bool = False) -> None:
    for start in range(0, jobs, 5000):
        n = min(5000, jobs - start)
        store.enqueue_many(
            [NewJob(type=type_, idempotency_key=f"k{start + i}" if keys else None) for i in range(n)]
        )


def _noop_sync(payload: dict[str, Any]) -> None:
    pass


async def _noop_async(payload: dict[str, Any]) -> None:
    pass


def check_all_succeeded(url: str, jobs: int) -> None:
    """A run counts only when, in SQL, exactly ``jobs`` jobs exist and all of them succeeded."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "select count(*), count(*) filter (where status = 'succeeded') from public.jobkit_jobs"
        ).fetchone()
    if row != (jobs, jobs):
        raise AssertionError(f"benchmark run not valid: (jobs, succeeded) = {row}, expected {jobs} of each")


def process(
    url: str,
    jobs: int,
    *,
    concurrency: int | None = None,
    batch: int | None = None,
    handler: str = "sync",
    **options: Any,
) -> float:
    """No-op jobs through the real Worker on PostgresStore (``None``: the worker's default), run until the
    queue is empty: jobs/s from first claim to last completion. ``handler``: "sync" or "async"; ``options``:
    more WorkerOptions."""
    store = PostgresStore(url, max_size=12)
    try:
        _fill(store, jobs)
        chosen = WorkerOptions(poll_interval=0.05, schedules=False, **options)  # None below: the default
        chosen = dataclasses.replace(chosen, concurrency=concurrency or chosen.concurrency)
        worker = Worker(store, options=dataclasses.replace(chosen, batch_size=batch or chosen.batch_size))
        worker.register("noop", _noop_async if handler == "async" else _noop_sync)
        start = time.perf_counter()
        summary = worker.run(install_signals=False, until_empty=True)
        seconds = time.perf_counter() - start
        assert summary.succeeded == jobs, summary
        check_all_succeeded(url, jobs)
        return jobs / seconds
    finally:
        store.close()


def fan_in(url: str, children: int, *, dependent: bool) -> tuple[float, float]:
    """``children`` no-op jobs through the real Worker on PostgresStore (its defaults), enqueued as one
    pipeline with a job that waits for all of them (``dependent``), or as plain jobs: the children's jobs/s
    from the first one's claim to the last one's completion, by the database's clock; and how long after
    that completion the waiting job was claimed, in ms (0 without one)."""
    store = PostgresStore(url, max_size=12)
    try:
        if dependent:  # the children in one call, the job that waits for them in a second (10,000 a call)
            pipeline = Pipeline()
            for _ in range(children):
                pipeline.add("noop")
            made = store.enqueue_pipeline(pipeline)
            fan_in = Pipeline(pipeline_id=made.pipeline_id)
            fan_in.add("fan_in", after=[j.id for j in made.jobs])
            store.enqueue_pipeline(fan_in)
        else:
            _fill(store, children)
        worker = Worker(store, options=WorkerOptions(poll_interval=0.05, schedules=False))
        worker.register("noop", _noop_sync)
        worker.register("fan_in", _noop_sync)
        summary = worker.run(install_signals=False, until_empty=True)
        assert summary.succeeded == children + dependent, summary
        check_all_succeeded(url, children + dependent)
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "select extract(epoch from max(j.updated_at) - min(j.started_at)), "
                "extract(epoch from (select f.started_at from public.jobkit_jobs f where f.type = 'fan_in') "
                "  - max(j.updated_at)) * 1000 "
                "from public.jobkit_jobs j where j.type = 'noop'"
            ).fetchone()
        assert row is not None
        return children / float(row[0]), max(0.0, float(row[1] or 0.0))  # 0: claimed as it completed
    finally:
        store.close()


def awaiting(url: str, jobs: int = 1000, seconds: float = 1.0) -> float:
    """``jobs`` async jobs that each await ``seconds`` (an API call's wait), one worker process with
    concurrency ``jobs``: wall seconds from the first claim to the last completion."""
    store = PostgresStore(url, max_size=12)
    try:
        _fill(store, jobs)
        worker = Worker(store, concurrency=jobs, poll_interval=0.05, schedules=False)

        @worker.handler("noop")
        async def wait(payload: dict[str, Any]) -> None:
            await asyncio.sleep(seconds)

        start = time.perf_counter()
        worker.run(install_signals=False, until_empty=True)
        elapsed = time.perf_counter() - start
        check_all_succeeded(url, jobs)
        return elapsed
    finally:
        store.close()


def process_supabase(url: str, jobs: int, *, batch: int = DEFAULT_BATCH_SIZE) -> tuple[float, float]:
    """The same through SupabaseStore and the test router, at the Worker's default batch (and concurrency
    as large): (jobs/s, HTTP requests per job)."""
    from tests.doubles.router import BASE_URL, SupabaseRouter, make_jwt

    router = SupabaseRouter(url)
    with respx.mock(assert_all_called=False) as mock:
        mock.route(host="supabase.test").mock(side_effect=router)
        store = SupabaseStore(BASE_URL, make_jwt("service_role"), realtime=False)
        _fill(store, jobs)
        worker = Worker(store, concurrency=batch, batch_size=batch, poll_interval=0.05, schedules=False)
        worker.register("noop", lambda payload: None)
        before = len(router.requests)
        start = time.perf_counter()
        worker.run(install_signals=False, max_jobs=jobs)
        seconds = time.perf_counter() - start
        requests = len(router.requests) - before
        store.close()
    router.close()
    return jobs / seconds, requests / jobs


def enqueue_one_per_call(url: str, jobs: int) -> float:
    store = PostgresStore(url, max_size=1)
    try:
        start = time.perf_counter()
        for i in range(jobs):
            store.enqueue(NewJob(type="noop", payload={"n": i}))
        return jobs / (time.perf_counter() - start)
    finally:
        store.close()


def enqueue_batches(url: str, jobs: int, batch: int = 1000) -> float:
    """Batches of ``batch`` jobs, each with an idempotency key."""
    store = PostgresStore(url, max_size=1)
    try:
        batches = [
            [NewJob(type="noop", payload={"n": i}, idempotency_key=f"key-{i}") for i in range(s, s + batch)]
            for s in range(0, jobs, batch)
        ]
        start = time.perf_counter()
        for b in batches:
            store.enqueue_many(b)
        return jobs / (time.perf_counter() - start)
    finally:
        store.close()


def _pickups(
    url: str, store: Any, samples: int, ready: Callable[[], bool], idle: float
) -> tuple[float, float]:
    """Enqueue -> handler start on an idle Worker over ``store`` (poll interval 1 s), once ``ready()``:
    (p50, p99) in milliseconds."""
    latencies: list[float] = []
    seen = threading.Event()
    sent = [0.0]

    def handler(payload: dict[str, Any]) -> None:
        latencies.append((time.perf_counter() - sent[0]) * 1000)
        seen.set()

    worker = Worker(store, poll_interval=1.0, schedules=False)
    worker.register("ping", handler)
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not ready() and time.monotonic() < deadline:
            time.sleep(0.01)
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(samples):
                seen.clear()
                time.sleep(idle)  # idle: the worker is waiting
                sent[0] = time.perf_counter()
                conn.execute("select public.jobkit_enqueue('ping')")
                assert seen.wait(5)
    finally:
        worker.stop()
        thread.join(10)
    qs = statistics.quantiles(latencies, n=100)
    return statistics.median(latencies), qs[98]


def pickup_latency(url: str, samples: int, *, listen: bool) -> tuple[float, float]:
    """Enqueue -> handler start on an idle worker on the direct path: (p50, p99) in milliseconds."""
    store = PostgresStore(url, max_size=4, listen=listen)
    started = time.monotonic()
    try:
        return _pickups(url, store, samples, lambda: time.monotonic() - started > 0.5, idle=0.02)
    finally:
        store.close()


def claim_latency(url: str, rounds: int = 300, keys: int = 0) -> float:
    """Median milliseconds of claiming one runnable job (enqueue and complete around it, not timed);
    ``keys``: the enqueued jobs take turns among that many fairness keys."""
    store = PostgresStore(url, max_size=1)
    times = []
    try:
        for i in range(rounds):
            store.enqueue(NewJob(type="probe", fair_key=f"user-{i % keys}" if keys else None))
            start = time.perf_counter()
            [job] = WorkerCalls(store).claim(["probe"], "bench", timedelta(seconds=30), 1)
            times.append((time.perf_counter() - start) * 1000)
            assert job.lease_token is not None
            WorkerCalls(store).complete(job.id, job.lease_token)
    finally:
        store.close()
    return statistics.median(times)


def add_finished_rows(url: str, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "insert into public.jobkit_jobs (type, status, attempts, claimed_by, created_at, updated_at) "
            "select 'done', 'succeeded', 1, 'bench', now() - interval '1 day', now() - interval '1 day' "
            "from generate_series(1, %s)",
            (rows,),
        )
        conn.execute("vacuum analyze public.jobkit_jobs")


def add_runnable_rows(url: str, rows: int, keys: int) -> None:
    """``rows`` runnable probe jobs, enqueued in batches, spread over ``keys`` fairness keys (each key's jobs
    take consecutive turns, as a burst per user would)."""
    store = PostgresStore(url, max_size=1)
    try:
        for start in range(0, rows, 10_000):
            store.enqueue_many(
                [
                    NewJob(type="probe", fair_key=f"user-{n % keys}")
                    for n in range(start, min(rows, start + 10_000))
                ]
            )
    finally:
        store.close()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("vacuum analyze public.jobkit_jobs")


def set_probe_limits(url: str) -> None:
    """Every kind of limit on the probe type, set far above what the measurement reaches."""
    with PostgresStore(url, max_size=1) as store:
        store.set_limit(
            "probe", max_running=1000, max_starts=100_000, per=timedelta(minutes=1), max_running_per_key=10
        )


def worker_memory(url: str, jobs: int) -> list[tuple[int, float]]:
    """RSS (MiB) of this process while one Worker runs ``jobs`` async jobs, every tenth of the way."""
    store = PostgresStore(url, max_size=8)
    samples: list[tuple[int, float]] = []
    done = [0]
    step = max(1, jobs // 10)

    async def handler(payload: dict[str, Any]) -> None:
        done[0] += 1
        if done[0] % step == 0:
            samples.append((done[0], _rss_mib()))

    try:
        _fill(store, jobs)
        worker = Worker(store, poll_interval=0.05, schedules=False)  # the defaults, an async handler
        worker.register("noop", handler)
        worker.run(install_signals=False, until_empty=True)
        check_all_succeeded(url, jobs)
    finally:
        store.close()
    return samples


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def supabase_database() -> str:
    """A fresh database shaped like a Supabase project (the tests' bootstrap, realtime schema included),
    with jobkit's migration applied: its URL."""
    from pathlib import Path

    from bench.setup import fresh_database

    bootstrap = Path(__file__).resolve().parents[1] / "tests" / "doubles" / "supabase_bootstrap.sql"
    url = fresh_database("jobkit_bench_supabase", migrate=False)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(bootstrap.read_text().encode())
    from pgjobkit.migrate import apply

    apply(url)
    return url


def pickup_realtime(url: str, samples: int) -> tuple[float, float]:
    """Enqueue -> handler start on an idle worker on the Supabase path (test router for HTTP, the test
    Realtime server for wake-ups, poll interval 1 s): (p50, p99) in milliseconds."""
    from pgjobkit.stores.supabase import AsyncSupabaseStore
    from tests.doubles.realtime_server import realtime_server
    from tests.doubles.router import BASE_URL, SECRET_KEY, SupabaseRouter

    router = SupabaseRouter(url)
    try:
        with realtime_server(url) as server, respx.mock(assert_all_called=False) as mock:
            mock.route(host="supabase.test").mock(side_effect=router)
            store = AsyncSupabaseStore(BASE_URL, SECRET_KEY, realtime=server.url)
            return _pickups(url, store, samples, lambda: ("jobkit:workers", True) in server.joins, idle=0.05)
    finally:
        router.close()


def progress_writes(url: str, jobs: int = 20, seconds: float = 2.0, reports: int = 1000) -> float:
    """Rows jobkit_progress wrote per job, for ``jobs`` async jobs that each report progress ``reports``
    times over ``seconds`` (counted from what the worker sends; each row is one update)."""
    from pgjobkit import current
    from pgjobkit.stores.postgres import AsyncPostgresStore

    written = [0]

    class Counting(AsyncPostgresStore):
        async def _execute(self, call: Call, conn: Any = None) -> Any:
            if call.fn == "jobkit_progress":
                written[0] += len(call.args["p_ids"][1])
            return await super()._execute(call, conn)

    store = PostgresStore(url, max_size=4)
    _fill(store, jobs)
    store.close()
    counting = Counting(url)
    worker = Worker(counting, concurrency=jobs, poll_interval=0.05, schedules=False)
    worker.on_stop(counting.close)

    @worker.handler("noop")
    async def chatty(payload: dict[str, Any]) -> None:
        for i in range(reports):
            current().progress(i / reports, f"step {i}")
            await asyncio.sleep(seconds / reports)

    worker.run(install_signals=False, until_empty=True)
    check_all_succeeded(url, jobs)
    return written[0] / jobs
