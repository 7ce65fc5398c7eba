"""HTTP to a Supabase project's API: the supabase-py client jobkit builds, how it retries, and how an error
answer becomes a jobkit exception. Shared by SupabaseStore (service key) and UserJobs (user token).

Transient faults are retried by tenacity inside the httpx transport, where the status and ``Retry-After``
are visible: connection errors and timeouts, 408, 429 and every 5xx (PostgREST's own, such as PGRST003
when it found no pool connection in time or 57014 when a statement ran past the role's timeout; a
gateway's 502/504; a proxy's 520/522/524 page). Exponential backoff with full jitter, ``Retry-After``
honoured, bounded in attempts and in total time; other 4xx are never retried. PostgREST runs each request
in one transaction, so a 5xx of its own means nothing was written; a gateway's may follow a commit whose
answer was lost, which is why the stores document what a repeat of each call means.

Every error answer is mapped once, by ``raise_for_answer`` (an httpx response hook), through
``jobkit.errors.error_for_http``: supabase-py's ``APIError`` keeps no HTTP status, and a body without a
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

from jobkit.errors import JobkitError, PermissionDenied, error_for_http
from supabase import AsyncClient, AsyncClientOptions, Client, acreate_client, create_client

log = logging.getLogger("jobkit.http")
# The latest answer in this thread or task, kept by the response hooks: supabase-py decodes an answer's JSON
# itself, and a RecursionError there loses the text, which the store then reads leniently from here.
last_answer: ContextVar[httpx.Response | None] = ContextVar("jobkit_last_answer", default=None)
OptionsT = TypeVar("OptionsT", SyncClientOptions, AsyncClientOptions)


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


def _retry_after(response: httpx.Response) -> float | None:
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


def _elapsed(state: tenacity.RetryCallState) -> float:
    # idle_for counts the sleeps asked for, so an injected sleep keeps the budget honest too.
    return max(state.seconds_since_start or 0.0, state.idle_for)


def _answer_retry_after(state: tenacity.RetryCallState) -> float:
    outcome = state.outcome
    if outcome is not None and not outcome.failed:
        return _retry_after(outcome.result()) or 0.0
    return 0.0


def _retrying(policy: RetryPolicy, request: httpx.Request) -> dict[str, Any]:
    """The tenacity arguments for one request, the same for the blocking and the async transport."""

    def wait(state: tenacity.RetryCallState) -> float:
        delay = random.uniform(0, min(policy.cap, policy.base * 2 ** (state.attempt_number - 1)))
        delay = max(delay, _answer_retry_after(state))
        return max(0.0, min(delay, policy.max_total - _elapsed(state)))

    def stop(state: tenacity.RetryCallState) -> bool:
        if state.attempt_number >= policy.attempts:
            return True
        return _elapsed(state) + _answer_retry_after(state) >= policy.max_total

    def before_sleep(state: tenacity.RetryCallState) -> None:
        outcome, pause = state.outcome, state.upcoming_sleep
        if outcome is not None and not outcome.failed:
            response: httpx.Response = outcome.result()
            log.warning(
                "jobkit: %s %s answered %d; retrying in %.1fs",
                request.method,
                request.url.path,
                response.status_code,
                pause,
            )
        elif outcome is not None:
            log.warning(
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


class RetryingTransport(httpx.BaseTransport):
    """An httpx transport that retries transient faults of the one it wraps (see module doc)."""

    def __init__(self, inner: httpx.BaseTransport, policy: RetryPolicy) -> None:
        self._inner, self._policy = inner, policy

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()  # the body is sent again on a retry

        def attempt() -> httpx.Response:
            response = self._inner.handle_request(request)
            if is_transient_status(response.status_code):
                response.read()  # so that a retried answer can be closed and a final one still read
                response.close()
            return response

        retrying = tenacity.Retrying(sleep=self._policy.sleep, **_retrying(self._policy, request))
        response: httpx.Response = retrying(attempt)
        return response

    def close(self) -> None:
        self._inner.close()


class AsyncRetryingTransport(httpx.AsyncBaseTransport):
    """RetryingTransport for httpx's async client, with tenacity's async retrying."""

    def __init__(self, inner: httpx.AsyncBaseTransport, policy: RetryPolicy) -> None:
        self._inner, self._policy = inner, policy

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await request.aread()

        async def attempt() -> httpx.Response:
            response = await self._inner.handle_async_request(request)
            if is_transient_status(response.status_code):
                await response.aread()
                await response.aclose()
            return response

        retrying = tenacity.AsyncRetrying(sleep=self._policy.asleep, **_retrying(self._policy, request))
        response: httpx.Response = await retrying(attempt)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


_KEY_HELP = (
    "The key lacks the rights for this call: workers and the CLI need the project's secret key "
    "(SUPABASE_SECRET_KEY, sb_secret_..., or the legacy service_role key) and UserJobs the publishable "
    "key plus a signed-in user's access token; check too that jobkit's migration is applied."
)


def _error_for_answer(response: httpx.Response) -> JobkitError:
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


def raise_for_answer(response: httpx.Response) -> None:
    """httpx response hook: an error answer raises its jobkit exception; any answer is ``last_answer``."""
    last_answer.set(response)
    if not response.is_success:
        response.read()
        raise _error_for_answer(response)


async def araise_for_answer(response: httpx.Response) -> None:
    """raise_for_answer for httpx's async client."""
    last_answer.set(response)
    if not response.is_success:
        await response.aread()
        raise _error_for_answer(response)


def _options(cls: type[OptionsT], http: Any, token: str | None) -> OptionsT:
    options = cls(
        auto_refresh_token=False,
        persist_session=False,
        postgrest_client_retry=False,  # jobkit retries, with its own bounds
        httpx_client=http,
    )
    if token:
        options.headers["Authorization"] = f"Bearer {token}"  # beside supabase-py's X-Client-Info
    return options


def _timeout(seconds: float) -> httpx.Timeout:
    return httpx.Timeout(seconds, connect=min(seconds, 5.0))


def supabase_client(
    url: str,
    key: str,
    *,
    token: str | None = None,
    retry: RetryPolicy | None = None,
    timeout: float = 10.0,
    transport: httpx.BaseTransport | None = None,
) -> tuple[Client, httpx.Client]:
    """A supabase-py client for ``url`` with ``key`` (and a user's ``token`` as its Authorization), over an
    httpx client that retries transient faults and maps error answers; close the httpx client when done."""
    http = httpx.Client(
        transport=RetryingTransport(transport or httpx.HTTPTransport(), retry or RetryPolicy()),
        timeout=_timeout(timeout),
        event_hooks={"response": [raise_for_answer]},
    )
    return create_client(url, key, options=_options(SyncClientOptions, http, token)), http


async def async_supabase_client(
    url: str,
    key: str,
    *,
    token: str | None = None,
    retry: RetryPolicy | None = None,
    timeout: float = 10.0,
    transport: httpx.AsyncBaseTransport | None = None,
) -> tuple[AsyncClient, httpx.AsyncClient]:
    """supabase_client for asyncio: supabase-py's async client over httpx's."""
    http = httpx.AsyncClient(
        transport=AsyncRetryingTransport(transport or httpx.AsyncHTTPTransport(), retry or RetryPolicy()),
        timeout=_timeout(timeout),
        event_hooks={"response": [araise_for_answer]},
    )
    return await acreate_client(url, key, options=_options(AsyncClientOptions, http, token)), http
