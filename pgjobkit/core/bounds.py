"""Defaults written once, for every place that offers them: a new job's and a schedule's fields, a worker's
options (``WorkerOptions``), the settings that fill them from the environment (``Settings``) and
``pgjobkit worker``'s flags."""

from __future__ import annotations

DEFAULT_MAX_ATTEMPTS = 3  # attempts of a job before it is dead (the SQL's column default too)
DEFAULT_CONCURRENCY = 50  # jobs in flight at once, chosen by measurement (the README's benchmarks)
DEFAULT_BATCH_SIZE = 50  # jobs claimed per round trip
DEFAULT_POLL_INTERVAL = 1.0  # seconds between claims when no wake-up arrives
DEFAULT_LEASE_SECONDS = 30.0  # the lease of handlers registered without one
DEFAULT_BACKOFF_BASE = 1.0  # seconds before the first retry, doubling after each failure
DEFAULT_BACKOFF_CAP = 300.0  # the longest backoff, in seconds
DEFAULT_JITTER = 0.1  # a backoff is scaled by up to +-this
DEFAULT_SCHEDULES = True  # workers run a scheduler beside them
DEFAULT_BEAT = 10.0  # seconds between a worker's beats (its row in jobkit_workers)
DEFAULT_EMBEDDED_PORT = 54329  # the embedded PostgreSQL of the demo and the tests
