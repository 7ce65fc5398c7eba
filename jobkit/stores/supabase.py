"""SupabaseStore and AsyncSupabaseStore: the JobStore over PostgREST RPC, with supabase-py's sync or async
client and the secret (service-role) key. Both run ``jobkit.ops`` calls as ``POST /rest/v1/rpc/jobkit_*``;
how faults are retried and mapped is ``jobkit.http``'s.

PostgREST cuts a set-returning answer at the project's max-rows (1000 on Supabase) while the function
runs to completion, so no call asks for more: claims and completions are split to fit, requeue, stats and
lease reclaim page, and ``enqueue_many`` calls ``jobkit_enqueue_many_json``, whose one JSON value carries
every row of an all-or-nothing batch of up to 10,000. Give ``max_rows`` if the project's Max Rows setting
(Settings -> API) was lowered.

What a retried call means: the first attempt may have run before its answer was lost (a gateway's 502 or
504, a dropped connection). A retried claim then leaves the jobs it leased running until their lease
expires, when they are reclaimed: delivery stays at-least-once. A retried enqueue without an idempotency
key may insert twice; give a key when that matters. complete / fail / extend are fenced by the lease
token, so a repeat changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any
from uuid import UUID

import httpx
from pydantic import SecretStr

from jobkit.errors import ConfigurationError, InvalidArgument, JobkitError, TransientError
from jobkit.http import RetryPolicy, async_supabase_client, last_answer, supabase_client
from jobkit.live import WorkerWakeups
from jobkit.models import Job
from jobkit.ops import MAX_ROWS, Call, Codec
from jobkit.stores import lenient
from jobkit.stores.base import AsyncJobStore, JobStore
from supabase import AsyncClient

__all__ = ["AsyncSupabaseStore", "RetryPolicy", "SupabaseStore"]


def _json(value: Any) -> Any:
    """A call's argument as PostgREST takes it in a JSON body."""
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    return value


def _answer(call: Call, data: Any) -> Any:
    if isinstance(data, str):  # undecoded (supabase-py may answer the text): no jobkit function returns text
        data = lenient.rows(data)
    if not call.scalar and not isinstance(data, list):
        raise JobkitError(f"jobkit: {call.fn} returned {type(data).__name__}, expected rows")
    return data


def _undecoded() -> str:
    """The text of the answer supabase-py just failed to decode (see ``jobkit.http.last_answer``)."""
    answer = last_answer.get()
    if answer is None:  # pragma: no cover - the response hook sets it before any answer is decoded
        raise JobkitError("jobkit: an answer could not be decoded")
    return answer.text


def _unreachable(call: Call, exc: httpx.TransportError) -> TransientError:
    return TransientError(f"jobkit: {call.fn}: {type(exc).__name__} talking to Supabase")


class _SupabaseConfig:
    """What both stores take: the project's URL and secret key, and how to talk to it."""

    def __init__(
        self,
        url: str,
        service_key: str | SecretStr,
        *,
        retry: RetryPolicy | None = None,
        timeout: float = 10.0,
        max_rows: int = MAX_ROWS,
        realtime: bool | str = True,
    ) -> None:
        key = service_key if isinstance(service_key, SecretStr) else SecretStr(service_key)
        if not url or not key.get_secret_value():
            raise ConfigurationError("jobkit: a Supabase store needs SUPABASE_URL and SUPABASE_SECRET_KEY")
        if max_rows < 2:
            raise InvalidArgument(
                f"jobkit: max_rows must be >= 2, the project's API max rows (got {max_rows})"
            )
        self._url, self._key, self._retry, self._timeout = url.rstrip("/"), key, retry, timeout
        # Realtime wake-ups for a worker: the project's own Realtime, another URL, or off (polling only)
        self._realtime = self._url if realtime is True else (realtime or None)
        # jobkit's functions never return more than MAX_ROWS in one call, whatever the project allows
        self.codec = Codec(
            job=Job.from_row, time=datetime.fromisoformat, max_rows=min(max_rows, MAX_ROWS), json_answers=True
        )

    def _config(self) -> dict[str, Any]:
        return {
            "retry": self._retry,
            "timeout": self._timeout,
            "max_rows": self.codec.max_rows,
            "realtime": self._realtime or False,
        }

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self._url!r})"


class SupabaseStore(_SupabaseConfig, JobStore):
    """A JobStore over a Supabase project's API. ``service_key``: the secret / service_role key."""

    def __init__(
        self,
        url: str,
        service_key: str | SecretStr,
        *,
        transport: httpx.BaseTransport | None = None,
        **options: Any,
    ) -> None:
        super().__init__(url, service_key, **options)
        self._client, self._http = supabase_client(
            self._url,
            self._key.get_secret_value(),
            retry=self._retry,
            timeout=self._timeout,
            transport=transport,
        )

    def as_async(self) -> AsyncSupabaseStore:
        return AsyncSupabaseStore(self._url, self._key, **self._config())

    def _execute(self, call: Call, conn: Any = None) -> Any:
        try:
            data = self._client.rpc(call.fn, {k: _json(v) for k, (_, v) in call.args.items()}).execute().data
        except httpx.TransportError as exc:
            raise _unreachable(call, exc) from exc
        except (ValueError, RecursionError):  # an answer supabase-py could not decode
            data = _undecoded()
        return _answer(call, data)

    def listen(self, wake: Callable[[], None]) -> _Polling:
        """PostgREST has no LISTEN: a blocking caller polls (the worker, on the async twin, also wakes on
        Realtime)."""
        return _Polling()

    def close(self) -> None:
        self._http.close()


class AsyncSupabaseStore(_SupabaseConfig, AsyncJobStore):
    """SupabaseStore for asyncio, over supabase-py's async client (made on first use, or ``open()``)."""

    def __init__(
        self,
        url: str,
        service_key: str | SecretStr,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        **options: Any,
    ) -> None:
        super().__init__(url, service_key, **options)
        self._transport = transport
        self._made: tuple[AsyncClient, httpx.AsyncClient] | None = None

    async def open(self, wait: bool = True) -> None:
        if self._made is None:
            self._made = await async_supabase_client(
                self._url,
                self._key.get_secret_value(),
                retry=self._retry,
                timeout=self._timeout,
                transport=self._transport,
            )

    async def _execute(self, call: Call, conn: Any = None) -> Any:
        if self._made is None:
            await self.open()
        assert self._made is not None
        try:
            data = (
                await self._made[0].rpc(call.fn, {k: _json(v) for k, (_, v) in call.args.items()}).execute()
            ).data
        except httpx.TransportError as exc:
            raise _unreachable(call, exc) from exc
        except (ValueError, RecursionError):  # an answer supabase-py could not decode
            data = _undecoded()
        return _answer(call, data)

    async def listen(self, wake: Callable[[], None]) -> WorkerWakeups | _AsyncPolling:
        """Wake on Realtime broadcasts of enqueued jobs (connecting in the background); polling stays the
        fallback, and the only way with ``realtime=False``."""
        if self._realtime is None:
            return _AsyncPolling()
        return WorkerWakeups(self._realtime, self._key.get_secret_value(), wake)

    async def close(self) -> None:
        if self._made is not None:
            await self._made[1].aclose()
            self._made = None


class _Polling:
    def close(self) -> None:
        return None


class _AsyncPolling:
    async def close(self) -> None:
        return None
