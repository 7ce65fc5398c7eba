"""Settings from the environment and ``.env``, read once here and never written back to os.environ. Each
value knows where it came from (``Settings.origin``), so that every error about it says so."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from dotenv import dotenv_values
from pydantic import AliasChoices, Field, HttpUrl, PrivateAttr, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from pgjobkit.core import bounds
from pgjobkit.errors import ConfigurationError
from pgjobkit.redact import redact

_ENV_NAMES: dict[str, str] = {
    "supabase_url": "SUPABASE_URL",
    "supabase_anon_key": "SUPABASE_PUBLISHABLE_KEY (or the legacy SUPABASE_ANON_KEY)",
    "supabase_service_role_key": "SUPABASE_SECRET_KEY (or the legacy SUPABASE_SERVICE_ROLE_KEY)",
    "database_url": "JOBKIT_DATABASE_URL",
    "store": "JOBKIT_STORE",
    "lease_seconds": "JOBKIT_LEASE_SECONDS",
    "poll_interval": "JOBKIT_POLL_INTERVAL",
    "batch_size": "JOBKIT_BATCH_SIZE",
    "concurrency": "JOBKIT_CONCURRENCY",
    "backoff_base": "JOBKIT_BACKOFF_BASE",
    "backoff_cap": "JOBKIT_BACKOFF_CAP",
    "jitter": "JOBKIT_JITTER",
    "connect_timeout": "JOBKIT_CONNECT_TIMEOUT",
    "max_rows": "JOBKIT_MAX_ROWS",
    "realtime": "JOBKIT_REALTIME",
    "schedules": "JOBKIT_SCHEDULES",
    "prepare": "JOBKIT_PREPARE",
    "dashboard_token": "JOBKIT_DASHBOARD_TOKEN",
    "dashboard_allowed_hosts": "JOBKIT_DASHBOARD_ALLOWED_HOSTS",
    "embedded_dir": "JOBKIT_EMBEDDED_DIR",
    "embedded_port": "JOBKIT_EMBEDDED_PORT",
    "nats_url": "JOBKIT_NATS_URL",
    "nats_replicas": "JOBKIT_NATS_REPLICAS",
    "nats_partitions": "JOBKIT_NATS_PARTITIONS",
}


class Settings(BaseSettings):
    """jobkit's configuration. Secrets are SecretStr: they never appear in reprs, logs or errors."""

    model_config = SettingsConfigDict(
        env_file=".env", env_file_encoding="utf-8", extra="ignore", populate_by_name=True, frozen=True
    )

    supabase_url: HttpUrl | None = Field(default=None, validation_alias="SUPABASE_URL")
    supabase_anon_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("SUPABASE_PUBLISHABLE_KEY", "SUPABASE_ANON_KEY")
    )
    supabase_service_role_key: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("SUPABASE_SECRET_KEY", "SUPABASE_SERVICE_ROLE_KEY")
    )
    database_url: SecretStr | None = Field(default=None, validation_alias="JOBKIT_DATABASE_URL")
    # Which store a worker or the CLI opens when both SUPABASE_URL and JOBKIT_DATABASE_URL are set (an app
    # may keep SUPABASE_URL for UserJobs while its worker takes the direct URL); JOBKIT_NATS_URL, when set,
    # is the queue unless this names another.
    store: Literal["postgres", "supabase", "jetstream"] | None = Field(
        default=None, validation_alias="JOBKIT_STORE"
    )
    lease_seconds: float = Field(
        default=bounds.DEFAULT_LEASE_SECONDS, gt=0, le=86400, validation_alias="JOBKIT_LEASE_SECONDS"
    )
    poll_interval: float = Field(
        default=bounds.DEFAULT_POLL_INTERVAL, gt=0, le=3600, validation_alias="JOBKIT_POLL_INTERVAL"
    )
    batch_size: int = Field(
        default=bounds.DEFAULT_BATCH_SIZE, ge=1, le=999, validation_alias="JOBKIT_BATCH_SIZE"
    )
    concurrency: int = Field(
        default=bounds.DEFAULT_CONCURRENCY, ge=1, le=10_000, validation_alias="JOBKIT_CONCURRENCY"
    )
    backoff_base: float = Field(
        default=bounds.DEFAULT_BACKOFF_BASE, gt=0, validation_alias="JOBKIT_BACKOFF_BASE"
    )
    backoff_cap: float = Field(
        default=bounds.DEFAULT_BACKOFF_CAP, gt=0, validation_alias="JOBKIT_BACKOFF_CAP"
    )
    jitter: float = Field(default=bounds.DEFAULT_JITTER, ge=0, le=1, validation_alias="JOBKIT_JITTER")
    connect_timeout: float = Field(default=10.0, gt=0, le=600, validation_alias="JOBKIT_CONNECT_TIMEOUT")
    max_rows: int = Field(default=1000, ge=2, validation_alias="JOBKIT_MAX_ROWS")
    realtime: bool = Field(default=True, validation_alias="JOBKIT_REALTIME")
    schedules: bool = Field(default=bounds.DEFAULT_SCHEDULES, validation_alias="JOBKIT_SCHEDULES")
    dashboard_token: SecretStr | None = Field(default=None, validation_alias="JOBKIT_DASHBOARD_TOKEN")
    # more hosts the dashboard answers to, comma-separated host or host:port (pgjobkit dashboard reads them)
    dashboard_allowed_hosts: str = Field(default="", validation_alias="JOBKIT_DASHBOARD_ALLOWED_HOSTS")
    prepare: bool = Field(default=False, validation_alias="JOBKIT_PREPARE")  # PostgresStore(prepare=...)
    embedded_dir: Path | None = Field(default=None, validation_alias="JOBKIT_EMBEDDED_DIR")
    embedded_port: int = Field(
        default=bounds.DEFAULT_EMBEDDED_PORT, ge=1024, le=65535, validation_alias="JOBKIT_EMBEDDED_PORT"
    )
    # the JetStream store (pgjobkit.stores.jetstream): comma-separated server URLs, the streams' replicas
    # (default: 3 on a cluster, 1 on a single server), and the queue's partitions (fixed at its creation)
    nats_url: str | None = Field(default=None, validation_alias="JOBKIT_NATS_URL")
    nats_replicas: int | None = Field(default=None, ge=1, le=5, validation_alias="JOBKIT_NATS_REPLICAS")
    nats_partitions: int = Field(
        default=1, ge=1, le=bounds.MAX_NATS_PARTITIONS, validation_alias="JOBKIT_NATS_PARTITIONS"
    )

    _origins: dict[str, str] = PrivateAttr(default_factory=dict)

    @classmethod
    def load(cls, env_file: str | Path | None = ".env", **overrides: Any) -> Settings:
        """Read the environment (and ``env_file``); one ConfigurationError names every malformed variable
        and where it came from."""
        origins = _origins(env_file, overrides)
        try:
            settings = cls(_env_file=env_file, **overrides)  # type: ignore[call-arg]
        except ValidationError as exc:
            problems = []
            for err in exc.errors():
                name = str(err["loc"][0]) if err["loc"] else "?"  # the alias the value came under
                field = _FIELD_OF.get(name.lower(), name)
                problems.append(f"{origins.get(field) or _ENV_NAMES.get(field, name)}: {err['msg']}")
            raise ConfigurationError(
                "jobkit: invalid settings: " + "; ".join(problems) + ". Fix them there (see .env.example)."
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(
                f"jobkit: cannot read the settings file {_shown(env_file)} ({exc}): fix it, or pass another "
                "with --env-file"
            ) from None
        settings._origins = origins
        return settings

    def origin(self, field: str) -> str:
        """The variable that set ``field`` and where it came from: ``JOBKIT_DATABASE_URL (from the
        environment)``, ``SUPABASE_URL (from /app/.env)``; the variable's name alone when not known."""
        return self._origins.get(field) or _ENV_NAMES[field]

    @property
    def url(self) -> str:
        """SUPABASE_URL without a trailing slash ('' when unset)."""
        return str(self.supabase_url).rstrip("/") if self.supabase_url else ""

    def require(self, *fields: str, why: str = "") -> None:
        """Raise one ConfigurationError naming every one of ``fields`` that is unset (``why``: what needs
        them, said first)."""
        missing = [_ENV_NAMES[f] for f in fields if getattr(self, f) in (None, "")]
        if missing:
            raise ConfigurationError(
                "jobkit: "
                + (f"{why}; " if why else "")
                + "missing settings: "
                + ", ".join(missing)
                + ". Set them in the environment or in .env "
                "(see .env.example; `supabase status` prints the local values)."
            )

    def view_store(self) -> Literal["postgres", "supabase"]:
        """The database a JetStream queue's jobs are projected into (``pgjobkit nats project``): the direct
        URL (JOBKIT_DATABASE_URL) when it is set, else the Supabase project (SUPABASE_URL and its secret
        key)."""
        if self.database_url is not None:
            return "postgres"
        if self.supabase_url is None:
            raise ConfigurationError(
                "jobkit: the projection needs the users' database: set JOBKIT_DATABASE_URL (a direct "
                "Postgres URL) or SUPABASE_URL and SUPABASE_SECRET_KEY, beside JOBKIT_NATS_URL"
            )
        self.require(
            "supabase_url", "supabase_service_role_key", why="the projection writes as the service role"
        )
        return "supabase"

    def worker_store(self) -> Literal["postgres", "supabase", "jetstream"]:
        """The store a worker or the CLI opens, every setting it needs checked: the JetStream cluster
        (JOBKIT_NATS_URL, the queue whatever else is set: SUPABASE_URL and JOBKIT_DATABASE_URL are then the
        users' side), the Supabase project (SUPABASE_URL and its secret key) or the direct URL
        (JOBKIT_DATABASE_URL); JOBKIT_STORE chooses otherwise."""
        if self.store == "jetstream" or (self.store is None and self.nats_url):
            self.require("nats_url", why=f"{self.origin('store')} needs the cluster" if self.store else "")
            return "jetstream"
        if self.store == "supabase" or (self.store is None and self.supabase_url is not None):
            if self.store is None and self.database_url is not None:
                raise ConfigurationError(
                    f"jobkit: two stores are configured, {self.origin('supabase_url')} and "
                    f"{self.origin('database_url')}: unset one of them, or choose with JOBKIT_STORE=postgres "
                    "or JOBKIT_STORE=supabase"
                )
            why = f"{self.origin('store')} needs the project" if self.store else ""
            if not why and self.supabase_service_role_key is None:
                why = f"{self.origin('supabase_url')} needs the project's secret key"
            self.require("supabase_url", "supabase_service_role_key", why=why)
            return "supabase"
        if self.store == "postgres":
            self.require("database_url", why=f"{self.origin('store')} needs a database URL")
            return "postgres"
        if self.database_url is None:
            raise ConfigurationError(
                "jobkit: no queue configured: set SUPABASE_URL and SUPABASE_SECRET_KEY (a Supabase "
                "project, through its API) or JOBKIT_DATABASE_URL (a direct Postgres URL), in the environment "
                "or in .env (see .env.example)."
            )
        return "postgres"

    def require_worker_store(self) -> None:
        """``worker_store()``, for its checks alone."""
        self.worker_store()

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # SecretStr fields show as '**********'; a URL may still carry a password in its userinfo
        for name, value in super().__repr_args__():
            yield name, redact(str(value)) if isinstance(value, HttpUrl) else value


def _shown(env_file: str | Path | None) -> str:
    return str(Path(env_file).expanduser().resolve()) if env_file is not None else "(none)"


def _aliases(field: str) -> list[str]:
    alias = Settings.model_fields[field].validation_alias
    if isinstance(alias, AliasChoices):
        return [str(choice) for choice in alias.choices]
    return [str(alias)] if alias else [field]


_FIELD_OF = {alias.lower(): field for field in Settings.model_fields for alias in (field, *_aliases(field))}


def _origins(env_file: str | Path | None, overrides: dict[str, Any]) -> dict[str, str]:
    """Where each field's value comes from, as pydantic-settings decides it: given to ``load``, else the
    environment (names matched without regard to case), else the .env file; the first alias found wins."""
    environ = {name.lower() for name in os.environ}
    path = Path(env_file).expanduser() if env_file is not None else None
    try:
        dotenv = {name.lower() for name in dotenv_values(path)} if path and path.is_file() else set()
    except (OSError, UnicodeDecodeError):
        dotenv = set()  # load() says what is wrong with the file
    origins: dict[str, str] = {}
    for field in Settings.model_fields:
        aliases = _aliases(field)
        given = next((a for a in (field, *aliases) if a in overrides), None)
        in_env = next((a for a in aliases if a.lower() in environ), None)
        in_file = next((a for a in aliases if a.lower() in dotenv), None)
        if given is not None:
            origins[field] = f"{given} (given to Settings.load)"
        elif in_env is not None:
            origins[field] = f"{in_env} (from the environment)"
        elif in_file is not None:
            origins[field] = f"{in_file} (from {_shown(path)})"
    return origins
