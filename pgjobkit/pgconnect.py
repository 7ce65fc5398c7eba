"""A first connection to PostgreSQL (a store's, ``pgjobkit migrate``'s), its failures told apart: a
configuration error (a malformed URL, options libpq rejects, an unknown database, a failed authentication,
options the server rejects) from a network fault (refused, timed out, a host that does not resolve, a
server starting up or out of connection slots). The first is raised at once, naming the setting, where it
came from and the fix; the second is tried again until the time is up, said once in the log.

libpq gives no SQLSTATE for a connection the server refused (psycopg's ``OperationalError.sqlstate`` is None
there), so the server's own words tell the refusals apart, as they read in English; anything else, such as
a server that speaks another language, is taken as a network fault: waited out, as before, and said in
the log with its cause. Beside the layers (``pgjobkit.migrate`` uses it too); the async store runs it in a
thread, as it runs its other direct connection attempt.
"""

from __future__ import annotations

import logging
import math
import re
import time
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgjobkit.errors import ConfigurationError, TransientError
from pgjobkit.redact import conninfo_secrets, redact

log = logging.getLogger("pgjobkit.pgconnect")
WARN_AFTER = 1.0  # seconds of failed attempts before the log says why (as the stores' pool waits do)

_SYNTAX = (
    "write it as postgresql://HOST:PORT/DATABASE with USER:PASSWORD@ before the host (special characters "
    "in the password percent-encoded, e.g. @ as %40)"
)
# What the server said -> (its SQLSTATE, the fix). Checked in order.
_REFUSALS: list[tuple[re.Pattern[str], str, str]] = [
    (
        re.compile(r'database ".*" does not exist'),
        "3D000",
        "fix the database name in the URL, or create that database",
    ),
    (
        re.compile(r"password authentication failed|no password supplied|password is required"),
        "28P01",
        "fix the user name or the password in the URL",
    ),
    (
        re.compile(
            r'role ".*" does not exist|authentication failed for user|no pg_hba\.conf entry|'
            r"pg_hba\.conf rejects|is not permitted to log in"
        ),
        "28000",
        "fix the user name in the URL, or let that user connect (pg_hba.conf, the role's LOGIN)",
    ),
    (
        re.compile(r"permission denied for database"),
        "42501",
        "connect to a database that user may use, or grant it CONNECT",
    ),
    (
        re.compile(r"is not currently accepting connections"),
        "55000",
        "connect to another database, or allow connections to it (ALTER DATABASE ... ALLOW_CONNECTIONS)",
    ),
    (
        re.compile(r"unrecognized configuration parameter"),
        "42704",
        "fix the options in the URL",
    ),
    (
        re.compile(
            r"invalid value for parameter|parameter .* cannot be (?:changed|set)|invalid command-line argument"
        ),
        "22023",
        "fix the options in the URL",
    ),
    (
        re.compile(r"server does not support SSL, but SSL was required|SSL is not enabled on the server"),
        "08P01",
        "fix sslmode in the URL (the server does not do SSL)",
    ),
]


def _what(origin: str | None) -> str:
    return origin or "the database URL"


def _one_line(text: str) -> str:
    return "; ".join(" ".join(part.split()) for part in text.splitlines() if part.strip())


def check_conninfo(conninfo: str, origin: str | None = None) -> None:
    """Raise ConfigurationError when libpq cannot read ``conninfo`` (no password in the message)."""
    try:
        conninfo_to_dict(conninfo)
    except psycopg.Error as exc:
        reason = redact(_one_line(str(exc)), conninfo_secrets(conninfo))
        raise ConfigurationError(
            f"jobkit: {_what(origin)} is not a valid PostgreSQL URL ({reason}): {_SYNTAX}"
        ) from None


def failure(exc: psycopg.Error, conninfo: str, origin: str | None) -> ConfigurationError | str:
    """What a failed connection attempt means: a ConfigurationError to raise at once, or (a network fault)
    its cause, to say while waiting and in ``timed_out``'s error when the time is up."""
    text = redact(_one_line(str(exc)), conninfo_secrets(conninfo))
    if text.startswith("connection is bad:"):  # libpq refused the options before any I/O
        reason = text.removeprefix("connection is bad:").strip()
        return ConfigurationError(f"jobkit: {_what(origin)} is not usable ({reason}): fix it in the URL")
    reason = text.removeprefix("connection failed:").strip()
    for pattern, code, fix in _REFUSALS:
        if pattern.search(reason):
            return ConfigurationError(
                f"jobkit: the server refused {_what(origin)}: {reason} (SQLSTATE {code}): {fix}", code=code
            )
    return reason


def waiting(cause: str, origin: str | None) -> str:
    """The log line while a network fault is waited out."""
    return f"jobkit: {_what(origin)} is unreachable ({cause}); waiting for it"


def timed_out(cause: str, origin: str | None, timeout: float) -> TransientError:
    """The error once ``timeout`` seconds of attempts met only network faults."""
    return TransientError(
        f"jobkit: database connection failed: {_what(origin)} is unreachable ({cause}), for {timeout:g} s: "
        "check that the server runs at that host and port, or allow it longer (JOBKIT_CONNECT_TIMEOUT, a "
        "store's timeout)"
    )


def attempt_options(conninfo: str, deadline: float) -> dict[str, Any]:
    """The ``connect_timeout`` of one attempt: what is left before ``deadline`` (libpq's least is 2 s),
    unless the URL sets its own."""
    if "connect_timeout" in conninfo_to_dict(conninfo):
        return {}
    return {"connect_timeout": max(2, math.ceil(deadline - time.monotonic()))}


def connect_first(
    conninfo: str, *, timeout: float, origin: str | None = None, warn: bool = True, **kwargs: Any
) -> psycopg.Connection[Any]:
    """A first connection to ``conninfo`` (``kwargs`` go to psycopg's connect): a configuration error
    raises ConfigurationError at once; a network fault is tried again for ``timeout`` seconds, said in the
    log once after a second (``warn``), then raises TransientError. No message holds the password, and
    none chains psycopg's error, which may."""
    check_conninfo(conninfo, origin)
    started = time.monotonic()
    deadline, delay = started + timeout, 0.1
    while True:
        try:
            return psycopg.Connection.connect(conninfo, **attempt_options(conninfo, deadline), **kwargs)
        except psycopg.Error as exc:
            cause = failure(exc, conninfo, origin)
        if isinstance(cause, ConfigurationError):
            raise cause
        if time.monotonic() + delay >= deadline:
            raise timed_out(cause, origin, timeout)
        if warn and time.monotonic() - started >= WARN_AFTER:
            log.warning("%s", waiting(cause, origin))
            warn = False
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def reach(conninfo: str, *, timeout: float, origin: str | None = None, warn: bool = True) -> None:
    """``connect_first``, then close the connection: the server takes this URL."""
    connect_first(conninfo, timeout=timeout, origin=origin, warn=warn).close()
