"""Handlers and what they produce (Retry and Permanent, raised by a handler; JobResult, TickResult and
RunSummary), and the per-job state a worker keeps while one runs (Running)."""

from __future__ import annotations

import asyncio
import inspect
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ValidationError

from jobkit import core
from jobkit.errors import InvalidArgument
from jobkit.models import MAX_ERROR_LENGTH, MAX_PROGRESS_MESSAGE, Job

Outcome = Literal["succeeded", "retrying", "dead", "lost"]
_SURROGATE = re.compile("[\ud800-\udfff]")


class Retry(Exception):
    """Raise from a handler to retry after ``after`` (default: the backoff schedule)."""

    def __init__(self, message: str = "retry requested", *, after: timedelta | float | None = None) -> None:
        super().__init__(message)
        self.after = timedelta(seconds=after) if isinstance(after, int | float) else after


class Permanent(Exception):
    """Raise from a handler for a failure no retry can fix: the job goes dead at once."""


@dataclass(frozen=True)
class JobResult:
    """How one job ended in this worker (``lost``: its lease had passed to another worker)."""

    job_id: UUID
    type: str
    attempt: int
    outcome: Outcome
    error: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class TickResult:
    """What one ``tick()`` did."""

    results: tuple[JobResult, ...] = ()

    @property
    def claimed(self) -> int:
        return len(self.results)

    def count(self, outcome: Outcome) -> int:
        return sum(1 for r in self.results if r.outcome == outcome)


@dataclass
class RunSummary:
    """What one ``run()`` did: jobs claimed, how each ended in this worker, and how long it ran."""

    claimed: int = 0
    succeeded: int = 0
    retrying: int = 0
    dead: int = 0
    lost: int = 0
    seconds: float = 0.0

    def add(self, result: JobResult) -> None:
        setattr(self, result.outcome, getattr(self, result.outcome) + 1)


@dataclass(frozen=True)
class Handler:
    """A registered handler. ``lease`` None means the worker's lease."""

    job_type: str
    fn: Callable[..., Any]
    lease: timedelta | None
    max_attempts: int | None
    payload: type[BaseModel] | None
    wants_job: bool
    is_async: bool

    @classmethod
    def build(
        cls,
        type: str,
        fn: Callable[..., Any],
        *,
        lease: timedelta | None = None,
        max_attempts: int | None = None,
        payload: type[BaseModel] | None = None,
    ) -> Handler:
        """Validate a registration: ``fn`` takes (payload) or (payload, job)."""
        core.check_types([type])
        if lease is not None:
            core.check_lease(lease)
        if max_attempts is not None and max_attempts < 1:
            raise InvalidArgument("jobkit: max_attempts must be >= 1")
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        params = inspect.signature(fn).parameters.values()
        positional = [p for p in params if p.kind in kinds]
        variadic = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params)
        if not positional and not variadic:
            raise InvalidArgument(f"jobkit: handler for {type!r} must take (payload) or (payload, job)")
        call: Any = fn  # an object with an async __call__ is an async handler too
        is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call.__call__)
        return cls(type, fn, lease, max_attempts, payload, len(positional) >= 2 or variadic, is_async)

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

    def is_final(self, job: Job, exc: BaseException) -> bool:
        """A failure that must not be retried: Permanent, or this type's max_attempts reached."""
        return isinstance(exc, Permanent) or (
            self.max_attempts is not None and job.attempts >= self.max_attempts
        )


class Registry:
    """Handlers by job type, and which types are claimed: the registration half of a Worker."""

    lease: timedelta  # the lease of handlers registered without one

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._only: set[str] | None = None

    def handler(
        self,
        type: str,
        *,
        lease: timedelta | None = None,
        max_attempts: int | None = None,
        payload: type[BaseModel] | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register the decorated function for jobs of ``type``.

        It is called as ``fn(payload)`` or ``fn(payload, job)``; ``payload`` is an instance of the given
        pydantic model (a payload that fails it makes the job dead at once) or the raw dict. It may be
        ``async``. ``max_attempts`` caps attempts for this type (a failure at or past it is final).
        """

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self.register(type, fn, lease=lease, max_attempts=max_attempts, payload=payload)
            return fn

        return register

    def register(
        self,
        type: str,
        fn: Callable[..., Any],
        *,
        lease: timedelta | None = None,
        max_attempts: int | None = None,
        payload: type[BaseModel] | None = None,
    ) -> None:
        """Non-decorator form of ``handler``."""
        if type in self._handlers:
            raise InvalidArgument(f"jobkit: a handler for {type!r} is already registered")
        self._handlers[type] = Handler.build(
            type, fn, lease=lease, max_attempts=max_attempts, payload=payload
        )

    @property
    def types(self) -> list[str]:
        """The job types this worker claims."""
        return sorted(t for t in self._handlers if self._only is None or t in self._only)

    def _lease(self, h: Handler) -> timedelta:
        return h.lease or self.lease

    def _groups(self) -> dict[timedelta, list[str]]:
        """The claimed types, grouped by lease: one claim call per group."""
        if not self._handlers:
            raise InvalidArgument("jobkit: register a handler before claiming jobs")
        groups: dict[timedelta, list[str]] = {}
        for t in self.types:
            groups.setdefault(self._lease(self._handlers[t]), []).append(t)
        return groups


@dataclass(eq=False)
class Running:
    """A claimed job in this worker: its handler, timings, lease token and fate. ``task`` runs the handler
    (an async one, or what a sync one returned to be awaited); ``stopped`` is set when the job is no longer
    this worker's (cancelled, or its lease lost) or is given back."""

    job: Job
    handler: Handler
    started: float
    lease_token: uuid.UUID = field(init=False)
    lost: bool = False
    abandoned: bool = False
    finished: float = 0.0
    task: asyncio.Task[None] | None = None
    slot: bool = False  # its task holds one of the worker's slots
    stopped: bool = False  # read by the handler's thread through current().cancelled
    result: Any = None  # what the handler returned, kept on success
    progress: tuple[float, str | None] | None = None  # the latest report, not yet written

    def __post_init__(self) -> None:
        assert self.job.lease_token is not None
        self.lease_token = self.job.lease_token


class JobContext:
    """What a running handler can ask of its job (``jobkit.current()``)."""

    def __init__(self, run: Running) -> None:
        self._run = run

    @property
    def job(self) -> Job:
        return self._run.job

    def progress(self, fraction: float, message: str | None = None) -> None:
        """Report how far the job is (0 to 1) and, optionally, a message of at most 200 characters. Cheap:
        the worker writes the latest report of each job at most once a second."""
        if not (isinstance(fraction, int | float) and 0 <= fraction <= 1):
            raise InvalidArgument(f"jobkit: progress must be a number from 0 to 1 (got {fraction!r})")
        if message is not None and len(message) > MAX_PROGRESS_MESSAGE:
            raise InvalidArgument(
                f"jobkit: a progress message is at most {MAX_PROGRESS_MESSAGE} characters (got {len(message)})"
            )
        self._run.progress = (float(fraction), None if message is None else storable_text(message))

    @property
    def cancelled(self) -> bool:
        """True once the job was cancelled (or its lease lost) and the worker wants the handler to stop: a
        sync handler checks it between steps and returns; an async handler is cancelled outright."""
        return self._run.stopped


_current: ContextVar[JobContext | None] = ContextVar("jobkit_current", default=None)


def current() -> JobContext:
    """The running job's context, inside a handler (sync or async)."""
    context = _current.get()
    if context is None:
        raise InvalidArgument("jobkit: current() is for code running inside a jobkit handler")
    return context


@contextmanager
def running_as(run: Running) -> Iterator[None]:
    """Make ``run`` what ``current()`` answers, for the code inside (a task's or a thread's own context)."""
    token = _current.set(JobContext(run))
    try:
        yield
    finally:
        _current.reset(token)


def storable_text(text: str, limit: int = MAX_ERROR_LENGTH) -> str:
    """``text`` as PostgreSQL text can hold it: NUL written as \\0, lone surrogates (from bytes decoded with
    surrogateescape, say) as U+FFFD, at most ``limit`` characters."""
    return _SURROGATE.sub("\ufffd", text[:limit].replace("\x00", "\\0"))[:limit]


def describe(exc: BaseException) -> str:
    """'ExcType: message' (or just the type), the error text stored on the job; an exception whose str()
    itself fails is described by its type alone."""
    try:
        text = str(exc)
    except Exception:
        text = ""
    return storable_text(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)
