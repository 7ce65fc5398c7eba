"""Peer job queues measured on the same PostgreSQL server as jobkit: pgmq, PgQueuer and Procrastinate.

Every job is a no-op: payload ``{"n": i}``, a handler that only counts it. Each figure is jobs/s.

pgmq (SQL API through psycopg; the SQL-only install script shipped in the ``pgmq`` wheel, read with
importlib.resources and run in one transaction, as ``pgmq.install`` does; queue ``bench``):
  enqueue one   ``select pgmq.send('bench', $msg::jsonb)``, one autocommit call per job
  enqueue batch ``select pgmq.send_batch('bench', $msgs::jsonb[])``, 1,000 messages per call
  process       per transaction: ``select * from pgmq.read('bench', 30, batch)``, the handler on each
                message, ``select pgmq.delete('bench', $ids::bigint[])`` (deleted, not archived)
PgQueuer (its documented asyncpg driver, ``AsyncpgDriver(await asyncpg.connect(...))``; its
``Queries.install()``). Its psycopg driver is far slower here: it listens on the one connection it also
queries on, and psycopg's ``notifies(timeout=1.0)`` holds the connection lock while it waits.
  enqueue one   ``await Queries(driver).enqueue("noop", payload)``, each call run on one event loop
  enqueue batch the same ``enqueue`` with lists of 1,000 entrypoints, payloads and priorities
  process       its full consumer: ``PgQueuer(driver)``, ``@pgq.entrypoint("noop")`` (its default
                concurrency_limit 0, unlimited), ``await pgq.run(batch_size=batch,
                mode=QueueExecutionMode.drain)``: its ``Queries.dequeue`` claims ``batch`` jobs, each
                completion goes through its ``log_jobs`` buffer (flushed every ``batch`` jobs or 0.1 s).
                Plain asyncio; uvloop, which its ``pgq run`` CLI uses, measured the same.
Procrastinate (``SchemaManager.apply_schema()``):
  enqueue one   ``task.defer(n=i)`` on a ``SyncPsycopgConnector`` with a pool of one connection
  enqueue batch ``task.batch_defer(*kwargs)``, 1,000 jobs per call
  process       ``app.run_worker_async(concurrency=1, wait=False, listen_notify=False)`` on a
                ``PsycopgConnector`` (pool of 2). Its worker fetches one job per query, so batches
                above 1 are not supported (``BATCHED``; ``process`` raises NotImplementedError).

jobkit-prepared (a variant): jobkit on ``PostgresStore(prepare=True)``, server-side prepared statements.
jobkit-delete (a variant, processing figures only): jobkit's Worker with ``delete_succeeded=True``, which
deletes a succeeded job without an owner instead of keeping it; checked by every job's row being gone.

``process`` enqueues ``n`` jobs untimed, starts ``procs`` worker processes (spawned, each with its own
connection(s)), releases them together once all are connected and stops the clock when the last one
has drained the queue: each consumer's own start-up (PgQueuer's schema check and LISTEN, Procrastinate's
worker registration) is timed. Then the handlers must have run exactly ``n`` times, and ``check_done``
checks the tables.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata, resources
from typing import Any

import asyncpg  # type: ignore[import-untyped]  # asyncpg ships no type hints
import procrastinate
import psycopg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode
from psycopg import sql
from psycopg.types.json import Jsonb

from bench.cpu import server_cpu
from bench.procs import Consumer, run_workers
from bench.setup import fresh_database
from pgjobkit import NewJob, Worker
from pgjobkit.stores.postgres import PostgresStore

PEERS: tuple[str, ...] = ("pgmq", "pgqueuer", "procrastinate")
SYSTEMS: tuple[str, ...] = ("jobkit", *PEERS)  # jobkit measured by the same code, in the same run
# A system run another way, on its database: jobkit with server-side prepared statements
# (PostgresStore(prepare=True)), and jobkit's Worker with delete_succeeded (processing figures only)
VARIANTS: dict[str, str] = {"jobkit-prepared": "jobkit", "jobkit-delete": "jobkit"}
PROCESSING_ONLY: frozenset[str] = frozenset({"jobkit-delete"})
BATCHED: dict[str, bool] = {"jobkit": True, "pgmq": True, "pgqueuer": True, "procrastinate": False}
PROCS: tuple[int, ...] = (1, 2, 4, 8)
QUEUE = "bench"  # pgmq queue
TASK = "noop"  # PgQueuer entrypoint and Procrastinate task name
VT = 30  # pgmq visibility timeout, seconds

# Each peer's tables, emptied by reset and vacuumed after it and after the untimed fill.
TABLES: dict[str, tuple[str, ...]] = {
    "jobkit": ("jobkit_jobs",),
    "pgmq": ("pgmq.q_bench", "pgmq.a_bench"),
    "pgqueuer": ("pgqueuer", "pgqueuer_log", "pgqueuer_statistics"),
    "procrastinate": ("procrastinate_jobs", "procrastinate_events", "procrastinate_workers"),
}
# (query, expected count: None for n) after an enqueue run, and after a processing run.
QUEUED: dict[str, list[tuple[str, int | None]]] = {
    "jobkit": [("select count(*) from public.jobkit_jobs where status = 'queued'", None)],
    "pgmq": [
        ("select count(*) from pgmq.q_bench", None),
        ("select total_messages from pgmq.metrics('bench')", None),
    ],
    "pgqueuer": [
        ("select count(*) from pgqueuer where status = 'queued'", None),
        ("select count(*) from pgqueuer_log where status = 'queued'", None),
    ],
    "procrastinate": [
        ("select count(*) from procrastinate_jobs where status = 'todo'", None),
        ("select count(*) from procrastinate_jobs", None),
    ],
}
DONE: dict[str, list[tuple[str, int | None]]] = {
    "jobkit": [
        ("select count(*) from public.jobkit_jobs where status = 'succeeded'", None),
        ("select count(*) from public.jobkit_jobs where status <> 'succeeded'", 0),
    ],
    "jobkit-delete": [("select count(*) from public.jobkit_jobs", 0)],  # a job not succeeded is kept
    "pgmq": [  # deleted messages leave no row: the queue's id sequence counts what was sent
        ("select count(*) from pgmq.q_bench", 0),
        ("select count(*) from pgmq.a_bench", 0),
        ("select total_messages from pgmq.metrics('bench')", None),
    ],
    "pgqueuer": [
        ("select count(*) from pgqueuer", 0),
        ("select count(*) from pgqueuer_log where status = 'successful'", None),
        ("select count(distinct job_id) from pgqueuer_log where status = 'successful'", None),
        ("select count(*) from pgqueuer_log where status not in ('queued', 'picked', 'successful')", 0),
    ],
    "procrastinate": [
        ("select count(*) from procrastinate_jobs where status = 'succeeded'", None),
        ("select count(*) from procrastinate_jobs where status <> 'succeeded'", 0),
    ],
}

_handled = [0]  # jobs this process's handler has seen


def _handle(payload: object) -> None:
    """The no-op handler every peer runs once per job."""
    _handled[0] += 1


def _peer(peer: str) -> str:
    """The system ``peer`` is (a variant's own system)."""
    base = VARIANTS.get(peer, peer)
    if base not in SYSTEMS:
        raise ValueError(f"unknown peer {peer!r}; one of {SYSTEMS + tuple(VARIANTS)}")
    return base


def versions() -> dict[str, str]:
    """The installed version of each peer, and of the pgmq SQL that the pgmq wheel ships."""
    out = {peer: metadata.version(peer) for peer in PEERS}
    out["pgmq SQL"] = resources.files("pgmq").joinpath("sql", "VERSION").read_text(encoding="utf-8").strip()
    return out


async def _noop_task(n: int) -> None:
    _handle(n)


def _procrastinate(connector: procrastinate.BaseConnector) -> tuple[procrastinate.App, Any]:
    """A Procrastinate app on ``connector`` with the no-op task; (app, task)."""
    app = procrastinate.App(connector=connector)
    return app, app.task(name=TASK)(_noop_task)


async def _asyncpg(url: str) -> Any:
    """An asyncpg connection (PgQueuer's documented driver) to the database of conninfo ``url``."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    return await asyncpg.connect(
        host=info.get("host"),
        port=info.get("port"),
        user=info.get("user"),
        password=info.get("password"),
        database=info.get("dbname"),
    )


def prepare(peer: str, admin_url: str) -> str:
    """Create database ``peer_<peer>`` afresh on the server of ``admin_url`` and install the peer's
    schema with the peer's own script or call; the new database's URL (conninfo)."""
    name = f"peer_{_peer(peer)}"
    if peer == "jobkit":
        return fresh_database(name)  # jobkit's migrations, plain-PostgreSQL bootstrap
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
    url = psycopg.conninfo.make_conninfo(admin_url, dbname=name)
    if peer == "pgmq":
        script = resources.files("pgmq").joinpath("sql", "pgmq.sql").read_text(encoding="utf-8")
        with psycopg.connect(url) as conn:  # one transaction, committed on exit
            conn.execute(script)
            conn.execute("select pgmq.create(%s)", (QUEUE,))
    elif peer == "pgqueuer":

        async def install() -> None:
            conn = await _asyncpg(url)
            await Queries(AsyncpgDriver(conn)).install()
            await conn.close()

        asyncio.run(install())
    else:
        app, _ = _procrastinate(procrastinate.SyncPsycopgConnector(conninfo=url, min_size=1, max_size=1))
        with app.open():
            app.schema_manager.apply_schema()
    return url


def _vacuum(peer: str, url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for table in TABLES[_peer(peer)]:
            conn.execute(sql.SQL("vacuum analyze {}").format(sql.Identifier(*table.split("."))))


def reset(peer: str, url: str) -> None:
    """Empty the peer's queue (and its logs, archive, counters), then vacuum its tables."""
    with psycopg.connect(url, autocommit=True) as conn:
        if _peer(peer) == "pgmq":  # recreated, so that pgmq.metrics' total_messages counts from 0
            conn.execute("select pgmq.drop_queue(%s)", (QUEUE,))
            conn.execute("select pgmq.create(%s)", (QUEUE,))
        else:
            tables = sql.SQL(", ").join(sql.Identifier(t) for t in TABLES[_peer(peer)])
            conn.execute(sql.SQL("truncate {} restart identity cascade").format(tables))
    _vacuum(peer, url)


def _check(peer: str, url: str, n: int, checks: list[tuple[str, int | None]]) -> None:
    wrong = []
    with psycopg.connect(url, autocommit=True) as conn:
        for query, expected in checks:
            row = conn.execute(query).fetchone()
            want = n if expected is None else expected
            if row is None or row[0] != want:
                wrong.append(f"{query!r} gave {None if row is None else row[0]}, expected {want}")
    if wrong:
        raise AssertionError(f"{peer}: " + "; ".join(wrong))


def check_done(peer: str, url: str, n: int) -> None:
    """Raise AssertionError unless all ``n`` jobs were processed and none is left, per the peer's tables."""
    _check(_peer(peer), url, n, DONE[peer] if peer in DONE else DONE[_peer(peer)])


@contextlib.contextmanager
def _producer(
    peer: str, url: str, keyed: bool = False
) -> Iterator[tuple[Callable[[int], object], Callable[[Sequence[int]], object]]]:
    """(enqueue job i, enqueue jobs ids in one call) for ``peer``, over one connection. jobkit answers ids as
    pgmq's ``send`` and ``send_batch`` do: one job through ``enqueue``, batches through its bulk path,
    ``enqueue_bulk`` (COPY), or ``enqueue_many`` with an idempotency key per job when ``keyed``."""
    if peer == "procrastinate":
        app, task = _procrastinate(procrastinate.SyncPsycopgConnector(conninfo=url, min_size=1, max_size=1))
        with app.open():
            yield (lambda i: task.defer(n=i)), (lambda ids: task.batch_defer(*({"n": i} for i in ids)))
        return
    if _peer(peer) == "jobkit":
        with PostgresStore(url, max_size=1, prepare=peer == "jobkit-prepared") as store:

            def many(ids: Sequence[int]) -> object:
                if keyed:
                    return store.enqueue_many(
                        [NewJob(type=TASK, payload={"n": i}, idempotency_key=f"k{i}") for i in ids]
                    )
                return store.enqueue_bulk([NewJob(type=TASK, payload={"n": i}) for i in ids])

            yield (lambda i: store.enqueue(NewJob(type=TASK, payload={"n": i}))), many
        return
    if peer == "pgqueuer":  # its async API, each call run to completion on one event loop
        with asyncio.Runner() as loop:
            conn = loop.run(_asyncpg(url))
            q = Queries(AsyncpgDriver(conn))
            yield (
                lambda i: loop.run(q.enqueue(TASK, b'{"n": %d}' % i)),
                lambda ids: loop.run(
                    q.enqueue([TASK] * len(ids), [b'{"n": %d}' % i for i in ids], [0] * len(ids))
                ),
            )
            loop.run(conn.close())
        return
    with psycopg.connect(url, autocommit=True) as conn:  # pgmq
        yield (
            lambda i: conn.execute("select pgmq.send(%s, %s)", (QUEUE, Jsonb({"n": i}))),
            lambda ids: conn.execute(
                "select pgmq.send_batch(%s, %s)", (QUEUE, [Jsonb({"n": i}) for i in ids])
            ),
        )


def _enqueue(peer: str, url: str, n: int, size: int | None, keyed: bool = False) -> float:
    """Enqueue ``n`` jobs on an emptied queue, one per call (``size`` None) or ``size`` per call; the
    rate, after checking that exactly ``n`` are queued."""
    reset(_peer(peer), url)
    with _producer(peer, url, keyed) as (one, many):
        start = time.perf_counter()
        if size is None:
            for i in range(n):
                one(i)
        else:
            for lo in range(0, n, size):
                many(range(lo, min(lo + size, n)))
        rate = n / (time.perf_counter() - start)
    _check(peer, url, n, QUEUED[_peer(peer)])
    return rate


def enqueue_one(peer: str, url: str, n: int) -> float:
    """Jobs/s enqueueing ``n`` jobs one per call, one autocommit connection."""
    return _enqueue(peer, url, n, None)


def enqueue_batch(peer: str, url: str, n: int, size: int = 1000, keyed: bool = False) -> float:
    """Jobs/s enqueueing ``n`` jobs in calls of ``size`` (jobkit's with idempotency keys when ``keyed``)."""
    return _enqueue(peer, url, n, size, keyed)


def _consume_pgmq(url: str, batch: int, ready: Callable[[], object]) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        ready()
        while True:
            with conn.transaction():
                msgs = conn.execute("select * from pgmq.read(%s, %s, %s)", (QUEUE, VT, batch)).fetchall()
                if not msgs:
                    return _handled[0]
                for msg in msgs:
                    _handle(msg[5])  # msg_id, read_ct, enqueued_at, last_read_at, vt, message, headers
                ids = [msg[0] for msg in msgs]
                deleted = conn.execute("select pgmq.delete(%s, %s::bigint[])", (QUEUE, ids)).fetchall()
                if len(deleted) != len(ids):
                    raise AssertionError(f"pgmq.delete removed {len(deleted)} of {len(ids)} messages")


def _consume_pgqueuer(url: str, batch: int, ready: Callable[[], object]) -> int:
    async def run() -> None:
        conn = await _asyncpg(url)
        pgq = PgQueuer(AsyncpgDriver(conn))

        @pgq.entrypoint(TASK)
        async def noop(job: Job) -> None:
            _handle(job.payload)

        await asyncio.to_thread(ready)
        try:
            await pgq.run(batch_size=batch, mode=QueueExecutionMode.drain)
        finally:
            await conn.close()

    asyncio.run(run())
    return _handled[0]


def _consume_procrastinate(url: str, batch: int, ready: Callable[[], object]) -> int:
    app, _ = _procrastinate(procrastinate.PsycopgConnector(conninfo=url, min_size=2, max_size=2))

    async def run() -> None:
        async with app.open_async():
            await asyncio.to_thread(ready)
            await app.run_worker_async(
                concurrency=1, wait=False, listen_notify=False, install_signal_handlers=False
            )

    asyncio.run(run())
    return _handled[0]


def _consume_jobkit(
    url: str, batch: int, ready: Callable[[], object], delete: bool = False, prepare: bool = False
) -> int:
    """jobkit's Worker, one job in flight (as the peers' consumers), ``batch`` claimed per round trip."""
    with PostgresStore(url, max_size=4, prepare=prepare) as store:
        worker = Worker(
            store,
            concurrency=1,
            batch_size=batch,
            poll_interval=0.05,
            delete_succeeded=delete,
            schedules=False,
        )
        worker.register(TASK, _handle)
        ready()
        worker.run(install_signals=False, until_empty=True)
    return _handled[0]


CONSUMERS: dict[str, Consumer] = {
    "jobkit": _consume_jobkit,
    "jobkit-prepared": functools.partial(_consume_jobkit, prepare=True),
    "jobkit-delete": functools.partial(_consume_jobkit, delete=True),
    "pgmq": _consume_pgmq,
    "pgqueuer": _consume_pgqueuer,
    "procrastinate": _consume_procrastinate,
}


def fill(peer: str, url: str, n: int) -> None:
    """Empty the queue, enqueue ``n`` jobs in batches of 1,000 (untimed), check them queued, vacuum."""
    reset(peer, url)
    with _producer(peer, url) as (_, many):
        for lo in range(0, n, 1000):
            many(range(lo, min(lo + 1000, n)))
    _check(peer, url, n, QUEUED[_peer(peer)])
    _vacuum(peer, url)


def process(
    peer: str, url: str, n: int, batch: int, procs: int, cpu: list[tuple[float, float | None]] | None = None
) -> float:
    """Enqueue ``n`` jobs (untimed, batches of 1,000), then time ``procs`` worker processes, each one
    consumer taking ``batch`` jobs at a time, until all are done; check; jobs/s. With ``cpu``, append the
    CPU microseconds per job the workers spent and the server's (None unless it runs on this machine)."""
    if batch > 1 and not BATCHED[_peer(peer)]:
        raise NotImplementedError(f"{peer}'s worker fetches one job at a time; no batch {batch}")
    fill(peer, url, n)
    drained = run_workers(
        CONSUMERS[peer], peer, url, batch, procs, server_cpu(url) if cpu is not None else None
    )
    if drained.jobs != n:
        raise AssertionError(f"{peer}: handlers ran {drained.jobs} times for {n} jobs")
    check_done(peer, url, n)
    if cpu is not None:
        spent = drained.server_cpu
        cpu.append((drained.cpu / n * 1e6, None if spent is None else spent / n * 1e6))
    return n / drained.seconds


# The consumer loops above without their client: one DO block on the server, a transaction per batch (COMMIT
# inside DO), timed as one statement. jobkit's is the Worker's round trip (complete the last batch, claim
# the next, in one jobkit_claim call; jobkit-delete's with p_done_delete); pgmq's is read then delete. What
# is left of the gap is the database's.
def _jobkit_loop(delete: bool) -> str:
    """jobkit's server loop, completing with ``p_done_delete`` as ``delete``."""
    return """do $$
declare ids uuid[]; tokens uuid[]; n integer;
begin
  loop
    select array_agg(c.id), array_agg(c.lease_token), count(*) into ids, tokens, n
    from public.jobkit_claim(array['%(task)s'], 'bench', 30, %(batch)s, ids, tokens, null, DELETE) c
    where c.status = 'running';
    commit;
    exit when n = 0;
  end loop;
end $$""".replace("DELETE", "true" if delete else "false")


SERVER_LOOP: dict[str, str] = {
    "jobkit": _jobkit_loop(False),
    "jobkit-delete": _jobkit_loop(True),
    "pgmq": """do $$
declare ids bigint[]; n integer;
begin
  loop
    select array_agg(m.msg_id), count(*) into ids, n from pgmq.read('%(queue)s', 30, %(batch)s) m;
    exit when n = 0;
    perform pgmq.delete('%(queue)s', ids);
    commit;
  end loop;
end $$""",
}


def server_loop(peer: str, url: str, n: int, batch: int) -> float:
    """Enqueue ``n`` jobs (untimed), then claim and finish them ``batch`` at a time in one server-side loop
    (``SERVER_LOOP``); check; jobs/s."""
    fill(peer, url, n)
    with psycopg.connect(url, autocommit=True) as conn:
        start = time.perf_counter()
        conn.execute(SERVER_LOOP[peer] % {"batch": int(batch), "task": TASK, "queue": QUEUE})
        seconds = time.perf_counter() - start
    check_done(peer, url, n)
    return n / seconds


def sweep(peer: str, url: str, n: int, batch: int, procs: Sequence[int] = PROCS) -> dict[int, float]:
    """``process`` once for each process count in ``procs``; {processes: jobs/s}."""
    return {p: process(peer, url, n, batch, p) for p in procs}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers")
    parser.add_argument("--quick", action="store_true", help="5,000 jobs instead of 20,000")
    args = parser.parse_args()
    n = 5000 if args.quick else 20000
    from bench.setup import server_url

    admin = server_url()
    print(f"peers, N={n}, one run each, jobs/s; " + ", ".join(f"{k} {v}" for k, v in versions().items()))
    header = ["enq 1/call", "enq 1000/call", "b1 1p", "b1 best", "b50 1p", "b50 best"]
    print(f"{'':14}" + "".join(f"{h:>16}" for h in header), flush=True)
    for peer in SYSTEMS:
        url = prepare(peer, admin)
        cells = [f"{enqueue_one(peer, url, n):.0f}", f"{enqueue_batch(peer, url, n):.0f}"]
        for batch in (1, 50):
            if batch > 1 and not BATCHED[peer]:
                cells += ["\N{EN DASH}"] * 2
                continue
            rates = sweep(peer, url, n, batch)
            top = max(rates, key=rates.__getitem__)
            cells += [f"{rates[1]:.0f}", f"{rates[top]:.0f} ({top}p)"]
        print(f"{peer:14}" + "".join(f"{c:>16}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":  # through the imported module, so that Procrastinate's App is not in __main__
    from bench import peers

    raise SystemExit(peers.main())
