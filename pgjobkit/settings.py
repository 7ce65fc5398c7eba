"""Settings from the environment and ``.env``, read once here and never written back to os.environ."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import AliasChoices, Field, HttpUrl, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from pgjobkit.core import bounds
from pgjobkit.errors import ConfigurationError

_ENV_NAMES: dict[str, str] = {
    "supabase_url": "SUPABASE_URL",
    "supabase_anon_key": "SUPABASE_PUBLISHABLE_KEY (or the legacy SUPABASE_ANON_KEY)",
    "supabase_service_role_key": "SUPABASE_SECRET_KEY (or the legacy SUPABASE_SERVICE_ROLE_KEY)",
    "database_url": "JOBKIT_DATABASE_URL",
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
    "embedded_dir": "JOBKIT_EMBEDDED_DIR",
    "embedded_port": "JOBKIT_EMBEDDED_PORT",
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
    prepare: bool = Field(default=False, validation_alias="JOBKIT_PREPARE")  # PostgresStore(prepare=...)
    embedded_dir: Path | None = Field(default=None, validation_alias="JOBKIT_EMBEDDED_DIR")
    embedded_port: int = Field(
        default=bounds.DEFAULT_EMBEDDED_PORT, ge=1024, le=65535, validation_alias="JOBKIT_EMBEDDED_PORT"
    )

    @classmethod
    def load(cls, env_file: str | Path | None = ".env", **overrides: Any) -> Settings:
        """Read the environment (and ``env_file``); one ConfigurationError lists every malformed variable."""
        try:
            return cls(_env_file=env_file, **overrides)  # type: ignore[call-arg]
        except ValidationError as exc:
            problems = []
            for err in exc.errors():
                field = str(err["loc"][0]) if err["loc"] else "?"
                name = _ENV_NAMES.get(field, field)
                problems.append(f"  {name}: {err['msg']}")
            raise ConfigurationError(
                "jobkit: invalid settings:\n"
                + "\n".join(problems)
                + "\nFix them in the environment or in .env "
                "(see .env.example)."
            ) from None

    @property
    def url(self) -> str:
        """SUPABASE_URL without a trailing slash ('' when unset)."""
        return str(self.supabase_url).rstrip("/") if self.supabase_url else ""

    def require(self, *fields: str) -> None:
        """Raise one ConfigurationError naming every one of ``fields`` that is unset."""
        missing = [_ENV_NAMES[f] for f in fields if getattr(self, f) in (None, "")]
        if missing:
            raise ConfigurationError(
                "jobkit: missing settings: "
                + ", ".join(missing)
                + ". Set them in the environment or in .env "
                "(see .env.example; `supabase status` prints the local values)."
            )

    def require_worker_store(self) -> None:
        """A worker needs SUPABASE_URL + the service-role key, or JOBKIT_DATABASE_URL."""
        if self.supabase_url is not None:
            self.require("supabase_url", "supabase_service_role_key")
        elif self.database_url is None:
            raise ConfigurationError(
                "jobkit: no queue configured: set SUPABASE_URL and SUPABASE_SECRET_KEY (a Supabase "
                "project, through its API) or JOBKIT_DATABASE_URL (a direct Postgres URL), in the environment "
                "or in .env (see .env.example)."
            )
