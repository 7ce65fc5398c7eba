"""Processing under pressure, jobkit beside pgmq on the same server: the queue drained at batch 50 by one
consumer loop (a round trip per batch: jobkit's complete-and-claim through ``WorkerCalls``, each claim
starting where the Worker's would, after its last job but every RESCAN-th, pgmq's read then delete in one
transaction, as bench/peers.py's consumer) while

- ``clean``:   nothing else runs;
- ``pinned``:  a transaction that holds an XID stays open for the whole drain, so no row version dead since
               it began can be removed (the horizon is pinned);
- ``readers``: four REPEATABLE READ sessions scan the queue's tables over and over, each snapshot held for a
               second (analytics readers).

Each drain reports its jobs/s, its round trips' latency (p50 and p99 over the first and the last tenth of
the drain: flat under pressure, or growing), and the dead row versions in the queue's tables at its end."""

from __future__ import annotations

import multiprocessing
import statistics
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg

from bench import peers
from pgjobkit.stores.postgres import PostgresStore
from pgjobkit.worker.calls import WorkerCalls
from pgjobkit.worker.exchange import ClaimCursor

PRESSURES = ("clean", "pinned", "readers")
READERS = 4
HOLD = 1.0  # seconds a reader keeps each snapshot
BATCH = 50
# the tables a reader scans, and whose dead row versions are counted
HOT_TABLES = {"jobkit": ("public.jobkit_jobs",), "pgmq": (f"pgmq.q_{peers.QUEUE}",)}


@dataclass(frozen=True)
class Drain:
    """One drain: jobs/s; round-trip latency in ms, p50 and p99, over its first and its last tenth; dead row
    versions in the hot tables at its end."""

    rate: float
    early: tuple[float, float]
    late: tuple[float, float]
    dead_tuples: int


@contextmanager
def _pinned(url: str) -> Iterator[None]:
    """A transaction holding an XID, open for the block."""
    with psycopg.connect(url) as conn:
        conn.execute("select pg_current_xact_id()")
        try:
            yield
        finally:
            conn.rollback()


@contextmanager
def _readers(url: str, tables: tuple[str, ...]) -> Iterator[None]:
    """READERS sessions, each scanning ``tables`` in REPEATABLE READ transactions held HOLD seconds."""
    stop = threading.Event()

    def read() -> None:
        with psycopg.connect(url) as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            while not stop.is_set():
                with conn.transaction():
                    for table in tables:
                        conn.execute(f"select count(*) from {table}")
                    stop.wait(HOLD)

    threads = [threading.Thread(target=read, daemon=True) for _ in range(READERS)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.2)  # each holds a snapshot before the drain begins
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(30)


@contextmanager
def _pressure(kind: str, url: str, system: str) -> Iterator[None]:
    if kind == "pinned":
        with _pinned(url):
            yield
    elif kind == "readers":
        with _readers(url, HOT_TABLES[system]):
            yield
    else:
        yield


def _jobkit_round_trips(url: str) -> Generator[Callable[[], int]]:
    with PostgresStore(url, max_size=2) as store:
        calls, lease, cursor = WorkerCalls(store), timedelta(seconds=30), ClaimCursor()
        held: list[tuple[Any, Any]] = []

        def round_trip() -> int:
            nonlocal held
            after = cursor.after()
            if held:
                _, jobs = calls.complete_and_claim(held, [peers.TASK], "bench", lease, BATCH, after=after)
            else:
                jobs = calls.claim([peers.TASK], "bench", lease, BATCH, after)
            jobs = cursor.claimed(BATCH, jobs)
            held = [(j.id, j.lease_token) for j in jobs]
            return len(jobs)  # 0: the last batch held was completed, and nothing is left

        yield round_trip


def _pgmq_round_trips(url: str) -> Generator[Callable[[], int]]:
    with psycopg.connect(url, autocommit=True) as conn:

        def round_trip() -> int:
            with conn.transaction():
                msgs = conn.execute(
                    "select msg_id from pgmq.read(%s, %s, %s)", (peers.QUEUE, peers.VT, BATCH)
                ).fetchall()
                if msgs:
                    conn.execute("select pgmq.delete(%s, %s::bigint[])", (peers.QUEUE, [m[0] for m in msgs]))
            return len(msgs)

        yield round_trip


ROUND_TRIPS: dict[str, Callable[[str], Generator[Callable[[], int]]]] = {
    "jobkit": _jobkit_round_trips,
    "pgmq": _pgmq_round_trips,
}


def _dead_tuples(url: str, system: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("select pg_stat_force_next_flush()")
        total = 0
        for table in HOT_TABLES[system]:
            row = conn.execute("select pg_stat_get_dead_tuples(%s::regclass)", (table,)).fetchone()
            total += int(row[0]) if row else 0
        return total


def _ms(values: list[float]) -> tuple[float, float]:
    if not values:
        return (0.0, 0.0)
    ordered = sorted(values)
    return statistics.median(ordered) * 1000, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000


def drain(system: str, url: str, n: int, pressure: str) -> Drain:
    """Fill the queue with ``n`` jobs (untimed), then drain it under ``pressure``; check every job done."""
    peers.fill(system, url, n)  # emptied, filled, checked and vacuumed: the same start for every system
    latencies: list[float] = []
    with _pressure(pressure, url, system):
        round_trips = ROUND_TRIPS[system](url)
        round_trip = next(round_trips)
        done, start = 0, time.perf_counter()
        while True:
            began = time.perf_counter()
            got = round_trip()
            latencies.append(time.perf_counter() - began)
            if got == 0:
                break
            done += got
        seconds = time.perf_counter() - start
        round_trips.close()
        dead = _dead_tuples(url, system)
    peers.check_done(system, url, n)
    tenth = max(1, len(latencies) // 10)
    return Drain(n / seconds, _ms(latencies[:tenth]), _ms(latencies[-tenth - 1 : -1]), dead)


# --- offered load ------------------------------------------------------------------------------------------
WINDOW = 10.0  # seconds a latency window spans
TICK = 0.05  # the producer enqueues every TICK seconds


@dataclass(frozen=True)
class Offered:
    """A run at a steady offered rate: jobs/s completed while it was offered (by the consumer, measured
    over the offering), the backlog when offering stopped, and the round trips' p99 in each WINDOW."""

    offered: float
    completed: float
    backlog: int
    p99s: tuple[float, ...]


def _produce(system: str, url: str, rate: float, seconds: float, count: Any, go: Any) -> None:
    """A producer process: once ``go`` is set, enqueue ``rate`` jobs/s for ``seconds`` (a batch every TICK,
    the peers' batch path), keeping ``count`` at the number enqueued."""
    with peers._producer(system, url) as (_, many):
        go.wait()
        start, due = time.perf_counter(), 0.0
        while (elapsed := time.perf_counter() - start) < seconds:
            want = int(rate * elapsed) - count.value
            if want > 0:
                many(range(count.value, count.value + want))
                count.value += want
            due += TICK
            time.sleep(max(0.0, start + due - time.perf_counter()))


def offered(system: str, url: str, rate: float, seconds: float, readers: bool) -> Offered:
    """Offer ``rate`` jobs/s for ``seconds`` from a producer process to one consumer loop at batch 50 (this
    process), beside four readers when ``readers``; then drain what is left and check every job done."""
    peers.reset(system, url)
    ctx = multiprocessing.get_context("spawn")
    count, go = ctx.Value("q", 0), ctx.Event()
    producer = ctx.Process(target=_produce, args=(system, url, rate, seconds, count, go))
    producer.start()
    time.sleep(1.0)  # its imports and connection, before the clock starts
    latencies: list[tuple[float, float]] = []  # (when, seconds)
    completed_while_offered = 0
    with _pressure("readers" if readers else "clean", url, system):
        round_trips = ROUND_TRIPS[system](url)
        round_trip = next(round_trips)
        start = time.perf_counter()
        go.set()
        done = 0
        while True:
            began = time.perf_counter()
            got = round_trip()
            latencies.append((began - start, time.perf_counter() - began))
            done += got
            if producer.is_alive():
                completed_while_offered = done
                if got == 0:
                    time.sleep(0.005)  # caught up: wait for the producer, as a polling worker would
                continue
            if got == 0 and done >= count.value:
                break
        producer.join()
        backlog = count.value - completed_while_offered
        round_trips.close()
    peers.check_done(system, url, count.value)
    windows = int(seconds // WINDOW)
    p99s = tuple(
        _ms([s for when, s in latencies if w * WINDOW <= when < (w + 1) * WINDOW])[1] for w in range(windows)
    )
    return Offered(count.value / seconds, completed_while_offered / seconds, backlog, p99s)
