"""jobkit: a Supabase-native job queue on one Postgres table."""

from jobkit.errors import (
    ConfigurationError,
    InvalidArgument,
    JobkitError,
    JobNotFound,
    PermissionDenied,
    StoreError,
    TransientError,
)
from jobkit.handlers import JobResult, Permanent, Retry, TickResult
from jobkit.models import Enqueued, Job, JobStatus, NewJob, Stats
from jobkit.stores.memory import MemoryStore
from jobkit.worker import Worker

__all__ = [
    "ConfigurationError",
    "Enqueued",
    "InvalidArgument",
    "Job",
    "JobNotFound",
    "JobResult",
    "JobStatus",
    "JobkitError",
    "MemoryStore",
    "NewJob",
    "Permanent",
    "PermissionDenied",
    "Retry",
    "Stats",
    "StoreError",
    "TickResult",
    "TransientError",
    "Worker",
]
