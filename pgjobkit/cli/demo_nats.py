"""``pgjobkit demo --nats``: the demo's burst (``demo.burst``) through a real worker on the JetStream store,
on JOBKIT_NATS_URL's cluster, or on a 3-node loopback cluster the demo starts and stops when it is unset;
on a stream of the run's own, deleted at its end.

What differs from the PostgreSQL demo is what the store refuses: no pipeline, and every priority 0 (the
store delivers in stream order). The summary is read back from the store's records (``get`` of each job),
not from the worker's own tallies.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from pgjobkit.cli.demo import Summary, burst, demo_worker
from pgjobkit.core.models import FINISHED, JobStatus
from pgjobkit.natscluster import LocalCluster
from pgjobkit.stores.jetstream import MAX_ATOMIC_JOBS, JetStreamStore


@contextmanager
def cluster_url(url: str | None) -> Iterator[str]:
    """``url`` as it is, or a local 3-node cluster's for the demo's while (stopped after)."""
    if url:
        yield url
        return
    with LocalCluster(3) as cluster:
        yield cluster.url


def run(
    url: str,
    *,
    size: int = 300,
    concurrency: int = 8,
    seed: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Summary:
    """Migrate a stream of the run's own, enqueue the burst, work it off with a real Worker, summarise."""
    rng = random.Random(seed)
    run_id = uuid.uuid4().hex[:8]
    store = JetStreamStore(url, prefix=f"demo{run_id}", stream=f"DEMO{run_id.upper()}")
    try:
        store.migrate()
        jobs = [j.model_copy(update={"priority": 0}) for j in burst(run_id, size, rng)]
        results = [
            r
            for i in range(0, len(jobs), MAX_ATOMIC_JOBS)
            for r in store.enqueue_many(jobs[i : i + MAX_ATOMIC_JOBS])
        ]
        ids = list(dict.fromkeys(r.id for r in results))
        summary = Summary.of_enqueue(f"JetStream stream {store.layout.stream}", results)
        worker = demo_worker(store, run_id, concurrency, schedules=False)
        started = time.monotonic()
        thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
        thread.start()
        try:
            done = 0
            while thread.is_alive() and done < len(ids) and time.monotonic() - started < 300:
                time.sleep(0.2)
                done = sum(store.stats().count(s) for s in FINISHED)
                if progress is not None:
                    progress(done, len(ids))
        finally:
            worker.stop()
            thread.join(30)
        summary.seconds = round(time.monotonic() - started, 3)
        final = [store.get(i) for i in ids]
        summary.succeeded = sum(1 for j in final if j is not None and j.status == JobStatus.SUCCEEDED)
        summary.retried = sum(
            1 for j in final if j is not None and j.status == JobStatus.SUCCEEDED and j.attempts > 1
        )
        summary.dead_errors = {
            str(j.id): j.error or "" for j in final if j is not None and j.status == JobStatus.DEAD
        }
        summary.dead = len(summary.dead_errors)
        summary.jobs = summary.enqueued
        summary.throughput = round((summary.succeeded + summary.dead) / summary.seconds, 1)
        if progress is not None:
            progress(summary.succeeded + summary.dead, summary.jobs)
        return summary
    finally:
        try:
            store.drop()  # the run's own stream: nothing of the demo stays on the cluster
        finally:
            store.close()
