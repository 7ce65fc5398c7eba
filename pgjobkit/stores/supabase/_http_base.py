"""HTTP to a Supabase project's API, what the blocking and async clients share: how they retry, and how an
error answer becomes a jobkit exception (``http_async`` builds the async client, ``http`` its blocking twin,
generated from it). Used by the Supabase stores (service key) and UserJobs (user token).

Transient faults are retried by tenacity inside the httpx transport, where the status and ``Retry-After``
are visible: connection errors and timeouts, 408, 429 and every 5xx (PostgREST's own, such as PGRST003
when it found no pool connection in time or 57014 when a statement ran past the role's timeout; a
gateway's 502/504; a proxy's 520/522/524 page). Exponential backoff with full jitter, ``Retry-After``
honoured, bounded in attempts and in total time; other 4xx are never retried. PostgREST runs each request
in one transaction, so a 5xx of its own means nothing was written; a gateway's may follow a commit whose
answer was lost, which is why the stores document what a repeat of each call means.

Every error answer is mapped once, by ``raise_for_answer`` (an httpx response hook), through
``pgjobkit.errors.error_for_http``: supabase-py's ``APIError`` keeps no HTTP status, and a body without a
``code`` would otherwise lose what kind of fault it was.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx
import tenacity
from supabase.lib.client_options import SyncClientOptions

from pgjobkit.errors import JobkitError, PermissionDenied, error_for_http
from supabase import AsyncClientOptions

OptionsT = TypeVar("OptionsT", SyncClientOptions, AsyncClientOptions)
log = logging.getLogger("pgjobkit.stores.supabase.http")
# The latest answer in this thread or task, kept by the response hooks: supabase-py decodes an answer's JSON
# itself, and a RecursionError there loses the text, which the store then reads value by value from here.
last_answer: ContextVar[httpx.Response | None] = ContextVar("jobkit_last_answer", default=None)


def is_transient_status(status: int) -> bool:
    """An answer worth another try: 408, 429 and every 5xx."""
    return status >= 500 or status in (408, 429)


@dataclass(frozen=True)
class RetryPolicy:
    """How transient HTTP faults are retried: at most ``attempts`` tries within ``max_total`` seconds.
    ``sleep`` / ``asleep`` wait between tries (for the blocking and the async client)."""

    attempts: int = 6
    base: float = 0.2
    cap: float = 5.0
    max_total: float = 30.0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    asleep: Callable[[float], Awaitable[None]] = field(default=asyncio.sleep, repr=False)


def retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        return max(0.0, (when - datetime.now(UTC)).total_seconds())


def elapsed(state: tenacity.RetryCallState) -> float:
    # idle_for counts the sleeps asked for, so an injected sleep keeps the budget honest too.
    return max(state.seconds_since_start or 0.0, state.idle_for)


def _retry_after_answer(state: tenacity.RetryCallState) -> float:
    outcome = state.outcome
    if outcome is not None and not outcome.failed:
        return retry_after(outcome.result()) or 0.0
    return 0.0


def retry_arguments(policy: RetryPolicy, request: httpx.Request) -> dict[str, Any]:
    """The tenacity arguments for one request, the same for the blocking and the async transport."""

    def wait(state: tenacity.RetryCallState) -> float:
        delay = random.uniform(0, min(policy.cap, policy.base * 2 ** (state.attempt_number - 1)))
        delay = max(delay, _retry_after_answer(state))
        return max(0.0, min(delay, policy.max_total - elapsed(state)))

    def stop(state: tenacity.RetryCallState) -> bool:
        if state.attempt_number >= policy.attempts:
            return True
        return elapsed(state) + _retry_after_answer(state) >= policy.max_total

    def before_sleep(state: tenacity.RetryCallState) -> None:
        outcome, pause = state.outcome, state.upcoming_sleep
        # The first retry of a request is said; the next ones, a line each a fraction of a second apart,
        # only at DEBUG: a worker waiting out an outage says it once per call, not once per attempt.
        say = log.warning if state.attempt_number == 1 else log.debug
        if outcome is not None and not outcome.failed:
            response: httpx.Response = outcome.result()
            say(
                "jobkit: %s %s answered %d; retrying in %.1fs",
                request.method,
                request.url.path,
                response.status_code,
                pause,
            )
        elif outcome is not None:
            say(
                "jobkit: Supabase at %s unreachable (%s on %s %s); retrying in %.1fs",
                request.url.host,
                type(outcome.exception()).__name__,
                request.method,
                request.url.path,
                pause,
            )

    return {
        "stop": stop,
        "wait": wait,
        "retry": (
            tenacity.retry_if_exception_type(httpx.TransportError)
            | tenacity.retry_if_result(lambda r: is_transient_status(r.status_code))
        ),
        "before_sleep": before_sleep,
        "retry_error_callback": lambda state: state.outcome.result() if state.outcome else None,
        "reraise": True,
    }


_KEY_HELP = (
    "The key lacks the rights for this call: workers and the CLI need the project's secret key "
    "(SUPABASE_SECRET_KEY, sb_secret_..., or the legacy service_role key) and UserJobs the publishable "
    "key plus a signed-in user's access token; check too that jobkit's migration is applied."
)


def error_for_answer(response: httpx.Response) -> JobkitError:
    """The exception for an error answer whose body has been read (see ``error_for_http``)."""
    code: str | None = None
    message = response.reason_phrase or f"HTTP {response.status_code}"
    try:
        body = json.loads(response.content)
    except ValueError:
        body = None  # a gateway's or proxy's page
    if isinstance(body, dict):
        code = body.get("code") if isinstance(body.get("code"), str) else None
        message = str(body.get("message") or message)
    what = response.request.url.path.rsplit("/", 1)[-1]
    text = f"jobkit: {what}: {message} (HTTP {response.status_code}{', ' + code if code else ''})"
    error = error_for_http(response.status_code, code, text)
    return (
        PermissionDenied(f"{text}. {_KEY_HELP}", code=code) if isinstance(error, PermissionDenied) else error
    )


def client_options(cls: type[OptionsT], http: Any, token: str | None) -> OptionsT:
    options = cls(
        auto_refresh_token=False,
        persist_session=False,
        postgrest_client_retry=False,  # jobkit retries, with its own bounds
        httpx_client=http,
    )
    if token:
        options.headers["Authorization"] = f"Bearer {token}"  # beside supabase-py's X-Client-Info
    return options


def client_timeout(seconds: float) -> httpx.Timeout:
    return httpx.Timeout(seconds, connect=min(seconds, 5.0))
