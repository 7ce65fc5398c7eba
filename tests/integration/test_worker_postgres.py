"""The Worker on real PostgreSQL: heartbeats, lease loss, LISTEN wake-ups, transactional enqueue."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pgjobkit import JobStatus, NewJob, Worker
from pgjobkit.settings import Settings
from pgjobkit.stores.postgres import PostgresStore


@contextmanager
def running(worker: Worker) -> Iterator[None]:
    """Run ``worker`` in a thread for the block; always stop it, even when the block fails."""
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        yield
    finally:
        worker.stop()
        thread.join(10)
    assert not thread.is_alive(), "the worker did not stop"


@pytest.fixture
def store(db_url: str) -> Iterator[PostgresStore]:
    s = PostgresStore(db_url, max_size=6)
    try:
        yield s
    finally:
        s.close()


def test_prepare_uses_server_side_prepared_statements(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBKIT_DATABASE_URL", db_url)
    monkeypatch.setenv("JOBKIT_PREPARE", "1")
    worker = Worker.from_settings(Settings.load(env_file=None))
    assert isinstance(worker.store, PostgresStore)
    with worker.store as store:
        for i in range(40):  # psycopg prepares a statement at its fifth use on a connection (of the pool's)
            store.enqueue(NewJob(type="t", payload={"i": i}))
        with store._pool.connection() as conn:  # the pool's connections answer for their own session
            prepared = conn.execute("select count(*) as n from pg_prepared_statements").fetchone()
    assert prepared is not None and prepared["n"] >= 1
    with PostgresStore(db_url, max_size=1) as plain:
        for i in range(6):
            plain.enqueue(NewJob(type="t", payload={"i": i}))
        with plain._pool.connection() as conn:
            assert conn.execute("select count(*) as n from pg_prepared_statements").fetchone() == {"n": 0}


def test_heartbeat_keeps_a_long_job_past_its_first_lease(store: PostgresStore) -> None:
    worker = Worker(store, name="long", jitter=0)
    thief = Worker(store, name="thief", jitter=0)
    stolen: list[Any] = []

    @worker.handler("long", lease=timedelta(seconds=1))
    def long(payload: dict[str, Any]) -> None:
        time.sleep(2.5)

    thief.register("long", stolen.append, lease=timedelta(seconds=1))
    job = store.enqueue(NewJob(type="long"))
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(worker.tick()))
    t.start()
    while (current := store.get(job.id)) is not None and current.status != JobStatus.RUNNING:
        time.sleep(0.01)
    deadline = time.monotonic() + 3.5
    while t.is_alive() and time.monotonic() < deadline:
        assert thief.tick().claimed == 0
        time.sleep(0.1)
    t.join(5)
    assert result[0].results[0].outcome == "succeeded"
    final = store.get(job.id)
    assert final is not None and (final.status, final.attempts) == (JobStatus.SUCCEEDED, 1)
    assert stolen == []
    worker.close()
    thief.close()


def test_without_heartbeat_the_job_is_reclaimed_and_the_stale_completion_rejected(
    store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    slow = Worker(store, name="slow", jitter=0, extend_leases=False)
    fast = Worker(store, name="fast", jitter=0)
    runs: list[str] = []

    @slow.handler("job", lease=timedelta(seconds=0.5))
    def slow_handler(payload: dict[str, Any]) -> None:
        runs.append("slow")
        time.sleep(1.5)

    fast.register("job", lambda p: runs.append("fast"), lease=timedelta(seconds=5))
    job = store.enqueue(NewJob(type="job"))
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(slow.tick()))
    t.start()
    while (current := store.get(job.id)) is not None and current.status != JobStatus.RUNNING:
        time.sleep(0.01)
    time.sleep(0.8)  # past the slow worker's lease
    assert fast.tick().results[0].outcome == "succeeded"
    with caplog.at_level(logging.WARNING, logger="pgjobkit.worker"):
        t.join(5)
    assert out[0].results[0].outcome == "lost"
    assert "lease was lost" in caplog.text
    assert runs == ["slow", "fast"]
    final = store.get(job.id)
    assert final is not None and final.status == JobStatus.SUCCEEDED and final.claimed_by == "fast"
    slow.close()
    fast.close()


def test_listen_notify_wakes_an_idle_worker(store: PostgresStore, db_url: str) -> None:
    worker = Worker(store, poll_interval=30)  # polling alone would wait 30 s
    done = threading.Event()
    worker.register("ping", lambda p: done.set())
    with running(worker):
        time.sleep(0.5)  # the listener is up
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("select public.jobkit_enqueue('ping')")
        assert done.wait(5), "the worker did not wake on NOTIFY"


def test_run_survives_a_store_fault_and_finishes(store: PostgresStore, db_url: str) -> None:
    worker = Worker(store, poll_interval=0.05, concurrency=2)
    done = threading.Event()
    count = [0]

    def handler(payload: dict[str, Any]) -> None:
        count[0] += 1
        if count[0] == 20:
            done.set()

    worker.register("t", handler)
    store.enqueue_many([NewJob(type="t")] * 10)
    with running(worker):
        time.sleep(0.3)
        with psycopg.connect(db_url, autocommit=True) as conn:  # kill every other session on this database
            conn.execute(
                "select pg_terminate_backend(pid) from pg_stat_activity "
                "where datname = current_database() and pid <> pg_backend_pid()"
            )
        store.enqueue_many([NewJob(type="t")] * 10)
        assert done.wait(15)
    assert store.stats().count(JobStatus.SUCCEEDED) == 20


def test_transactional_enqueue_rolls_back_with_the_caller(store: PostgresStore, db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        store.enqueue(NewJob(type="embed", idempotency_key="doc-1"), conn=conn)
        conn.rollback()
        store.enqueue(NewJob(type="embed", idempotency_key="doc-2"), conn=conn)
        conn.commit()
    assert [j.idempotency_key for j in store.list_jobs()] == ["doc-2"]


TRIGGER_SQL = """
create table public.documents (id bigint generated always as identity primary key, body text not null);

create function public.documents_enqueue_embed() returns trigger
language plpgsql security invoker set search_path = '' as $$
begin
  perform public.jobkit_enqueue(
    p_type => 'embed',
    p_payload => jsonb_build_object('document_id', new.id),
    p_idempotency_key => 'embed:' || new.id);
  return new;
end $$;

create trigger documents_enqueue_embed after insert on public.documents
  for each row execute function public.documents_enqueue_embed();
"""


def test_trigger_enqueues_in_the_same_transaction(db_url: str, store: PostgresStore) -> None:
    """The manual's trigger example (docs/guide/enqueue.md), verbatim: a document insert and its embed job
    commit or vanish together."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(TRIGGER_SQL)
    with psycopg.connect(db_url) as conn:
        conn.execute("insert into public.documents (body) values ('rolled back')")
        conn.rollback()
        conn.execute("insert into public.documents (body) values ('kept')")
        conn.commit()
    jobs = store.list_jobs()
    assert len(jobs) == 1
    assert jobs[0].type == "embed" and jobs[0].idempotency_key is not None
    assert jobs[0].payload["document_id"] >= 1
