"""A stopping worker's drain completes finished jobs as a run does, not once the longest job has ended."""

from __future__ import annotations

import threading
import time
from typing import Any

from pgjobkit import JobStatus, MemoryStore, NewJob, Worker


def test_a_job_that_finishes_during_a_drain_is_completed_while_a_longer_one_runs() -> None:
    """The quick job finishes only once the worker is draining; the long one runs until it sees the quick
    one succeeded in the store (or gives up after 5 s, which fails the test: the old drain held every
    completion until the last job ended)."""
    store = MemoryStore()
    worker = Worker(store, name="test-worker", concurrency=2, batch_size=10, poll_interval=0.05)
    started = {"quick": threading.Event(), "long": threading.Event()}
    draining = threading.Event()
    saw: list[bool] = []

    @worker.handler("t")
    def handler(payload: dict[str, Any]) -> None:
        started[payload["kind"]].set()
        if payload["kind"] == "quick":
            assert draining.wait(5)
            return
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            got = store.get(quick.id)
            if got is not None and got.status == JobStatus.SUCCEEDED:
                saw.append(True)
                return
            time.sleep(0.01)
        saw.append(False)

    quick = store.enqueue(NewJob(type="t", payload={"kind": "quick"}))
    store.enqueue(NewJob(type="t", payload={"kind": "long"}))
    summary: list[Any] = []
    thread = threading.Thread(target=lambda: summary.append(worker.run(install_signals=False)))
    thread.start()
    assert started["quick"].wait(5) and started["long"].wait(5)
    worker.stop()  # as SIGTERM does: no more claims, the running jobs finish
    draining.set()
    thread.join(10)
    assert not thread.is_alive()
    assert saw == [True]
    assert summary[0].succeeded == 2
    assert {j.status for j in store.jobs()} == {JobStatus.SUCCEEDED}
