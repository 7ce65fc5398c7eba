"""jobkit's exceptions: one root, and one table from SQLSTATE / PostgREST code to exception class."""

from __future__ import annotations

from uuid import UUID


class JobkitError(Exception):
    """Root of every error jobkit raises. ``code`` is the SQLSTATE or PostgREST code, when there is one."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
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


class TransientError(JobkitError):
    """A fault worth retrying: lost connection, serialization failure, timeout, 5xx, 429."""


class ConfigurationError(JobkitError):
    """Missing or malformed settings; the message says which and how to set them."""


class StoreError(JobkitError):
    """Any other failure reported by the database or PostgREST."""


# SQLSTATEs raised by jobkit's SQL functions (supabase/migrations/*_jobkit_functions.sql).
SQLSTATE_INVALID_ARGUMENT = "JK001"
SQLSTATE_JOB_NOT_FOUND = "JK002"

_BY_CODE: dict[str, type[JobkitError]] = {
    SQLSTATE_INVALID_ARGUMENT: InvalidArgument,
    SQLSTATE_JOB_NOT_FOUND: JobNotFound,
    "23502": InvalidArgument,  # not_null_violation
    "23503": InvalidArgument,  # foreign_key_violation (e.g. an unknown user_id)
    "23514": InvalidArgument,  # check_violation
    "42501": PermissionDenied,  # insufficient_privilege
    "28000": PermissionDenied,  # invalid_authorization_specification
    "28P01": PermissionDenied,  # invalid_password
    "40001": TransientError,  # serialization_failure
    "40P01": TransientError,  # deadlock_detected
    "55P03": TransientError,  # lock_not_available
    "57014": TransientError,  # query_canceled (statement_timeout)
    "57P01": TransientError,  # admin_shutdown
    "57P02": TransientError,  # crash_shutdown
    "57P03": TransientError,  # cannot_connect_now
    "PGRST000": TransientError,  # PostgREST could not connect to the database
    "PGRST001": TransientError,
    "PGRST002": TransientError,  # schema cache not ready
    "PGRST202": StoreError,  # function not found: migrations not applied?
    "PGRST301": PermissionDenied,  # JWT invalid
    "PGRST302": PermissionDenied,  # anonymous access disabled / no JWT
    "PGRST303": PermissionDenied,  # JWT claims invalid
    # A response whose body is not PostgREST's JSON (a gateway's page) reports its HTTP status as the code.
    "401": PermissionDenied,
    "403": PermissionDenied,
    "408": TransientError,
    "429": TransientError,
    "502": TransientError,
    "503": TransientError,
    "504": TransientError,
}
# Whole SQLSTATE classes, used when the exact code is not listed above.
_BY_CLASS: dict[str, type[JobkitError]] = {
    "08": TransientError,  # connection exception
    "22": InvalidArgument,  # data exception (bad uuid, timestamp, number out of range)
    "53": TransientError,  # insufficient resources
    "58": TransientError,  # system error
}


def error_for(code: str | None, message: str) -> JobkitError:
    """The jobkit exception for a SQLSTATE or PostgREST error code (never parses the message)."""
    if code:
        cls = _BY_CODE.get(code) or _BY_CLASS.get(code[:2])
        if cls is not None:
            return cls(message, code=code)
    return StoreError(message, code=code)
