"""A claimed job inside the worker (``Attempt``: its handler, timings, lease token and fate) and what its
handler can ask of it while it runs (``current()``, a ``JobContext``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pgjobkit.core.models import MAX_PROGRESS_MESSAGE, Job, NewJob
from pgjobkit.core.pipelines import Dependency, DependencyResult, Pipeline
from pgjobkit.errors import InvalidArgument
from pgjobkit.exporters import otel
from pgjobkit.worker.registry import Handler
from pgjobkit.worker.results import storable_text

READ_TIMEOUT = 120.0  # seconds a sync handler waits for its dependencies to be read on the worker's loop


@dataclass(eq=False)
class Attempt:
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
    added: Pipeline | None = None  # jobs the handler added, to exist once this job has completed
    # what the job waits for, with results: read from the store on the worker's loop, once
    dependencies: Callable[[], Awaitable[list[DependencyResult]]] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    span: Any = None  # the attempt's OpenTelemetry span, when the worker traces (pgjobkit.exporters.otel)
    _dependencies: list[DependencyResult] | None = None

    def __post_init__(self) -> None:
        assert self.job.lease_token is not None
        self.lease_token = self.job.lease_token


class JobContext:
    """What a running handler can ask of its job (``pgjobkit.current()``)."""

    def __init__(self, run: Attempt) -> None:
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

    def add(
        self,
        job: NewJob | str,
        payload: Mapping[str, Any] | None = None,
        *,
        after: Dependency | Iterable[Dependency] = (),
        ref: str | None = None,
        **fields: Any,
    ) -> str:
        """Add a job to this job's pipeline (as ``Pipeline.add`` takes it; ``after`` names jobs added
        before it, or jobs that exist): it exists once this job has succeeded, in the transaction that
        completes it, and never if this attempt fails or loses its lease. Its user is this job's."""
        if self._run.added is None:
            self._run.added = Pipeline()
        return self._run.added.add(job, payload, after=after, ref=ref, **fields)

    def dependencies(self) -> list[DependencyResult]:
        """What this job waited for, in the order it listed them, each with how it ended and its result
        (read once, 1000 per round trip). From a sync handler; an async one awaits ``adependencies()``."""
        loop = self._run.loop
        if loop is None:
            raise InvalidArgument("jobkit: this job was not started by a worker")
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            raise InvalidArgument("jobkit: in an async handler, use `await current().adependencies()`")
        # bounded: a worker whose loop stopped meanwhile must not leave this thread waiting for ever
        return asyncio.run_coroutine_threadsafe(self.adependencies(), loop).result(READ_TIMEOUT)

    async def adependencies(self) -> list[DependencyResult]:
        """``dependencies()`` for async handlers."""
        run = self._run
        if run._dependencies is None:
            if run.dependencies is None:
                raise InvalidArgument("jobkit: this job was not started by a worker")
            run._dependencies = await run.dependencies()
        return run._dependencies

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
def running_as(run: Attempt) -> Iterator[None]:
    """Make ``run`` what ``current()`` answers, and its span (if it has one) the current span, for the code
    inside (a task's or a thread's own context)."""
    token = _current.set(JobContext(run))
    try:
        if run.span is None:
            yield
        else:
            with otel.current(run.span):
                yield
    finally:
        _current.reset(token)
