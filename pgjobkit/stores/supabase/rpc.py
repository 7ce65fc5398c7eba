"""What both Supabase stores share: how a call's arguments go into PostgREST's JSON body, how its answer comes
back (read value by value when supabase-py could not decode it), and the stores' configuration."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import httpx
from pydantic import SecretStr

from pgjobkit.core.models import Job
from pgjobkit.errors import ConfigurationError, InvalidArgument, JobkitError, TransientError
from pgjobkit.ops import MAX_ROWS, Call, Dialect
from pgjobkit.redact import redact
from pgjobkit.stores import unreadable
from pgjobkit.stores.supabase._http_base import RetryPolicy, last_answer


def as_json(value: Any) -> Any:
    """A call's argument as PostgREST takes it in a JSON body."""
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list | tuple):
        return [as_json(v) for v in value]
    return value


def rpc_args(call: Call) -> dict[str, Any]:
    """A call's arguments as the JSON body of PostgREST's ``POST /rpc/<fn>``."""
    return {k: as_json(v) for k, (_, v) in call.args.items()}


def answer(call: Call, data: Any) -> Any:
    if isinstance(data, str) and not call.scalar:  # undecoded rows (supabase-py may answer the text)
        data = unreadable.read_value_by_value(data)
    if not call.scalar and not isinstance(data, list):
        raise JobkitError(f"jobkit: {call.fn} returned {type(data).__name__}, expected rows")
    return data


def undecoded() -> str:
    """The text of the answer supabase-py just failed to decode (see ``pgjobkit.stores.supabase.http.last_answer``)."""
    answer = last_answer.get()
    if answer is None:  # pragma: no cover - the response hook sets it before any answer is decoded
        raise JobkitError("jobkit: an answer could not be decoded")
    return answer.text


def unreachable(call: Call, exc: httpx.TransportError, where: str) -> TransientError:
    cause = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return TransientError(f"jobkit: {call.fn}: {cause} talking to Supabase at {where}")


class SupabaseConfig:
    """What both stores take: the project's URL and secret key, and how to talk to it; ``origin`` says
    where they came from (``open_store``: the variables and their sources), in errors."""

    def __init__(
        self,
        url: str,
        service_key: str | SecretStr,
        *,
        retry: RetryPolicy | None = None,
        timeout: float = 10.0,
        max_rows: int = MAX_ROWS,
        realtime: bool | str = True,
        origin: str | None = None,
    ) -> None:
        key = service_key if isinstance(service_key, SecretStr) else SecretStr(service_key)
        if not url or not key.get_secret_value():
            raise ConfigurationError("jobkit: a Supabase store needs SUPABASE_URL and SUPABASE_SECRET_KEY")
        if max_rows < 2:
            raise InvalidArgument(
                f"jobkit: max_rows must be >= 2, the project's API max rows (got {max_rows})"
            )
        self._url, self._key, self._retry, self._timeout = url.rstrip("/"), key, retry, timeout
        self._origin = origin
        # Realtime wake-ups for a worker: the project's own Realtime, another URL, or off (polling only)
        self._realtime = self._url if realtime is True else (realtime or None)
        # jobkit's functions never return more than MAX_ROWS in one call, whatever the project allows
        self.dialect = Dialect(
            job=Job.from_row, time=datetime.fromisoformat, max_rows=min(max_rows, MAX_ROWS), json_answers=True
        )

    def _config(self) -> dict[str, Any]:
        return {
            "retry": self._retry,
            "timeout": self._timeout,
            "max_rows": self.dialect.max_rows,
            "realtime": self._realtime or False,
            "origin": self._origin,
        }

    @property
    def _where(self) -> str:
        return self._origin or redact(self._url)

    def _named(self, exc: JobkitError) -> JobkitError:
        """A refusal (a wrong key, a project without jobkit's migration) naming the settings to fix."""
        if self._origin is None:
            return exc
        return type(exc)(f"{exc} (this store: {self._origin})", code=exc.code)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={redact(self._url)!r})"
