# WARNING: this file is generated from pgjobkit/stores/supabase/http_async.py by tools/async_to_sync.py: DO NOT CHANGE.
# Change pgjobkit/stores/supabase/http_async.py and run `python tools/async_to_sync.py`.
"""The client to a Supabase project's API, async in ``http_async`` (the source) and blocking in ``http``
(generated from it by tools/async_to_sync.py): a retrying httpx transport, the response hook that maps
error answers, and the supabase-py client built over them."""

from __future__ import annotations

import httpx
import tenacity

from pgjobkit.stores.supabase._http_base import (
    RetryPolicy,
    client_options,
    client_timeout,
    error_for_answer,
    is_transient_status,
    last_answer,
    retry_arguments,
)
from supabase import Client, ClientOptions, create_client


class RetryingTransport(httpx.BaseTransport):
    """An httpx transport that retries transient faults of the one it wraps (see ``pgjobkit.stores.supabase._http_base``)."""

    def __init__(self, inner: httpx.BaseTransport, policy: RetryPolicy) -> None:
        self._inner, self._policy = inner, policy

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        request.read()

        def attempt() -> httpx.Response:
            response = self._inner.handle_request(request)
            if is_transient_status(response.status_code):
                response.read()
                response.close()
            return response

        retrying = tenacity.Retrying(sleep=self._policy.sleep, **retry_arguments(self._policy, request))
        response: httpx.Response = retrying(attempt)
        return response

    def close(self) -> None:
        self._inner.close()


def raise_for_answer(response: httpx.Response) -> None:
    """httpx response hook: an error answer raises its jobkit exception; any answer is ``last_answer``."""
    last_answer.set(response)
    if not response.is_success:
        response.read()
        raise error_for_answer(response)


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
        timeout=client_timeout(timeout),
        event_hooks={"response": [raise_for_answer]},
    )
    return create_client(url, key, options=client_options(ClientOptions, http, token)), http
