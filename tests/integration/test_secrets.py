"""No secret in any message, log record, exception (its chain included) or repr: URLs and keys holding a
recognisable secret, fed through every error path of the stores, the worker and the settings that a test
can reach (a malformed URL in several shapes, an unknown database, a refused login, an unreachable port,
Supabase's 401 and an unreachable project)."""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pgjobkit import Worker
from pgjobkit.errors import ConfigurationError, JobkitError, PermissionDenied, TransientError
from pgjobkit.settings import Settings
from pgjobkit.stores import open_store
from pgjobkit.stores.postgres import AsyncPostgresStore, PostgresStore
from pgjobkit.stores.supabase import RetryPolicy, SupabaseStore
from tests.doubles import pgtemplate
from tests.doubles.refusing_postgres import RefusingPostgres
from tests.doubles.router import BASE_URL, SupabaseRouter

SECRET = "s3cr3t-Pa55"
MALFORMED = [
    f"postgresql://app:{SECRET}@[::1:5432/x",
    f"postgresql://app:{SECRET}@127.0.0.1:5432/x?nosuch=1",
    f"postgresql://app@127.0.0.1:5432/x?password={SECRET}&nosuch=1",
    f"host=127.0.0.1 password='{SECRET} x' nosuch=1",
]


@pytest.fixture
def clean(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[..., None]]:
    """``clean(*things)``: asserts the secret is in none of them (an exception with its whole chain, any
    object's repr) nor in any log record so far; every record is captured, at every level."""
    caplog.set_level(logging.DEBUG)

    def check(*things: Any) -> None:
        texts = [caplog.text, *(r.getMessage() for r in caplog.records)]
        for thing in things:
            texts.append(repr(thing))
            if isinstance(thing, BaseException):
                texts += [str(thing), "".join(traceback.format_exception(thing))]
        leaked = [t for t in texts if SECRET in t]
        assert not leaked, leaked

    yield check
    check()


def raised(call: Callable[[], Any]) -> BaseException:
    try:
        call()
    except BaseException as exc:
        return exc
    raise AssertionError("nothing raised")


@pytest.mark.parametrize("url", MALFORMED)
def test_a_malformed_url(url: str, clean: Callable[..., None]) -> None:
    for make in (PostgresStore, AsyncPostgresStore):
        exc = raised(lambda: make(url))  # noqa: B023 (called at once)
        assert isinstance(exc, ConfigurationError)
        clean(exc)
    exc = raised(lambda: PostgresStore("postgresql://h/x", listen_conninfo=url))
    assert isinstance(exc, ConfigurationError) and "listen_conninfo" in str(exc)
    clean(exc)


def test_settings_and_their_stores(monkeypatch: pytest.MonkeyPatch, clean: Callable[..., None]) -> None:
    monkeypatch.setenv("JOBKIT_DATABASE_URL", f"postgresql://app:{SECRET}@127.0.0.1:1/x")
    monkeypatch.setenv("SUPABASE_URL", f"https://app:{SECRET}@x.supabase.co")
    monkeypatch.setenv("SUPABASE_SECRET_KEY", f"sb_secret_{SECRET}")
    monkeypatch.setenv("JOBKIT_DASHBOARD_TOKEN", f"token-{SECRET}")
    settings = Settings.load(env_file=None)
    both = raised(lambda: open_store(settings))  # two stores configured
    assert isinstance(both, ConfigurationError)
    postgres = open_store(Settings.load(env_file=None, store="postgres"))
    supabase = open_store(Settings.load(env_file=None, store="supabase"))
    clean(settings, str(settings), both, postgres, supabase, postgres.as_async())
    postgres.close()
    supabase.close()
    monkeypatch.setenv("JOBKIT_CONCURRENCY", SECRET)  # a malformed value is named, never echoed
    clean(raised(lambda: Settings.load(env_file=None)))


def test_an_unknown_database_a_refused_login_and_an_unknown_role(
    templates: object, clean: Callable[..., None]
) -> None:
    with RefusingPostgres() as server:
        urls = [
            f"postgresql://postgres:{SECRET}@127.0.0.1:5432/jk_no_such_database",
            f"postgresql://app:{SECRET}@127.0.0.1:{server.port}/x",
            f"postgresql://jk_no_such_role:{SECRET}@127.0.0.1:5432/postgres",
        ]
        for url in urls:
            store = PostgresStore(url, listen=False)
            exc = raised(store.stats)
            assert isinstance(exc, ConfigurationError), exc
            clean(exc, store)
            worker = Worker(store, poll_interval=0.05, schedules=False)  # stops at once, no retries
            worker.register("t", lambda payload: None)
            exc = raised(lambda: worker.run(install_signals=False))  # noqa: B023 (called at once)
            assert isinstance(exc, ConfigurationError), exc
            clean(exc)
            store.close()
        assert server.passwords == [SECRET, SECRET]  # the login reached the server, and was not retried


def test_an_unreachable_port(clean: Callable[..., None]) -> None:
    store = PostgresStore(f"postgresql://app:{SECRET}@127.0.0.1:1/x", listen=False, timeout=1.5)
    exc = raised(store.stats)
    assert isinstance(exc, TransientError) and "Connection refused" in str(exc)
    clean(exc, store)
    worker = Worker(store, poll_interval=0.05, schedules=False)
    worker.register("t", lambda payload: None)
    retried = threading.Event()

    class Retries(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "retrying in" in record.getMessage():
                retried.set()

    handler = Retries()
    logging.getLogger("pgjobkit.worker").addHandler(handler)
    thread = threading.Thread(target=lambda: worker.run(install_signals=False), daemon=True)
    try:
        thread.start()
        assert retried.wait(30)
    finally:
        worker.stop()
        thread.join(30)
        logging.getLogger("pgjobkit.worker").removeHandler(handler)
    assert not thread.is_alive()
    clean()
    store.close()


def test_supabase_refusing_the_key(router: SupabaseRouter, clean: Callable[..., None]) -> None:
    key = f"sb_secret_{SECRET}"  # not the project's: the gateway answers 401
    store = SupabaseStore(BASE_URL, key, realtime=False, origin="SUPABASE_SECRET_KEY (from the environment)")
    exc = raised(store.stats)
    assert isinstance(exc, PermissionDenied) and "HTTP 401" in str(exc)
    assert "SUPABASE_SECRET_KEY (from the environment)" in str(exc)
    clean(exc, store)
    worker = Worker(store, poll_interval=0.05, schedules=False)
    worker.register("t", lambda payload: None)
    clean(raised(lambda: worker.run(install_signals=False)))
    store.close()


def test_an_unreachable_supabase_project(clean: Callable[..., None]) -> None:
    key = f"sb_secret_{SECRET}"
    url = f"http://app:{SECRET}@127.0.0.1:{pgtemplate.free_port()}"
    quick = RetryPolicy(attempts=2, base=0.01, max_total=1.0)
    unreachable = SupabaseStore(url, key, retry=quick, realtime=False)
    exc = raised(unreachable.stats)
    assert isinstance(exc, JobkitError) and "ConnectError" in str(exc)
    clean(exc, unreachable)
    unreachable.close()
