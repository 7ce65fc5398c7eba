"""A worker process for the chaos tests: ``python -m tests.chaos.worker_proc DB_URL MODE``.

MODE ``record``: every execution inserts (job_id, pid) into chaos_runs, on its own connection, before
the handler returns; then it works a few milliseconds. MODE ``exit``: jobs of type ``poison`` kill the
process (os._exit) on every attempt; others are recorded.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg

from pgjobkit import Job, Worker
from pgjobkit.stores.postgres import PostgresStore

LEASE = timedelta(seconds=float(os.environ.get("CHAOS_LEASE", "2")))


def main() -> None:
    url, mode = sys.argv[1], sys.argv[2]
    work = float(os.environ.get("CHAOS_WORK_SECONDS", "0.02"))
    local = threading.local()  # one recording connection per handler thread
    store = PostgresStore(url, max_size=4, timeout=30)
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

    for kind in ("chaos", "poison"):
        worker.register(kind, record)
    worker.run()


if __name__ == "__main__":
    main()
