"""What a worker reports: how each attempt ended in it (``AttemptReport``, its ``Outcome``; ``JobResult``
before 0.6), what a tick and a run
did (``TickResult``, ``RunSummary``), the error text a failure stores on its job (``error_text``), and the
traceback it keeps for operators (``format_traceback``)."""

from __future__ import annotations

import os
import re
import traceback
from dataclasses import dataclass
from typing import Literal
from uuid import UUID

from pgjobkit import _deprecated
from pgjobkit.core.failures import storable_traceback
from pgjobkit.core.models import MAX_ERROR_LENGTH, Job

_OURS = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # pgjobkit's own files
Outcome = Literal["succeeded", "retrying", "dead", "lost"]  # how one attempt of a job ended in this worker
_SURROGATE = re.compile("[\ud800-\udfff]")
__getattr__ = _deprecated.renamed(__name__, {"JobResult": "pgjobkit.worker.results:AttemptReport"})


@dataclass(frozen=True)
class AttemptReport:
    """How one attempt of a job ended in this worker (``result`` is what a handler returns; ``lost``: its lease had passed to another worker, or it was
    cancelled): ``seconds`` from its start to its end, ``wait`` from runnable to claimed."""

    job_id: UUID
    type: str
    attempt: int
    outcome: Outcome
    error: str | None = None
    seconds: float = 0.0
    wait: float = 0.0


def queue_wait(job: Job) -> float:
    """Seconds ``job`` waited from runnable (its run_after) until this attempt was claimed (0 if unknown)."""
    if job.started_at is None:
        return 0.0
    return max((job.started_at - job.run_after).total_seconds(), 0.0)


@dataclass(frozen=True)
class TickResult:
    """What one ``tick()`` did."""

    results: tuple[AttemptReport, ...] = ()

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

    def add(self, result: AttemptReport) -> None:
        setattr(self, result.outcome, getattr(self, result.outcome) + 1)


def storable_text(text: str, limit: int = MAX_ERROR_LENGTH) -> str:
    """``text`` as PostgreSQL text can hold it: NUL written as \\0, lone surrogates (from bytes decoded with
    surrogateescape, say) as U+FFFD, at most ``limit`` characters."""
    return _SURROGATE.sub("\ufffd", text[:limit].replace("\x00", "\\0"))[:limit]


def error_text(exc: BaseException) -> str:
    """'ExcType: message' (or just the type), the error text stored on the job; an exception whose str()
    itself fails is described by its type alone."""
    try:
        text = str(exc)
    except Exception:
        text = ""
    return storable_text(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def format_traceback(exc: BaseException) -> str:
    """``exc``'s traceback as Python prints it, chained exceptions included, for the log and the operator:
    from the handler's frame (the worker's frames that called it left out), each piece (a frame, an
    exception's line) at most MAX_ERROR_LENGTH characters, since a message may be a megabyte; the whole
    kept to its end (``storable_traceback``), where the frame that raised is. A traceback that cannot be
    formatted is the exception's description."""
    try:
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename.startswith(_OURS):
            tb = tb.tb_next
        pieces = traceback.TracebackException(type(exc), exc, tb).format()
        text = "".join(p if len(p) <= MAX_ERROR_LENGTH else p[:MAX_ERROR_LENGTH] + "[cut]\n" for p in pieces)
    except Exception:  # a traceback is never worth a failure
        text = error_text(exc)
    return storable_traceback(text)
