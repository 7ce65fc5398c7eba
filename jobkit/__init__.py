"""jobkit: a Supabase-native job queue on one Postgres table."""

import importlib
from typing import TYPE_CHECKING, Any

from jobkit.errors import (
    ConfigurationError,
    InvalidArgument,
    JobkitError,
    JobNotFound,
    LimitReached,
    PermissionDenied,
    StoreError,
    TransientError,
)
from jobkit.handlers import JobContext, JobResult, Permanent, Retry, RunSummary, TickResult, current
from jobkit.models import Enqueued, EnqueuedId, Job, JobStatus, NewJob, Stats
from jobkit.stores.base import AsyncJobStore, JobStore
from jobkit.stores.memory import AsyncMemoryStore, MemoryStore
from jobkit.worker import Worker

if TYPE_CHECKING:
    from jobkit.stores.postgres import AsyncPostgresStore, PostgresStore
    from jobkit.stores.supabase import AsyncSupabaseStore, SupabaseStore

# Imported on first use: psycopg and supabase-py are heavy, and an app needs one of them at most.
_LAZY = {
    "PostgresStore": "jobkit.stores.postgres",
    "AsyncPostgresStore": "jobkit.stores.postgres",
    "SupabaseStore": "jobkit.stores.supabase",
    "AsyncSupabaseStore": "jobkit.stores.supabase",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'jobkit' has no attribute {name!r}")


__all__ = [
    "AsyncJobStore",
    "AsyncMemoryStore",
    "AsyncPostgresStore",
    "AsyncSupabaseStore",
    "ConfigurationError",
    "Enqueued",
    "EnqueuedId",
    "InvalidArgument",
    "Job",
    "JobContext",
    "JobNotFound",
    "JobResult",
    "JobStatus",
    "JobStore",
    "JobkitError",
    "LimitReached",
    "MemoryStore",
    "NewJob",
    "Permanent",
    "PermissionDenied",
    "PostgresStore",
    "Retry",
    "RunSummary",
    "Stats",
    "StoreError",
    "SupabaseStore",
    "TickResult",
    "TransientError",
    "Worker",
    "current",
]
