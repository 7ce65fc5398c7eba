"""A worker process for the chaos tests: ``python -m tests.chaos.worker_proc DB_URL MODE``.

MODE ``record``: every execution inserts (job_id, pid) into chaos_runs, on its own connection, before
the handler returns; then it works a few milliseconds. MODE ``exit``: jobs of type ``poison`` kill the
process (os._exit) on every attempt; others are recorded. MODE ``pipeline``: a pipeline's steps, each
recorded so: ``chunk`` adds CHAOS_FANOUT ``embed`` jobs and a ``reindex`` that waits for all of them, whose
every execution also writes what it was handed into chaos_reindex. With CHAOS_NATS_URL set the jobs are on
that JetStream cluster's queue (CHAOS_NATS_PREFIX, CHAOS_NATS_STREAM); DB_URL is then only where the
executions are recorded.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg

from pgjobkit import Job, Worker, current
from pgjobkit.stores import JobStore
from pgjobkit.stores.postgres import PostgresStore

LEASE = timedelta(seconds=float(os.environ.get("CHAOS_LEASE", "2")))


def main() -> None:
    url, mode = sys.argv[1], sys.argv[2]
    work = float(os.environ.get("CHAOS_WORK_SECONDS", "0.02"))
    local = threading.local()  # one recording connection per handler thread
    store: JobStore = PostgresStore(url, max_size=4, timeout=30)
    if os.environ.get("CHAOS_NATS_URL"):
        from pgjobkit.stores.jetstream import JetStreamStore

        nats = os.environ["CHAOS_NATS_URL"]
        queue = {"prefix": os.environ["CHAOS_NATS_PREFIX"], "stream": os.environ["CHAOS_NATS_STREAM"]}
        store = JetStreamStore(nats, **queue, ack_wait=float(os.environ.get("CHAOS_NATS_ACK_WAIT", "30")))
    worker = Worker(
        store,
        concurrency=4,
        batch_size=4,
        poll_interval=0.05,
        backoff_base=0.05,
        backoff_cap=0.2,
        lease=LEASE,
    )

    def record(payload: dict[str, Any], job: Job) -> None:
        if mode == "exit" and job.type == "poison":
            os._exit(3)
        if getattr(local, "conn", None) is None or local.conn.broken or local.conn.closed:
            local.conn = psycopg.connect(url, autocommit=True, connect_timeout=5)
        local.conn.execute("insert into chaos_runs (job_id, pid) values (%s, %s)", (job.id, os.getpid()))
        time.sleep(work)

    for kind in ("chaos", "poison", "transcribe"):
        worker.register(kind, record)
    if mode == "pipeline":
        _pipeline(worker, record, url)
    worker.run()


def _pipeline(worker: Worker, record: Any, url: str) -> None:
    fanout = int(os.environ.get("CHAOS_FANOUT", "1000"))

    @worker.handler("chunk")
    def chunk(payload: dict[str, Any], job: Job) -> None:
        record(payload, job)
        ctx = current()
        embeds = [ctx.add("embed", {"n": n}, max_attempts=20) for n in range(fanout)]
        ctx.add("reindex", {}, after=embeds, max_attempts=20)

    @worker.handler("embed")
    def embed(payload: dict[str, Any], job: Job) -> dict[str, Any]:
        record(payload, job)
        return {"n": payload["n"]}

    @worker.handler("reindex")
    def reindex(payload: dict[str, Any], job: Job) -> None:
        record(payload, job)
        deps = current().dependencies()
        with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(
                "insert into chaos_reindex (job_id, handed, in_order, all_succeeded) values (%s, %s, %s, %s)",
                (
                    job.id,
                    len(deps),
                    [d.result["n"] for d in deps] == list(range(fanout)),
                    all(d.outcome == "succeeded" for d in deps),
                ),
            )


if __name__ == "__main__":
    main()
