"""Pipelines, as values: jobs that wait for jobs (``Pipeline``, built in order), and what a store answers
about them. The rules are the SQL's (``45_pipelines.sql``): a job waits only for jobs added before it, or
for jobs that exist, so no graph built here can hold a cycle; each dependency says what its job does when
the job it waits for ends dead or cancelled (``"cancel"``, cascading, or ``"run"`` anyway)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pgjobkit.core.bounds import BATCH_LIMIT, MAX_DEPENDENCIES, MAX_EDGES, MAX_REF_LENGTH
from pgjobkit.core.models import Answer, JobStatus, NewJob
from pgjobkit.errors import InvalidArgument

OnFailure = Literal["cancel", "run"]


@dataclass(frozen=True, slots=True)
class After:
    """A dependency with a policy of its own: ``job`` (a ref of the same pipeline, or a job's id), and
    what the waiting job does when it ends dead or cancelled."""

    job: str | UUID
    on_failure: OnFailure = "cancel"


Dependency = str | UUID | After  # what ``after=`` takes: a ref, a job's id, or one of those with a policy


class Pipeline:
    """Jobs that wait for jobs, in the order they are added: ``add`` returns a ref (a name within the
    pipeline) that later jobs list in ``after``. ``on_failure`` is every dependency's policy unless it says
    otherwise (``After``). Enqueue it with a store's ``enqueue_pipeline``, or from a running handler with
    ``current().add`` (its jobs then join the handler's pipeline when the handler's job completes)."""

    def __init__(self, on_failure: OnFailure = "cancel", pipeline_id: UUID | None = None) -> None:
        if on_failure not in ("cancel", "run"):
            raise InvalidArgument(f"jobkit: on_failure must be 'cancel' or 'run' (got {on_failure!r})")
        self.on_failure: OnFailure = on_failure
        self.pipeline_id = pipeline_id
        self._jobs: list[tuple[str, NewJob, tuple[After, ...]]] = []
        self._refs: set[str] = set()
        self._edges = 0

    def __len__(self) -> int:
        return len(self._jobs)

    def add(
        self,
        job: NewJob | str,
        payload: Mapping[str, Any] | None = None,
        *,
        after: Dependency | Iterable[Dependency] = (),
        ref: str | None = None,
        **fields: Any,
    ) -> str:
        """Add a job (a NewJob, or its type with ``payload`` and NewJob's other ``fields``) that waits for
        every job of ``after``; its ref (``ref``, or one made up: ``#<n>``)."""
        if isinstance(job, str):
            job = NewJob(type=job, payload=dict(payload or {}), **fields)
        elif payload is not None or fields:
            raise InvalidArgument("jobkit: give a NewJob, or a type with its payload and fields, not both")
        if len(self._jobs) >= BATCH_LIMIT:
            raise InvalidArgument(f"jobkit: a pipeline holds at most {BATCH_LIMIT} jobs per call")
        name = f"#{len(self._jobs)}" if ref is None else ref
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_REF_LENGTH:
            raise InvalidArgument(f"jobkit: ref must be a string of 1 to {MAX_REF_LENGTH} characters")
        if name in self._refs:
            raise InvalidArgument(f"jobkit: ref {name!r} names two jobs of this pipeline; give each its own")
        deps = tuple(self._dependency(d) for d in _many(after))
        if len(deps) > MAX_DEPENDENCIES:
            raise InvalidArgument(f"jobkit: a job waits for at most {MAX_DEPENDENCIES} jobs")
        if self._edges + len(deps) > MAX_EDGES:
            raise InvalidArgument(f"jobkit: a pipeline waits for at most {MAX_EDGES} jobs in all")
        self._jobs.append((name, job, deps))
        self._refs.add(name)
        self._edges += len(deps)
        return name

    def _dependency(self, dep: Dependency) -> After:
        after = dep if isinstance(dep, After) else After(dep, self.on_failure)
        if after.on_failure not in ("cancel", "run"):
            raise InvalidArgument(f"jobkit: on_failure must be 'cancel' or 'run' (got {after.on_failure!r})")
        if isinstance(after.job, str) and after.job not in self._refs:
            raise InvalidArgument(
                f"jobkit: after names {after.job[:100]!r}, no job added before it: add each job after the "
                "jobs it waits for (the jobs of a cycle cannot be added so)"
            )
        if not isinstance(after.job, str | UUID):
            raise InvalidArgument(
                f"jobkit: after takes refs, job ids or After (got {type(after.job).__name__})"
            )
        return after

    @property
    def jobs(self) -> list[tuple[str, NewJob, tuple[After, ...]]]:
        """Each job as added: its ref, the job, and what it waits for."""
        return list(self._jobs)

    @classmethod
    def batch(cls, jobs: Sequence[NewJob], then: NewJob) -> Pipeline:
        """``jobs``, and ``then``, which runs once when every one of them has ended, whatever the outcome
        (its handler reads them with ``current().dependencies()``; ``outcomes`` counts them)."""
        pipeline = cls(on_failure="run")
        refs = [pipeline.add(job) for job in jobs]
        pipeline.add(then, after=refs)
        return pipeline


def _many(after: Dependency | Iterable[Dependency]) -> Iterable[Dependency]:
    return (after,) if isinstance(after, str | UUID | After) else after


# --- what stores answer ----------------------------------------------------------------------------------
class PipelineJobRef(Answer):
    """One job of an enqueued pipeline: its ref, its id, whether this call inserted it (False: a live job
    held its idempotency key, and is this one), and its status now."""

    ref: str | None = None
    id: UUID
    inserted: bool
    status: JobStatus


class PipelineEnqueued(Answer):
    """What enqueuing a pipeline returns: its id and its jobs, in the order they were added."""

    pipeline_id: UUID | None = None  # None: a handler added nothing
    jobs: tuple[PipelineJobRef, ...] = ()

    @property
    def ids(self) -> dict[str, UUID]:
        """Each job's id by its ref."""
        return {j.ref: j.id for j in self.jobs if j.ref is not None}


class DependencyResult(Answer):
    """A job another waits for, as the waiting job's handler is handed it: its place in the waiting job's
    list, its status (``outcome``: how it ended, once it did), its policy, and its result. ``unreadable``
    says why its result could not be read (JSON no client parses, written around jobkit's bounds), its
    ``result`` then None; the other dependencies read as they are."""

    position: int
    id: UUID
    type: str | None = None  # None: pruned since
    status: JobStatus
    on_failure: OnFailure
    outcome: JobStatus | None = None
    result: Any = None
    unreadable: str | None = None


def outcomes(dependencies: Iterable[DependencyResult]) -> Counter[JobStatus]:
    """How many of ``dependencies`` ended each way (a batch's completion job reads its counts so)."""
    return Counter(d.outcome or d.status for d in dependencies)


class PipelineJob(Answer):
    """One job of a pipeline, as its tree shows it: the job that added it (``parent_id``), the jobs it waits
    for (``depends_on``, in order) and how many of those have not ended. ``seq`` orders a pipeline's jobs
    as they were added."""

    seq: int
    id: UUID
    type: str
    status: JobStatus
    parent_id: UUID | None = None
    depends_on: tuple[UUID, ...] = ()
    waiting_for: int = 0
    attempts: int = 0
    progress: float | None = None
    progress_message: str | None = None
    error: str | None = None
    user_id: UUID | None = None
    created_at: datetime
    updated_at: datetime


class PipelineProgress(Answer):
    """A pipeline in one row: its jobs by status, and the types running now (the step it is at)."""

    pipeline_id: UUID
    total: int
    succeeded: int
    running: int
    queued: int
    waiting: int
    dead: int
    cancelled: int
    running_types: tuple[str, ...] = ()
    updated_at: datetime | None = None

    @property
    def finished(self) -> bool:
        """No job of it is left to run."""
        return self.running + self.queued + self.waiting == 0
