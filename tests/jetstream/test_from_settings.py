"""JOBKIT_NATS_URL selects the JetStream store everywhere the settings open one: ``open_store`` (the
blocking ``JetStreamStore``), ``Worker.from_settings()`` (its async twin, ``as_async()``) and the CLI,
``pgjobkit migrate`` included. Each test on a queue of its own, or a cluster of its own where the CLI uses
the default stream."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from pgjobkit.core.models import JobStatus, NewJob
from pgjobkit.errors import NotAvailable
from pgjobkit.natscluster import LocalCluster
from pgjobkit.settings import Settings
from pgjobkit.stores import open_store
from pgjobkit.stores.jetstream import AsyncJetStreamStore, JetStreamStore
from pgjobkit.worker import Worker
from tests.jetstream.store_helpers import fresh_store, run_cli

ROOT = Path(__file__).resolve().parents[2]


def blocking_twin(cluster: LocalCluster) -> JetStreamStore:
    queue = fresh_store(cluster)
    store = JetStreamStore(cluster.url, prefix=queue.layout.prefix, stream=queue.layout.stream)
    store.migrate()
    return store


def test_open_store_on_jobkit_nats_url_is_the_blocking_twin(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOBKIT_NATS_URL", cluster.url)
    store = open_store(Settings.load(env_file=None))
    try:
        assert isinstance(store, JetStreamStore)
        assert isinstance(store.as_async(), AsyncJetStreamStore)
        assert store.layout.partitions == 1
    finally:
        store.close()
    monkeypatch.setenv("JOBKIT_NATS_PARTITIONS", "4")
    store = open_store(Settings.load(env_file=None))
    try:
        assert isinstance(store, JetStreamStore)
        assert store.layout.partitions == 4 and store.as_async().layout.partitions == 4
    finally:
        store.close()


def test_the_blocking_twin_enqueues_reads_cancels_and_wakes_from_any_thread(cluster: LocalCluster) -> None:
    store = blocking_twin(cluster)
    try:
        woken = threading.Event()
        subscription = store.listen(woken.set)
        first = store.enqueue(NewJob(type="b", payload={"n": 1}, idempotency_key="k"))
        again = store.enqueue(NewJob(type="b", payload={"n": 2}, idempotency_key="k"))
        assert first.inserted and not again.inserted and again.id == first.id
        assert woken.wait(5), "no wake-up for the enqueue"
        subscription.close()
        results: list[Any] = []
        threads = [threading.Thread(target=lambda: results.append(store.get(first.id))) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert [j.status for j in results] == [JobStatus.QUEUED] * 4
        [cancelled] = store.cancel([first.id])
        assert cancelled.cancelled
        assert store.stats().count(JobStatus.CANCELLED) == 1
        with pytest.raises(NotAvailable, match="not available on the JetStream store"):
            store.list_schedules()
        assert store.list_limits() == []  # none can be set here
    finally:
        store.close()
    store.close()  # twice: nothing left to close


def test_worker_from_settings_runs_jobs_on_jetstream_with_schedules_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The worker's defaults (the scheduler on, presence reports) on a store without cron schedules: the
    scheduler says once that schedules are not available here and stops; the jobs run. A cluster of its
    own: the settings name the default stream."""
    caplog.set_level(logging.INFO, "pgjobkit.worker.scheduler")
    with LocalCluster(1) as one:
        monkeypatch.setenv("JOBKIT_NATS_URL", one.url)
        worker = Worker.from_settings()
        assert isinstance(worker.store, JetStreamStore)
        done: list[int] = []

        @worker.handler("fs")
        def handle(payload: dict[str, int]) -> None:
            done.append(payload["n"])

        try:
            worker.store.migrate()
            worker.store.enqueue_many([NewJob(type="fs", payload={"n": n}) for n in range(20)])

            async def main() -> None:
                try:
                    await asyncio.wait_for(worker.arun(install_signals=False, until_empty=True), 60)
                finally:
                    await worker.aclose()  # the async store it made (as_async), on this loop

            asyncio.run(main())
            assert sorted(done) == list(range(20))
            assert worker.store.stats().count(JobStatus.SUCCEEDED) == 20
        finally:
            worker.store.close()
    said = [r.getMessage() for r in caplog.records if "schedules" in r.getMessage()]
    assert len(said) == 1 and "not available on the JetStream store" in said[0], said


def test_the_cli_on_jobkit_nats_url_migrates_enqueues_and_refuses_in_one_line(tmp_path: Path) -> None:
    with LocalCluster(1) as one:
        migrated = run_cli("migrate", nats_url=one.url, cwd=tmp_path)
        assert migrated.returncode == 0, migrated.stderr
        assert "stream JOBKIT ready: 1 replica(s)" in migrated.stdout
        again = run_cli("migrate", nats_url=one.url, cwd=tmp_path)
        assert again.returncode == 0 and "ready" in again.stdout, again.stderr  # idempotent
        enqueued = run_cli(
            "enqueue", "cli", "--payload", '{"n": 1}', "--key", "c1", nats_url=one.url, cwd=tmp_path
        )
        assert enqueued.returncode == 0 and enqueued.stdout.startswith("enqueued "), enqueued.stderr
        stats = run_cli("stats", "--json", nats_url=one.url, cwd=tmp_path)
        assert stats.returncode == 0 and '"queued"' in stats.stdout, stats.stderr
        refused = run_cli("limit", "set", "cli", "--max-running", "2", nats_url=one.url, cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.count("\n") == 1 and "not available on the JetStream store" in refused.stderr
        assert "Traceback" not in refused.stderr


def test_the_demo_runs_its_burst_on_a_cluster_it_starts_and_on_jobkit_nats_url(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """``pgjobkit demo --nats``: with JOBKIT_NATS_URL unset it starts a local cluster; set, it runs there
    on a stream of its own and deletes it after. The summary is read back from the records."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPABASE_", "JOBKIT_"))}
    command = [sys.executable, "-c", "from pgjobkit.cli import main; main()", "demo", "--nats"]
    own = subprocess.run(
        [*command, "--size", "40", "--seed", "3", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env | {"PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert own.returncode == 0, own.stderr
    summary = json.loads(own.stdout)
    # 40 unique jobs, 4 poison and 1 revoked (dead), 40 // 8 enqueued again under their keys
    assert (summary["enqueued"], summary["deduplicated"]) == (45, 5), summary
    assert (summary["succeeded"], summary["dead"]) == (40, 5), summary
    assert any("revoked" in e for e in summary["dead_errors"].values())
    human = run_cli("demo", "--nats", "--size", "20", nats_url=cluster.url, cwd=tmp_path)
    assert human.returncode == 0, human.stderr
    assert "cluster: JOBKIT_NATS_URL" in human.stdout and "succeeded     20" in human.stdout, human.stdout

    async def streams() -> list[str]:
        store = fresh_store(cluster)
        async with store:
            return [s.config.name or "" for s in await store.functions.wire.js.streams_info()]

    assert not [name for name in asyncio.run(streams()) if name.startswith("DEMO")]  # deleted after
