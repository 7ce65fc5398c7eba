"""jobkit, installed as pgjobkit: a Supabase-native job queue on one jobs table in your own database."""

import importlib
from typing import TYPE_CHECKING, Any

from pgjobkit import _deprecated
from pgjobkit.core.failures import JobTraceback
from pgjobkit.core.limits import Limit
from pgjobkit.core.models import Enqueued, Job, JobStatus, NewJob, Stats
from pgjobkit.core.pipelines import (
    After,
    DependencyResult,
    Pipeline,
    PipelineEnqueued,
    PipelineJob,
    PipelineProgress,
    outcomes,
)
from pgjobkit.core.schedules import Schedule
from pgjobkit.errors import (
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
from pgjobkit.extras import missing
from pgjobkit.settings import Settings
from pgjobkit.stores.base import JobStore
from pgjobkit.stores.base_async import AsyncJobStore
from pgjobkit.stores.memory import AsyncMemoryStore, MemoryStore
from pgjobkit.version import __version__
from pgjobkit.worker import Worker
from pgjobkit.worker.context import JobContext, current
from pgjobkit.worker.options import WorkerOptions
from pgjobkit.worker.results import AttemptReport, RunSummary, TickResult

if TYPE_CHECKING:
    from pgjobkit._users_base import UserEnqueued, UserJob
    from pgjobkit.stores.postgres import AsyncPostgresStore, PostgresStore
    from pgjobkit.stores.supabase import AsyncSupabaseStore, RetryPolicy, SupabaseStore
    from pgjobkit.stores.supabase.realtime import JobUpdate
    from pgjobkit.users import UserJobs
    from pgjobkit.users_async import AsyncUserJobs

# Imported on first use: psycopg and supabase-py are heavy, and an app needs one of them at most.
_LAZY = {
    "PostgresStore": "pgjobkit.stores.postgres",
    "AsyncPostgresStore": "pgjobkit.stores.postgres",
    "SupabaseStore": "pgjobkit.stores.supabase",
    "AsyncSupabaseStore": "pgjobkit.stores.supabase",
    "RetryPolicy": "pgjobkit.stores.supabase",
    "UserJobs": "pgjobkit.users",
    "AsyncUserJobs": "pgjobkit.users_async",
    "UserJob": "pgjobkit._users_base",
    "UserEnqueued": "pgjobkit._users_base",
    "JobUpdate": "pgjobkit.stores.supabase.realtime",
}

_renamed = _deprecated.renamed(__name__, {"JobResult": "pgjobkit:AttemptReport"}, stacklevel=3)


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        return _renamed(name)  # a name before 0.6, with a DeprecationWarning; else AttributeError
    try:
        module = importlib.import_module(_LAZY[name])
    except ModuleNotFoundError as exc:
        hint = missing(exc, name)
        if hint is None:
            raise
        raise ModuleNotFoundError(hint, name=exc.name) from exc
    return getattr(module, name)


__all__ = [
    "After",
    "AsyncJobStore",
    "AsyncMemoryStore",
    "AsyncPostgresStore",
    "AsyncSupabaseStore",
    "AsyncUserJobs",
    "AttemptReport",
    "ConfigurationError",
    "DependencyResult",
    "Enqueued",
    "InvalidArgument",
    "Job",
    "JobContext",
    "JobNotFound",
    "JobStatus",
    "JobStore",
    "JobTraceback",
    "JobUpdate",
    "JobkitError",
    "Limit",
    "LimitReached",
    "MemoryStore",
    "NewJob",
    "Permanent",
    "PermissionDenied",
    "Pipeline",
    "PipelineEnqueued",
    "PipelineJob",
    "PipelineProgress",
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
    "__version__",
    "current",
    "outcomes",
]
