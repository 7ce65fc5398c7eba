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
from supabase import AsyncClient, AsyncClientOptions, acreate_client


class AsyncRetryingTransport(httpx.AsyncBaseTransport):
    """An httpx transport that retries transient faults of the one it wraps (see ``pgjobkit.stores.supabase._http_base``)."""

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

        retrying = tenacity.AsyncRetrying(sleep=self._policy.asleep, **retry_arguments(self._policy, request))
        response: httpx.Response = await retrying(attempt)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


async def araise_for_answer(response: httpx.Response) -> None:
    """httpx response hook: an error answer raises its jobkit exception; any answer is ``last_answer``."""
    last_answer.set(response)
    if not response.is_success:
        await response.aread()
        raise error_for_answer(response)


async def async_supabase_client(
    url: str,
    key: str,
    *,
    token: str | None = None,
    retry: RetryPolicy | None = None,
    timeout: float = 10.0,
    transport: httpx.AsyncBaseTransport | None = None,
) -> tuple[AsyncClient, httpx.AsyncClient]:
    """A supabase-py client for ``url`` with ``key`` (and a user's ``token`` as its Authorization), over an
    httpx client that retries transient faults and maps error answers; close the httpx client when done."""
    http = httpx.AsyncClient(
        transport=AsyncRetryingTransport(transport or httpx.AsyncHTTPTransport(), retry or RetryPolicy()),
        timeout=client_timeout(timeout),
        event_hooks={"response": [araise_for_answer]},
    )
    return await acreate_client(url, key, options=client_options(AsyncClientOptions, http, token)), http
