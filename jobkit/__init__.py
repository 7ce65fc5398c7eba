"""jobkit: a Supabase-native job queue on one Postgres table."""

import importlib
from typing import TYPE_CHECKING, Any

from jobkit.core.limits import Limit
from jobkit.core.models import Enqueued, EnqueuedId, Job, JobStatus, NewJob, Stats
from jobkit.core.schedules import Schedule
from jobkit.errors import (
    ConfigurationError,
    InvalidArgument,
    JobkitError,
    JobNotFound,
    LimitReached,
    Permanent,
    PermissionDenied,
    Retry,
    StoreError,
    TransientError,
)
from jobkit.settings import Settings
from jobkit.stores.base import JobStore
from jobkit.stores.base_async import AsyncJobStore
from jobkit.stores.memory import AsyncMemoryStore, MemoryStore
from jobkit.worker import Worker
from jobkit.worker.context import JobContext, current
from jobkit.worker.options import WorkerOptions
from jobkit.worker.results import JobResult, RunSummary, TickResult

if TYPE_CHECKING:
    from jobkit.stores.postgres import AsyncPostgresStore, PostgresStore
    from jobkit.stores.supabase import AsyncSupabaseStore, RetryPolicy, SupabaseStore
    from jobkit.stores.supabase.realtime import JobUpdate
    from jobkit.users import UserJobs
    from jobkit.users_async import AsyncUserJobs
    from jobkit.users_base import UserEnqueued, UserJob

# Imported on first use: psycopg and supabase-py are heavy, and an app needs one of them at most.
_LAZY = {
    "PostgresStore": "jobkit.stores.postgres",
    "AsyncPostgresStore": "jobkit.stores.postgres",
    "SupabaseStore": "jobkit.stores.supabase",
    "AsyncSupabaseStore": "jobkit.stores.supabase",
    "RetryPolicy": "jobkit.stores.supabase",
    "UserJobs": "jobkit.users",
    "AsyncUserJobs": "jobkit.users_async",
    "UserJob": "jobkit.users_base",
    "UserEnqueued": "jobkit.users_base",
    "JobUpdate": "jobkit.stores.supabase.realtime",
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
    "AsyncUserJobs",
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
    "JobUpdate",
    "JobkitError",
    "Limit",
    "LimitReached",
    "MemoryStore",
    "NewJob",
    "Permanent",
    "PermissionDenied",
    "PostgresStore",
    "Retry",
    "RetryPolicy",
    "RunSummary",
    "Schedule",
    "Settings",
    "Stats",
    "StoreError",
    "SupabaseStore",
    "TickResult",
    "TransientError",
    "UserEnqueued",
    "UserJob",
    "UserJobs",
    "Worker",
    "WorkerOptions",
    "current",
]
