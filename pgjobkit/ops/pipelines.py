"""Pipelines' operations, as values: enqueue one, complete a job adding jobs to its pipeline, read what a
job waits for (with results), a pipeline's jobs and progress, cancel one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from uuid import UUID

from pgjobkit.core.pipelines import (
    DependencyResult,
    Pipeline,
    PipelineEnqueued,
    PipelineJob,
    PipelineProgress,
)
from pgjobkit.ops import UNREADABLE, Call, Dialect, Op, as_uuid, paged
from pgjobkit.ops.jobs import job_object


def objects(
    pipeline: Pipeline, default: str | None = None, trace_context: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """The pipeline's jobs as ``jobkit_enqueue_pipeline`` takes them: each its job object with its ref and
    what it waits for (a dependency whose policy is ``default``, the pipeline's unless given, as a bare ref
    or id), and ``trace_context`` for a job that brings none of its own."""
    default = default or pipeline.on_failure
    out = []
    for ref, job, deps in pipeline.jobs:
        obj: dict[str, Any] = {"ref": ref, **job_object(job)}
        if trace_context is not None and job.trace_context is None:
            obj["trace_context"] = trace_context
        if deps:
            obj["depends_on"] = [
                str(d.job) if d.on_failure == default else {"job": str(d.job), "on_failure": d.on_failure}
                for d in deps
            ]
        out.append(obj)
    return out


def _args(pipeline: Pipeline, trace_context: dict[str, str] | None) -> dict[str, tuple[str, Any]]:
    args: dict[str, tuple[str, Any]] = {"p_jobs": ("jsonb", objects(pipeline, trace_context=trace_context))}
    if pipeline.on_failure != "cancel":
        args["p_on_failure"] = ("text", pipeline.on_failure)
    return args


def enqueue_pipeline(
    d: Dialect, pipeline: Pipeline, trace_context: dict[str, str] | None = None
) -> Op[PipelineEnqueued]:
    args = _args(pipeline, trace_context)
    if pipeline.pipeline_id is not None:
        args["p_pipeline_id"] = ("uuid", pipeline.pipeline_id)
    value = yield Call("jobkit_enqueue_pipeline", args, scalar=True)
    return PipelineEnqueued.model_validate(value)


def complete_adding(
    d: Dialect,
    job_id: UUID,
    lease_token: UUID,
    result: Any,
    pipeline: Pipeline,
    trace_context: dict[str, str] | None = None,
) -> Op[tuple[bool, PipelineEnqueued]]:
    """Complete a job and add ``pipeline``'s jobs to its pipeline, in one transaction fenced by its lease:
    (False, nothing) when the lease was lost."""
    args = {"p_id": ("uuid", job_id), "p_lease_token": ("uuid", lease_token)} | _args(pipeline, trace_context)
    if result is not None:
        args["p_result"] = ("jsonb", result)
    value = yield Call("jobkit_complete_adding", args, scalar=True)
    if not value["ok"]:
        return False, PipelineEnqueued()
    return True, PipelineEnqueued.model_validate(value)


def list_dependencies(d: Dialect, job_id: UUID) -> Op[list[DependencyResult]]:
    """What ``job_id`` waits for, in its order, with results: one call per max_rows of them."""

    def after(last: DependencyResult | None) -> dict[str, tuple[str, Any]]:
        return {"p_id": ("uuid", job_id), "p_after": ("integer", last.position if last else -1)}

    return (yield from paged(d, "jobkit_list_dependencies", after, _dependency))


def _dependency(row: Mapping[str, Any]) -> DependencyResult:
    """One row of ``jobkit_list_dependencies``; a value its transport could not read (only ``result`` may
    not: the rest are ids, text and integers) is named in ``unreadable``, not raised."""
    problem = row.get(UNREADABLE)
    if problem is None:
        return DependencyResult.model_validate(row)
    return DependencyResult.model_validate({**row, "result": None, "unreadable": str(problem)[:500]})


def get_pipeline(d: Dialect, pipeline_id: UUID) -> Op[list[PipelineJob]]:
    """Every job of the pipeline, in the order they were added: one call per max_rows of them."""

    def after(last: PipelineJob | None) -> dict[str, tuple[str, Any]]:
        return {"p_pipeline_id": ("uuid", pipeline_id), "p_after": ("bigint", last.seq if last else 0)}

    return (yield from paged(d, "jobkit_get_pipeline", after, PipelineJob.model_validate))


def pipeline_of(d: Dialect, job_id: UUID) -> Op[UUID | None]:
    value = yield Call("jobkit_pipeline_of", {"p_id": ("uuid", job_id)}, scalar=True)
    return None if value is None else as_uuid(value)


def pipeline_progress(d: Dialect, pipeline_id: UUID) -> Op[PipelineProgress | None]:
    rows = yield Call("jobkit_pipeline_progress", {"p_pipeline_id": ("uuid", pipeline_id)})
    return PipelineProgress.model_validate(rows[0]) if rows else None


def user_enqueue_pipeline(d: Dialect, pipeline: Pipeline) -> Op[PipelineEnqueued]:
    """A signed-in user's pipeline (``jobkit_user_enqueue_pipeline``: each job of a type open to users,
    with only its type, payload and idempotency key; each policy said per dependency)."""
    value = yield Call(
        "jobkit_user_enqueue_pipeline", {"p_jobs": ("jsonb", objects(pipeline, "cancel"))}, scalar=True
    )
    return PipelineEnqueued.model_validate(value)


def user_cancel_pipeline(d: Dialect, pipeline_id: UUID) -> Op[int]:
    value = yield Call("jobkit_user_cancel_pipeline", {"p_pipeline_id": ("uuid", pipeline_id)}, scalar=True)
    return int(value)


def cancel_pipeline(d: Dialect, pipeline_id: UUID, reason: str | None = None) -> Op[int]:
    value = yield Call(
        "jobkit_cancel_pipeline",
        {"p_pipeline_id": ("uuid", pipeline_id), "p_reason": ("text", reason)},
        scalar=True,
    )
    return int(value)
