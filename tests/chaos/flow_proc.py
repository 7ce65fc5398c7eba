"""A worker process for the flow-control tests: ``python -m tests.chaos.flow_proc DB_URL``.

Concurrency 16, batch 16. A ``limited`` job records its handler's start and end (the database's clock) in
flow_runs, working FLOW_WORK_SECONDS between them; a ``rated`` job does nothing (its claim's started_at is
what the rate test reads).
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


def main() -> None:
    url = sys.argv[1]
    work = float(os.environ.get("FLOW_WORK_SECONDS", "0.3"))
    local = threading.local()  # one recording connection per handler thread
    store = PostgresStore(url, max_size=4, timeout=30)
    worker = Worker(store, concurrency=16, batch_size=16, poll_interval=0.05, lease=timedelta(seconds=2))

    def limited(payload: dict[str, Any], job: Job) -> None:
        if getattr(local, "conn", None) is None or local.conn.closed:
            local.conn = psycopg.connect(url, autocommit=True, connect_timeout=5)
        local.conn.execute(
            "insert into flow_runs (job_id, pid, started) values (%s, %s, clock_timestamp())",
            (job.id, os.getpid()),
        )
        time.sleep(work)
        local.conn.execute(
            "update flow_runs set ended = clock_timestamp() where job_id = %s and pid = %s and ended is null",
            (job.id, os.getpid()),
        )

    worker.register("limited", limited)
    worker.register("rated", lambda payload: None)
    worker.run()


if __name__ == "__main__":
    main()
