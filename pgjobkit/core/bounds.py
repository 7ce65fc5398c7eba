"""Every default and every cap, written once for every place that offers or checks them: a new job's and a
schedule's fields, a worker's options (``WorkerOptions``), the settings that fill them from the environment
(``Settings``) and ``pgjobkit worker``'s flags; and the bounds the SQL holds (its domains, CHECKs and
per-call limits), which Python checks early and the MemoryStore checks as the SQL does.
tests/sql/test_literals.py holds each cap equal to the schema's literal."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

# --- defaults ---------------------------------------------------------------------------------------------
DEFAULT_MAX_ATTEMPTS = 3  # attempts of a job before it is dead (the SQL's column default too)
DEFAULT_CONCURRENCY = 50  # jobs in flight at once, chosen by measurement (the README's benchmarks)
DEFAULT_BATCH_SIZE = 50  # jobs claimed per round trip
DEFAULT_POLL_INTERVAL = 1.0  # seconds between claims when no wake-up arrives
DEFAULT_LEASE_SECONDS = 30.0  # the lease of handlers registered without one
DEFAULT_BACKOFF_BASE = 1.0  # seconds before the first retry, doubling after each failure
DEFAULT_BACKOFF_CAP = 300.0  # the longest backoff, in seconds
DEFAULT_JITTER = 0.1  # a backoff is scaled by up to +-this
DEFAULT_SCHEDULES = True  # workers run a scheduler beside them
DEFAULT_BEAT = 10.0  # seconds between a worker's reports (jobkit_worker_beat: its row in jobkit_workers)
DEFAULT_STALE_SECONDS = 60.0  # a worker silent this long is listed stale (jobkit_list_workers' default)
DEFAULT_PRUNE_LIMIT = 10_000  # jobs one prune deletes at most (jobkit_prune's default)
DEFAULT_EMBEDDED_PORT = 54329  # the embedded PostgreSQL of the demo and the tests

# --- a job's fields (the SQL's domains, 00_types.sql, and jobkit_check_jobs) ---------------------------------
MAX_TYPE_LENGTH = 200  # characters of a job type (jobkit_type)
MAX_KEY_LENGTH = 200  # characters of an idempotency key or fair key (jobkit_key, jobkit_fair_key)
MAX_WORKER_LENGTH = 200  # characters of a worker's name (jobkit_worker)
MAX_ERROR_LENGTH = 4000  # characters of a job's one-line error (jobkit_error)
MAX_PRIORITY = 1_000_000  # priorities run from -MAX_PRIORITY to MAX_PRIORITY (jobkit_priority)
MAX_ATTEMPTS_LIMIT = 1000  # the largest max_attempts (jobkit_max_attempts)
MAX_PAYLOAD_BYTES = 1_048_576  # a payload, as PostgreSQL prints jsonb
MAX_RESULT_BYTES = 65_536  # a job's result, as PostgreSQL prints jsonb (jobkit_result)
MAX_PROGRESS_MESSAGE = 200  # characters of a progress message (jobkit_progress_message)
MAX_TRACE_CONTEXT_BYTES = 1024  # a job's trace context, as PostgreSQL prints jsonb (jobkit_trace_context)
MAX_TRACEBACK_LENGTH = 8000  # characters of a kept traceback (the CHECK on jobkit_tracebacks.traceback)
MAX_DELAY_SECONDS = 315_576_000  # the longest delay_seconds: ten years of 365.25 days
# What every client can read back from a payload or result (the SQL domains jobkit_payload and
# jobkit_result hold the same): containers nested at most MAX_JSON_DEPTH deep, numbers within a double's
# range, written as the SQL writes it (1.7976931348623157e308: every finite float's shortest repr is within).
MAX_JSON_DEPTH = 100  # levels of nested containers
MAX_JSON_NUMBER = 17976931348623157 * 10**292  # the largest number's magnitude (a double's)
# run_after (the SQL check jobkit_run_after_between_1970_and_9999): a time every client's date type holds,
# in any time zone
RUN_AFTER_RANGE = (datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC))

# --- per call ----------------------------------------------------------------------------------------------
MAX_NATS_PARTITIONS = 64  # JOBKIT_NATS_PARTITIONS: streams of one JetStream queue
MAX_ROWS = 1000  # PostgREST's max-rows on Supabase; no jobkit SQL function returns more in one call
CLAIM_LIMIT_CAP = 999  # jobs one claim takes: below PostgREST's 1000-row cap
BATCH_LIMIT = 10_000  # jobs one enqueue_many or enqueue_pipeline takes
MAX_LEASE = timedelta(days=1)  # the longest lease a claim or heartbeat gives
MAX_RETRY_DELAY = timedelta(
    seconds=31_557_600
)  # the longest retry delay jobkit_fail takes: a year of 365.25 days
MAX_DEPENDENCIES = 10_000  # jobs one pipeline job waits for
MAX_EDGES = 100_000  # dependencies of all the jobs of one pipeline call
MAX_REF_LENGTH = 200  # characters of a pipeline job's ref
PASS_BUDGET = 1000  # rows of keys at their cap one claim passes over (jobkit_claim)
MAX_FIRE = 1000  # due times one jobkit_fire_schedule takes
MAX_STARTS = 100_000  # starts per window a rate limit may allow (a claim counts the window's starts)
MAX_RUNNING = 1_000_000  # the largest max_running or max_running_per_key of a type's limits
MAX_RATE_WINDOW = timedelta(days=1)  # the longest window (per) of a rate limit
ACTIVITY_KEPT = timedelta(days=1)  # how long the beats keep activity minutes and trace contexts
MAX_STALE_SECONDS = 86_400  # the longest a worker may stay silent before it is stale (jobkit_worker_beat)
MAX_WORKER_TYPES = 1000  # job types a worker's row lists (jobkit_workers.types)
MAX_HOST_LENGTH = 200  # characters of a worker's host kept (jobkit_worker_beat cuts the rest)
MAX_VERSION_LENGTH = 50  # characters of a worker's version kept (jobkit_worker_beat cuts the rest)
