"""What a running worker does with each kind of fault, on the Supabase and the direct path: every fault
that can pass leaves it running (it says so in its log within about a second when the store is
unreachable); a wrong key or a missing migration stops it at once with a message saying what to fix."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import psycopg
import pytest
import respx

from pgjobkit import NewJob, Worker
from pgjobkit.core.models import JobStatus
from pgjobkit.errors import ConfigurationError, PermissionDenied
from pgjobkit.stores.base import JobStore
from pgjobkit.stores.postgres import PostgresStore
from pgjobkit.stores.supabase import RetryPolicy, SupabaseStore
from tests.doubles import pgtemplate
from tests.doubles.router import BASE_URL, SupabaseRouter
from tests.http.test_requests import TRANSIENT_ANSWERS

NO_WAIT = RetryPolicy(attempts=1)  # the transport gives up at once: the worker itself must ride it out


class Faulty:
    """In front of the router: the next claims fail with ``faults``, one fault every other claim."""

    def __init__(self, router: SupabaseRouter, faults: list[Any]) -> None:
        self.router, self.faults, self.claims = router, list(faults), 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/jobkit_claim"):
            self.claims += 1
            if self.faults and self.claims % 2 == 1:
                fault = self.faults.pop(0)
                if isinstance(fault, Exception):
                    raise fault
                status, body = fault
                if isinstance(body, str):
                    return httpx.Response(status, text=body)
                return httpx.Response(status, json=body)
        return self.router(request)


def _run_in_thread(worker: Worker) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            worker.run(install_signals=False)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def _wait(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@pytest.fixture
def faulty_router(db_url: str) -> Iterator[Callable[[list[Any]], Faulty]]:
    router = SupabaseRouter(db_url)
    made: list[Faulty] = []

    def make(faults: list[Any]) -> Faulty:
        made.append(Faulty(router, faults))
        return made[-1]

    with respx.mock(assert_all_called=False) as mock:
        mock.route(host="supabase.test").mock(side_effect=lambda r: made[-1](r))
        yield make
    router.close()


def test_a_running_worker_rides_out_every_fault_that_can_pass(
    faulty_router: Callable[[list[Any]], Faulty], service_key: str
) -> None:
    faults: list[Any] = [*TRANSIENT_ANSWERS, httpx.ConnectError("refused"), httpx.ReadTimeout("slow")]
    faulty = faulty_router(faults)
    store = SupabaseStore(BASE_URL, service_key, retry=NO_WAIT, realtime=False)
    store.enqueue_many([NewJob(type="t", payload={"i": i}) for i in range(40)])
    worker = Worker(store, batch_size=2, concurrency=2, poll_interval=0.02)
    worker.register("t", lambda p: None)
    thread, errors = _run_in_thread(worker)
    try:
        assert _wait(lambda: store.stats().count(JobStatus.SUCCEEDED) == 40, 60), store.stats()
        assert faulty.faults == [] and thread.is_alive() and errors == []
    finally:
        worker.stop()
        thread.join(10)
    assert not thread.is_alive() and errors == []
    store.close()


def test_a_wrong_secret_key_stops_the_worker_at_once(router: SupabaseRouter) -> None:
    store = SupabaseStore(BASE_URL, "sb_secret_not-this-projects-key", realtime=False)
    worker = Worker(store, poll_interval=0.05)
    worker.register("t", lambda p: None)
    started = time.monotonic()
    with pytest.raises(PermissionDenied, match="secret key") as info:
        worker.run(install_signals=False)
    assert time.monotonic() - started < 2
    assert "HTTP 401" in str(info.value) and "not-this-projects-key" not in str(info.value)
    store.close()


@pytest.fixture
def bare_db() -> Iterator[str]:
    """A Supabase-like database without jobkit's migration."""
    name = f"jk_bare_{time.monotonic_ns()}"
    pgtemplate.create_database(name)
    pgtemplate.bootstrap(name, "current")
    try:
        yield name
    finally:
        pgtemplate.drop_database(name)


def _stops_with_migration_message(store: JobStore) -> None:
    worker = Worker(store, poll_interval=0.05)
    worker.register("t", lambda p: None)
    started = time.monotonic()
    with pytest.raises(
        ConfigurationError,
        match=r"no jobkit schema.*run `pgjobkit migrate`.*`pgjobkit init supabase` then `supabase db push`",
    ):
        worker.run(install_signals=False)
    assert time.monotonic() - started < 2


def test_missing_migrations_stop_the_worker_at_once_on_both_paths(bare_db: str, service_key: str) -> None:
    router = SupabaseRouter(pgtemplate.db_url(bare_db))
    with respx.mock() as mock:
        mock.route(host="supabase.test").mock(side_effect=router)
        store = SupabaseStore(BASE_URL, service_key, realtime=False)
        _stops_with_migration_message(store)
        store.close()
    router.close()
    direct = PostgresStore(pgtemplate.db_url(bare_db), listen=False)
    _stops_with_migration_message(direct)
    direct.close()


def _says_unreachable_and_keeps_running(store: JobStore, caplog: pytest.LogCaptureFixture) -> None:
    worker = Worker(store, poll_interval=0.05)
    worker.register("t", lambda p: None)
    with caplog.at_level(logging.WARNING, logger="pgjobkit"):
        started = time.monotonic()
        thread, errors = _run_in_thread(worker)
        said = _wait(lambda: "unreachable" in caplog.text, 3)
        seconds = time.monotonic() - started
        alive = thread.is_alive()
        worker.stop()
        thread.join(15)
    assert said and seconds < 1.8, (seconds, caplog.text)
    assert alive and errors == [] and not thread.is_alive()
    jobkit_lines = [r for r in caplog.records if r.name.startswith("pgjobkit") and "unreachable" in r.message]
    assert jobkit_lines, caplog.text


def test_the_supabase_path_says_when_the_api_is_unreachable(caplog: pytest.LogCaptureFixture) -> None:
    url = f"http://127.0.0.1:{pgtemplate.free_port()}"  # nothing listens: connection refused
    store = SupabaseStore(url, "sb_secret_x", retry=RetryPolicy(max_total=2.0), realtime=False)
    _says_unreachable_and_keeps_running(store, caplog)
    store.close()


def test_the_direct_path_says_when_the_database_is_unreachable(caplog: pytest.LogCaptureFixture) -> None:
    url = f"postgresql://postgres@127.0.0.1:{pgtemplate.free_port()}/postgres?connect_timeout=1"
    store = PostgresStore(url, listen=False, timeout=3.0)
    _says_unreachable_and_keeps_running(store, caplog)
    assert "Connection refused" in caplog.text or "refused" in caplog.text.lower()
    store.close()


def test_a_project_that_lowered_max_rows(pg: psycopg.Connection[Any], db_url: str, service_key: str) -> None:
    router = SupabaseRouter(db_url, max_rows=100)
    with respx.mock() as mock:
        mock.route(host="supabase.test").mock(side_effect=router)
        store = SupabaseStore(BASE_URL, service_key, max_rows=100, realtime=False)
        out = store.enqueue_many([NewJob(type="t", payload={"i": i}) for i in range(350)])
        assert len(out) == 350
        worker = Worker(store, batch_size=999, concurrency=20)
        worker.register("t", lambda p: None)
        done = sum(worker.tick().count("succeeded") for _ in range(6))
        worker.close()
        assert done == 350
        store.close()
    router.close()
    row = pg.execute(
        "select count(*) filter (where status = 'succeeded') as ok, count(*) as n from public.jobkit_jobs"
    )
    assert row.fetchone() == {"ok": 350, "n": 350}
