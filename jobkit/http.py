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

import email.utils
import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
import tenacity

from jobkit.errors import PermissionDenied, error_for_http
from supabase import Client, ClientOptions, create_client

log = logging.getLogger("jobkit.http")


def is_transient_status(status: int) -> bool:
    """An answer worth another try: 408, 429 and every 5xx."""
    return status >= 500 or status in (408, 429)


@dataclass(frozen=True)
class RetryPolicy:
    """How transient HTTP faults are retried: at most ``attempts`` tries within ``max_total`` seconds."""

    attempts: int = 6
    base: float = 0.2
    cap: float = 5.0
    max_total: float = 30.0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)


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


class RetryingTransport(httpx.BaseTransport):
    """An httpx transport that retries transient faults of the one it wraps (see module doc)."""

    def __init__(self, inner: httpx.BaseTransport, policy: RetryPolicy) -> None:
        self._inner, self._policy = inner, policy

    @staticmethod
    def _elapsed(state: tenacity.RetryCallState) -> float:
        # idle_for counts the sleeps asked for, so an injected sleep keeps the budget honest too.
        return max(state.seconds_since_start or 0.0, state.idle_for)

    def _delay(self, state: tenacity.RetryCallState) -> float:
        p = self._policy
        delay = random.uniform(0, min(p.cap, p.base * 2 ** (state.attempt_number - 1)))
        delay = max(delay, self._retry_after(state))
        return max(0.0, min(delay, p.max_total - self._elapsed(state)))

    def _stop(self, state: tenacity.RetryCallState) -> bool:
        p = self._policy
        if state.attempt_number >= p.attempts:
            return True
        return self._elapsed(state) + self._retry_after(state) >= p.max_total

    @staticmethod
    def _retry_after(state: tenacity.RetryCallState) -> float:
        outcome = state.outcome
        if outcome is not None and not outcome.failed:
            return _retry_after(outcome.result()) or 0.0
        return 0.0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()  # the body is sent again on a retry

        def close_retried(state: tenacity.RetryCallState) -> None:
            outcome, wait = state.outcome, state.upcoming_sleep
            if outcome is not None and not outcome.failed:
                response: httpx.Response = outcome.result()
                log.warning(
                    "jobkit: %s %s answered %d; retrying in %.1fs",
                    request.method,
                    request.url.path,
                    response.status_code,
                    wait,
                )
                response.close()
            elif outcome is not None:
                log.warning(
                    "jobkit: Supabase at %s unreachable (%s on %s %s); retrying in %.1fs",
                    request.url.host,
                    type(outcome.exception()).__name__,
                    request.method,
                    request.url.path,
                    wait,
                )

        retrying = tenacity.Retrying(
            stop=self._stop,
            wait=self._delay,
            retry=(
                tenacity.retry_if_exception_type(httpx.TransportError)
                | tenacity.retry_if_result(lambda r: is_transient_status(r.status_code))
            ),
            before_sleep=close_retried,
            retry_error_callback=lambda state: state.outcome.result() if state.outcome else None,
            sleep=self._policy.sleep,
            reraise=True,
        )
        response: httpx.Response = retrying(self._inner.handle_request, request)
        return response

    def close(self) -> None:
        self._inner.close()


_KEY_HELP = (
    "The key lacks the rights for this call: workers and the CLI need the project's secret key "
    "(SUPABASE_SECRET_KEY, sb_secret_..., or the legacy service_role key) and UserJobs the publishable "
    "key plus a signed-in user's access token; check too that jobkit's migration is applied."
)


def raise_for_answer(response: httpx.Response) -> None:
    """httpx response hook: an error answer raises its jobkit exception (see ``error_for_http``)."""
    if response.is_success:
        return
    response.read()
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
    if isinstance(error, PermissionDenied):
        error = PermissionDenied(f"{text}. {_KEY_HELP}", code=code)
    raise error


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
        timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)),
        event_hooks={"response": [raise_for_answer]},
    )
    options = ClientOptions(
        auto_refresh_token=False,
        persist_session=False,
        postgrest_client_retry=False,  # jobkit retries, with its own bounds
        httpx_client=http,
    )
    if token:
        options.headers["Authorization"] = f"Bearer {token}"  # beside supabase-py's X-Client-Info
    return create_client(url, key, options=options), http
