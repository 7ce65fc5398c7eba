"""Handlers by job type (``Registry``), each registration validated (``Handler``), and how a handler is
called on a job's payload."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypedDict, Unpack

from pydantic import BaseModel, ValidationError

from pgjobkit.core import transitions
from pgjobkit.core.models import Job
from pgjobkit.errors import InvalidArgument, Permanent


class HandlerOptions(TypedDict, total=False):
    """How one type's jobs run. ``lease``: this type's lease (default: the worker's). ``max_attempts``: the
    attempts this type's jobs get, raising or lowering what each was enqueued with (default: the job's own);
    the first failure keeps it on the job, so that a crash after it counts against it too (a crash before
    any failure counts against the job's own). ``payload``: a pydantic model the payload is validated into
    (a payload that fails it makes the job dead at once); default: the raw dict."""

    lease: timedelta | None
    max_attempts: int | None
    payload: type[BaseModel] | None


@dataclass(frozen=True)
class Handler:
    """A registered handler. ``lease`` None means the worker's lease; ``max_attempts`` None, the job's."""

    job_type: str
    fn: Callable[..., Any]
    lease: timedelta | None
    max_attempts: int | None
    payload: type[BaseModel] | None
    wants_job: bool
    is_async: bool

    @classmethod
    def build(cls, type: str, fn: Callable[..., Any], **options: Unpack[HandlerOptions]) -> Handler:
        """Validate a registration: ``fn`` takes (payload) or (payload, job)."""
        lease, max_attempts = options.get("lease"), options.get("max_attempts")
        transitions.check_types([type])
        if lease is not None:
            transitions.check_lease(lease)
        if max_attempts is not None:
            name = f"max_attempts of the handler for {type!r}"
            if not isinstance(max_attempts, int) or isinstance(max_attempts, bool):
                raise InvalidArgument(f"jobkit: {name} must be an integer (got {max_attempts!r:.100})")
            transitions.check_max_attempts(max_attempts, name)
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        params = inspect.signature(fn).parameters.values()
        positional = [p for p in params if p.kind in kinds]
        variadic = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
        if not positional and not variadic:
            raise InvalidArgument(f"jobkit: handler for {type!r} must take (payload) or (payload, job)")
        call: Any = fn  # an object with an async __call__ is an async handler too
        is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call.__call__)
        return cls(
            type, fn, lease, max_attempts, options.get("payload"), len(positional) >= 2 or variadic, is_async
        )

    def invoke(self, job: Job) -> Any:
        """Call ``fn`` on ``job``'s payload (a rejected payload raises Permanent): what it returns, the
        coroutine to await for an async handler."""
        payload: Any = job.payload
        if self.payload is not None:
            try:
                payload = self.payload.model_validate(job.payload)
            except ValidationError as exc:
                raise Permanent(f"payload rejected by {self.payload.__name__}: {exc}") from exc
        return self.fn(payload, job) if self.wants_job else self.fn(payload)

    def attempts_for(self, job: Job) -> int:
        """The attempts ``job`` gets: this type's max_attempts, or the job's own."""
        return job.max_attempts if self.max_attempts is None else self.max_attempts


class Registry:
    """Handlers by job type: what a Worker can run."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def handler(
        self, type: str, **options: Unpack[HandlerOptions]
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register the decorated function for jobs of ``type``, run as ``options`` say (HandlerOptions).

        It is called as ``fn(payload)`` or ``fn(payload, job)``, and may be ``async``.
        """

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.register(type, fn, **options)
            return fn

        return register

    def register(self, type: str, fn: Callable[..., Any], **options: Unpack[HandlerOptions]) -> None:
        """Non-decorator form of ``handler``."""
        if type in self._handlers:
            raise InvalidArgument(f"jobkit: a handler for {type!r} is already registered")
        self._handlers[type] = Handler.build(type, fn, **options)

    @property
    def types(self) -> list[str]:
        """The registered job types, sorted."""
        return sorted(self._handlers)

    def __getitem__(self, type: str) -> Handler:
        return self._handlers[type]

    def values(self) -> list[Handler]:
        """The registered handlers."""
        return list(self._handlers.values())
