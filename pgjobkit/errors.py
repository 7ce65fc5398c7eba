"""jobkit's exceptions: one root, and one table from SQLSTATE / PostgREST code to exception class."""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

from pgjobkit.redact import redact

MAX_MESSAGE = 2000  # characters of an error's message; a longer one is cut


class JobkitError(Exception):
    """Root of every error jobkit raises. ``code`` is the SQLSTATE or PostgREST code, when there is one.
    The message never holds a password, a secret key or a JWT (``pgjobkit.redact``)."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        message = redact(message)  # a driver's words may quote a URL, password and all
        if len(message) > MAX_MESSAGE:  # what it quotes (PostgreSQL's own messages echo bad input whole)
            message = f"{message[:MAX_MESSAGE]}... ({len(message)} characters, cut)"
        super().__init__(message)
        self.code = code


class InvalidArgument(JobkitError):
    """Bad input: the message names the field and the fix. Nothing was written."""


class JobNotFound(JobkitError):
    """No job with that id."""

    def __init__(self, message: str, *, code: str | None = None, job_id: UUID | None = None) -> None:
        super().__init__(message, code=code)
        self.job_id = job_id


class PermissionDenied(JobkitError):
    """The key or token lacks the rights for this call (e.g. a user token calling a worker RPC)."""


class LimitReached(JobkitError):
    """A limit an operator set was reached (a user's live jobs of a type); try again when some finish."""


class TransientError(JobkitError):
    """A fault worth retrying: lost connection, serialization failure, timeout, 5xx, 429."""


class ConfigurationError(JobkitError):
    """Missing or malformed settings, or a database or project that refuses them (an unknown database, a
    failed authentication); the message says which setting, where it came from, and how to fix it."""


class NotAvailable(ConfigurationError):
    """A call this store cannot do (the JetStream store's limits, say): the message names the call and
    the store."""


class StoreError(JobkitError):
    """Any other failure reported by the database or PostgREST."""


class HandlerSignal(Exception):
    """Raised by a handler to decide its job's fate: ``Retry`` or ``Permanent``."""


class Retry(HandlerSignal):
    """Raise from a handler to retry after ``after`` (default: the backoff schedule)."""

    def __init__(self, message: str = "retry requested", *, after: timedelta | float | None = None) -> None:
        super().__init__(message)
        self.after = timedelta(seconds=after) if isinstance(after, int | float) else after


class Permanent(HandlerSignal):
    """Raise from a handler for a failure no retry can fix: the job goes dead at once."""


# SQLSTATEs raised by jobkit's SQL functions (listed in pgjobkit/sql/schema/00_types.sql).
SQLSTATE_INVALID_ARGUMENT = "JK001"
SQLSTATE_JOB_NOT_FOUND = "JK002"
SQLSTATE_LIMIT_REACHED = "JK003"
SQLSTATE_PROJECTED = "JK004"  # the database is the view of a JetStream queue (its message says what to set)

_NOT_MIGRATED = (
    "jobkit's SQL functions are not in this database, or not with these arguments: apply jobkit's "
    "migration (`pgjobkit init supabase` then `supabase db push`; or `pgjobkit migrate` on a direct URL)"
)
_BY_CODE: dict[str, type[JobkitError]] = {
    SQLSTATE_INVALID_ARGUMENT: InvalidArgument,
    SQLSTATE_JOB_NOT_FOUND: JobNotFound,
    SQLSTATE_LIMIT_REACHED: LimitReached,
    SQLSTATE_PROJECTED: ConfigurationError,
    "23502": InvalidArgument,  # not_null_violation
    "23503": InvalidArgument,  # foreign_key_violation (e.g. an unknown user_id)
    "23514": InvalidArgument,  # check_violation
    "42501": PermissionDenied,  # insufficient_privilege
    "28000": PermissionDenied,  # invalid_authorization_specification
    "28P01": PermissionDenied,  # invalid_password
    "42883": ConfigurationError,  # undefined_function: the migration is missing or outdated
    "42P01": ConfigurationError,  # undefined_table
    "3F000": ConfigurationError,  # invalid_schema_name
    "PGRST000": TransientError,  # PostgREST could not connect to the database
    "PGRST001": TransientError,  # database client error
    "PGRST002": TransientError,  # schema cache not ready
    "PGRST003": TransientError,  # no pool connection in time
    "PGRST202": ConfigurationError,  # function not found: migrations not applied?
    "PGRST301": PermissionDenied,  # JWT invalid
    "PGRST302": PermissionDenied,  # anonymous access disabled / no JWT
    "PGRST303": PermissionDenied,  # JWT claims invalid
}
# Whole SQLSTATE classes, used when the exact code is not listed above. The transient ones are the faults
# that pass: lost connections, serialization failures and deadlocks, exhausted resources, locks not
# available, cancellations (statement_timeout, admin shutdown), system and internal errors. PostgREST
# answers each with a 5xx, so both transports agree.
_BY_CLASS: dict[str, type[JobkitError]] = {
    "08": TransientError,  # connection exception
    "22": InvalidArgument,  # data exception (bad uuid, timestamp, number out of range)
    "40": TransientError,  # transaction rollback: serialization failure, deadlock
    "53": TransientError,  # insufficient resources
    "55": TransientError,  # object not in prerequisite state (lock not available)
    "57": TransientError,  # operator intervention: query canceled, admin shutdown, cannot connect now
    "58": TransientError,  # system error
    "XX": TransientError,  # internal error
}


# The codes that mean jobkit's SQL is not (all) there: a missing function, table or schema.
NOT_MIGRATED = frozenset(
    code for code, cls in _BY_CODE.items() if cls is ConfigurationError and code != SQLSTATE_PROJECTED
)


def _by_code(code: str | None) -> type[JobkitError] | None:
    if not code:
        return None
    return _BY_CODE.get(code) or _BY_CLASS.get(code[:2])


def error_for(code: str | None, message: str) -> JobkitError:
    """The jobkit exception for a SQLSTATE or PostgREST error code (never parses the message)."""
    cls = _by_code(code) or StoreError
    if code in NOT_MIGRATED:
        message = f"{message}. {_NOT_MIGRATED}"
    return cls(message, code=code)


def error_for_http(status: int, code: str | None, message: str) -> JobkitError:
    """The jobkit exception for an HTTP error answer: every 5xx (PostgREST's own with or without a code, a
    gateway's, a proxy's page) and 408 / 429 are transient; below that the code decides, then the status
    (401 / 403 are a key's or token's rights, whether or not the body carries a code)."""
    if status >= 500 or status in (408, 429):
        return TransientError(message, code=code)
    if _by_code(code) is not None:
        return error_for(code, message)
    if status in (401, 403):
        return PermissionDenied(message, code=code)
    return StoreError(message, code=code)
