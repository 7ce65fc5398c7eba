"""Settings: names, aliases, .env, one clear error for everything missing or malformed, no secrets shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from pgjobkit import MemoryStore, Worker
from pgjobkit.core.bounds import DEFAULT_BATCH_SIZE, DEFAULT_CONCURRENCY
from pgjobkit.errors import ConfigurationError
from pgjobkit.settings import Settings
from pgjobkit.stores import open_store
from pgjobkit.stores.postgres import PostgresStore
from pgjobkit.stores.supabase import SupabaseStore

ALL = [
    "SUPABASE_URL",
    "SUPABASE_ANON_KEY",
    "SUPABASE_PUBLISHABLE_KEY",
    "SUPABASE_SERVICE_ROLE_KEY",
    "SUPABASE_SECRET_KEY",
    "JOBKIT_DATABASE_URL",
    "JOBKIT_LEASE_SECONDS",
    "JOBKIT_POLL_INTERVAL",
    "JOBKIT_BATCH_SIZE",
    "JOBKIT_CONCURRENCY",
    "JOBKIT_BACKOFF_BASE",
    "JOBKIT_BACKOFF_CAP",
    "JOBKIT_CONNECT_TIMEOUT",
    "JOBKIT_MAX_ROWS",
    "JOBKIT_PREPARE",
    "JOBKIT_DASHBOARD_TOKEN",
    "JOBKIT_STORE",
    "JOBKIT_NATS_URL",
    "JOBKIT_NATS_REPLICAS",
    "JOBKIT_NATS_PARTITIONS",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ALL:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no stray .env


def test_defaults() -> None:
    s = Settings.load(env_file=None)
    assert (s.lease_seconds, s.poll_interval, s.batch_size, s.concurrency) == (
        30,
        1.0,
        DEFAULT_BATCH_SIZE,
        DEFAULT_CONCURRENCY,
    )
    assert (s.backoff_base, s.backoff_cap) == (1.0, 300.0)
    assert s.supabase_url is None and s.url == ""


def test_one_set_of_worker_defaults() -> None:
    s = Settings.load(env_file=None)
    worker = Worker(MemoryStore())
    assert (worker.options.concurrency, worker.options.batch_size) == (s.concurrency, s.batch_size)


def test_reads_env_and_aliases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUPABASE_URL", "https://x.supabase.co/")
    monkeypatch.setenv("SUPABASE_PUBLISHABLE_KEY", "sb_publishable_abc")
    monkeypatch.setenv("SUPABASE_SECRET_KEY", "sb_secret_xyz")
    monkeypatch.setenv("JOBKIT_CONCURRENCY", "8")
    s = Settings.load(env_file=None)
    assert s.url == "https://x.supabase.co"
    assert s.supabase_anon_key is not None and s.supabase_anon_key.get_secret_value() == "sb_publishable_abc"
    assert s.supabase_service_role_key is not None
    assert s.supabase_service_role_key.get_secret_value() == "sb_secret_xyz"
    assert s.concurrency == 8


def test_reads_dotenv(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("JOBKIT_DATABASE_URL=postgresql://u:pw@h/db\nJOBKIT_BATCH_SIZE=50\n")
    s = Settings.load()
    assert s.batch_size == 50
    assert s.database_url is not None and s.database_url.get_secret_value().endswith("@h/db")


def test_secrets_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUPABASE_SERVICE_ROLE_KEY", "super-secret-key")
    monkeypatch.setenv("JOBKIT_DATABASE_URL", "postgresql://u:hunter2@h/db")
    s = Settings.load(env_file=None)
    for text in (repr(s), str(s), str(s.model_dump())):
        assert "super-secret-key" not in text and "hunter2" not in text


def test_malformed_values_are_named_together(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SUPABASE_URL", "not a url")
    monkeypatch.setenv("JOBKIT_CONCURRENCY", "0")
    monkeypatch.setenv("JOBKIT_LEASE_SECONDS", "soon")
    with pytest.raises(ConfigurationError) as info:
        Settings.load(env_file=None)
    text = str(info.value)
    for name in ("SUPABASE_URL", "JOBKIT_CONCURRENCY", "JOBKIT_LEASE_SECONDS", ".env.example"):
        assert name in text


def test_missing_worker_store_names_every_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError) as info:
        Settings.load(env_file=None).require_worker_store()
    for name in ("SUPABASE_URL", "SUPABASE_SECRET_KEY", "JOBKIT_DATABASE_URL"):
        assert name in str(info.value)
    monkeypatch.setenv("SUPABASE_URL", "https://x.supabase.co")
    with pytest.raises(ConfigurationError, match="SUPABASE_SERVICE_ROLE_KEY"):
        Settings.load(env_file=None).require_worker_store()
    with pytest.raises(ConfigurationError, match=r"SUPABASE_PUBLISHABLE_KEY.*SUPABASE_SECRET_KEY"):
        Settings.load(env_file=None).require("supabase_url", "supabase_anon_key", "supabase_service_role_key")


def test_open_store_picks_by_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBKIT_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/none")
    pg = open_store(Settings.load(env_file=None))
    assert isinstance(pg, PostgresStore)  # no connection made yet: the pool opens on first use
    pg.close()
    monkeypatch.delenv("JOBKIT_DATABASE_URL")
    monkeypatch.setenv("SUPABASE_URL", "https://x.supabase.co")
    monkeypatch.setenv("SUPABASE_SERVICE_ROLE_KEY", "sb_secret_x")
    sb = open_store(Settings.load(env_file=None))
    assert isinstance(sb, SupabaseStore)
    sb.close()


def test_jobkit_nats_url_selects_the_jetstream_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """JOBKIT_NATS_URL is the queue, as JOBKIT_DATABASE_URL is: with SUPABASE_URL or JOBKIT_DATABASE_URL
    beside it (the users' side, the projector's database) it still is; JOBKIT_STORE chooses otherwise."""
    monkeypatch.setenv("JOBKIT_NATS_URL", "nats://127.0.0.1:1,nats://127.0.0.1:2")
    assert Settings.load(env_file=None).worker_store() == "jetstream"
    monkeypatch.setenv("JOBKIT_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/none")
    monkeypatch.setenv("SUPABASE_URL", "https://x.supabase.co")
    monkeypatch.setenv("SUPABASE_SERVICE_ROLE_KEY", "sb_secret_x")
    assert Settings.load(env_file=None).worker_store() == "jetstream"
    monkeypatch.setenv("JOBKIT_STORE", "postgres")
    assert Settings.load(env_file=None).worker_store() == "postgres"
    monkeypatch.setenv("JOBKIT_STORE", "jetstream")
    monkeypatch.delenv("JOBKIT_NATS_URL")
    with pytest.raises(ConfigurationError, match=r"JOBKIT_STORE.*needs.*JOBKIT_NATS_URL"):
        Settings.load(env_file=None).worker_store()


def test_a_bad_nats_url_is_one_line_naming_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBKIT_NATS_URL", "http://127.0.0.1:4222")
    with pytest.raises(ConfigurationError, match=r"JOBKIT_NATS_URL.*nats://host:port"):
        open_store(Settings.load(env_file=None))


def test_worker_from_settings_takes_the_tunables(monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    from pgjobkit import Worker

    monkeypatch.setenv("JOBKIT_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/none")
    monkeypatch.setenv("JOBKIT_LEASE_SECONDS", "90")
    monkeypatch.setenv("JOBKIT_CONCURRENCY", "3")
    worker = Worker.from_settings(Settings.load(env_file=None), batch_size=7)
    assert isinstance(worker.store, PostgresStore)
    assert (worker.options.lease, worker.options.concurrency, worker.options.batch_size) == (
        timedelta(seconds=90),
        3,
        7,
    )
    worker.store.close()


def test_env_example_is_a_working_configuration(tmp_path: Path) -> None:
    """The new key kinds `supabase status` prints, and every name in it is one jobkit reads."""
    example = Path(__file__).resolve().parents[2] / ".env.example"
    s = Settings.load(env_file=example)
    assert s.supabase_service_role_key is not None
    assert s.supabase_service_role_key.get_secret_value().startswith("sb_secret_")
    assert s.supabase_anon_key is not None
    assert s.supabase_anon_key.get_secret_value().startswith("sb_publishable_")
    names = {line.split("=", 1)[0].lstrip("# ") for line in example.read_text().splitlines() if "=" in line}
    assert names - {"JOBKIT_DATABASE_URL"} <= set(ALL)


def test_the_dashboard_token_is_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JOBKIT_DASHBOARD_TOKEN", "a-token-of-twenty-chars")
    s = Settings.load(env_file=None)
    assert s.dashboard_token is not None and s.dashboard_token.get_secret_value() == "a-token-of-twenty-chars"
    assert "a-token-of-twenty-chars" not in repr(s) + str(s)


def test_each_value_knows_where_it_came_from(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("SUPABASE_URL=https://x.supabase.co\nSUPABASE_SERVICE_ROLE_KEY=k\n")
    monkeypatch.setenv("jobkit_database_url", "postgresql://h/db")  # names match without regard to case
    monkeypatch.setenv("SUPABASE_SECRET_KEY", "sb_secret_x")  # the environment wins over .env
    s = Settings.load(concurrency=3)
    assert s.origin("supabase_url") == f"SUPABASE_URL (from {tmp_path / '.env'})"
    assert s.origin("database_url") == "JOBKIT_DATABASE_URL (from the environment)"
    assert s.origin("supabase_service_role_key") == "SUPABASE_SECRET_KEY (from the environment)"
    assert s.origin("concurrency") == "concurrency (given to Settings.load)"
    assert s.origin("batch_size") == "JOBKIT_BATCH_SIZE"  # a default: only the name


def test_two_stores_configured_are_refused_until_one_is_chosen(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / ".env").write_text("SUPABASE_URL=http://127.0.0.1:54321\nSUPABASE_SECRET_KEY=sb_secret_x\n")
    monkeypatch.setenv("JOBKIT_DATABASE_URL", "postgresql://postgres@127.0.0.1:1/none")
    with pytest.raises(ConfigurationError) as info:
        open_store(Settings.load())
    assert str(info.value) == (
        f"jobkit: two stores are configured, SUPABASE_URL (from {tmp_path / '.env'}) and JOBKIT_DATABASE_URL "
        "(from the environment): unset one of them, or choose with JOBKIT_STORE=postgres or "
        "JOBKIT_STORE=supabase"
    )
    for choice, kind in (("postgres", PostgresStore), ("supabase", SupabaseStore)):
        monkeypatch.setenv("JOBKIT_STORE", choice)
        store = open_store(Settings.load())
        assert isinstance(store, kind)
        store.close()
    monkeypatch.delenv("JOBKIT_DATABASE_URL")
    monkeypatch.setenv("JOBKIT_STORE", "postgres")
    with pytest.raises(ConfigurationError, match=r"JOBKIT_STORE \(from the environment\) needs a database"):
        Settings.load().worker_store()
    monkeypatch.setenv("JOBKIT_STORE", "nats")
    with pytest.raises(ConfigurationError, match=r"JOBKIT_STORE \(from the environment\): Input should be"):
        Settings.load()


def test_an_unreadable_env_file_is_named(tmp_path: Path) -> None:
    (tmp_path / ".env").write_bytes(b"JOBKIT_CONCURRENCY=\xff\xfe\n")
    with pytest.raises(ConfigurationError, match=r"cannot read the settings file .*\.env"):
        Settings.load()
