"""A claimed job inside the worker (``Running``: its handler, timings, lease token and fate) and what its
handler can ask of it while it runs (``current()``, a ``JobContext``)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from pgjobkit.core.models import MAX_PROGRESS_MESSAGE, Job
from pgjobkit.errors import InvalidArgument
from pgjobkit.worker.registry import Handler
from pgjobkit.worker.results import storable_text


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
    """What a running handler can ask of its job (``pgjobkit.current()``)."""

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
