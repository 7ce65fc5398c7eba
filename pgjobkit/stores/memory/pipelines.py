"""Pipelines' SQL functions in process (45_pipelines.sql): jobkit_enqueue_pipeline, _complete_adding,
_list_dependencies, _get_pipeline, _pipeline_progress and _cancel_pipeline, with the SQL's checks and
messages. A graph is checked whole before anything is written (``_plan``), then written (``_add``); what
an ending does to the jobs that wait for it is ``State.settle``."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from pgjobkit.core import transitions
from pgjobkit.core.bounds import BATCH_LIMIT, MAX_DEPENDENCIES, MAX_EDGES, MAX_REF_LENGTH, MAX_ROWS
from pgjobkit.core.job_rules import UUID_TEXT, job_problem
from pgjobkit.core.models import Job, JobStatus
from pgjobkit.errors import InvalidArgument, JobNotFound
from pgjobkit.stores.memory.admin import check_limit
from pgjobkit.stores.memory.jobs import bad_job, check_each, check_results, insert_all
from pgjobkit.stores.memory.state import Edge, Row, State, Woken

POLICIES = ("cancel", "run")


@dataclass(frozen=True)
class _Dependency:
    """One job a new job waits for: its index in the call, its position, the job it names (the index of a
    job of the call, or a job's id) and its on_failure."""

    idx: int
    position: int
    target: int | UUID
    on_failure: str


@dataclass(frozen=True)
class _Graph:
    """A call's jobs, checked: each as jobkit_enqueue_many takes it (waiting when it waits for any), its
    ref, what each waits for, and the jobs that exist it waits for."""

    jobs: list[dict[str, Any]]
    refs: list[Any]
    dependencies: list[_Dependency]
    existing: list[UUID]


def _quote(text: str) -> str:
    """PostgreSQL's quote_literal."""
    quoted = "'" + text.replace("'", "''") + "'"
    return "E" + quoted.replace("\\", "\\\\") if "\\" in text else quoted


def _element_problem(e: Any) -> str | None:
    """What add_graph finds wrong with an element's own graph keys (ref, depends_on), or None."""
    if not isinstance(e, dict):
        return "must be a JSON object"
    if "ref" in e and not isinstance(e["ref"], str):
        return "ref must be a string"
    if "ref" in e and not 1 <= len(e["ref"]) <= MAX_REF_LENGTH:
        return f"ref must be 1 to {MAX_REF_LENGTH} characters"
    if not isinstance(e.get("depends_on", []), list):
        return "depends_on must be an array of refs or job ids"
    if len(e.get("depends_on", [])) > MAX_DEPENDENCIES:
        return f"depends_on must name at most {MAX_DEPENDENCIES} jobs"
    return None


def _dependency(idx: int, position: int, given: Any, refs: dict[str, int], default: str) -> _Dependency | str:
    """One element of a depends_on, or what is wrong with it."""
    if isinstance(given, dict):
        if given.keys() - {"job", "on_failure"} or not isinstance(given.get("job"), str):
            return 'a depends_on object is {"job": <ref or id>, "on_failure": "cancel" or "run"}'
        if given.get("on_failure") is not None and given["on_failure"] not in POLICIES:
            return "on_failure must be 'cancel' or 'run'"
        target, policy = given["job"], given.get("on_failure") or default
    elif isinstance(given, str):
        target, policy = given, default
    else:
        return 'depends_on must hold refs or job ids (strings), or {"job": ..., "on_failure": ...} objects'
    named = refs.get(target)
    if named is not None and named >= idx:
        return (
            f"depends_on names {_quote(target[:100])}, listed at or after it: list each job after the jobs "
            "it waits for (the jobs of a cycle cannot be listed so)"
        )
    if named is None and not UUID_TEXT.fullmatch(target):
        return f"depends_on names {_quote(target[:100])}, neither a ref listed before it nor a job id"
    return _Dependency(idx, position, UUID(target) if named is None else named, policy)


def _plan(state: State, p_jobs: Any, on_failure: Any, user_id: UUID | None) -> _Graph:
    """add_graph's checks, in its order: the first problem raised, nothing written. The jobs' user_id
    defaults to ``user_id``."""
    if not isinstance(p_jobs, list | tuple):
        raise InvalidArgument("jobkit: p_jobs must be a JSON array of job objects")
    if on_failure not in POLICIES:
        raise InvalidArgument("jobkit: p_on_failure must be 'cancel' or 'run'")
    if not p_jobs:
        return _Graph([], [], [], [])
    if len(p_jobs) > BATCH_LIMIT:
        raise InvalidArgument(f"jobkit: p_jobs holds {len(p_jobs)} jobs; at most {BATCH_LIMIT} per call")
    check_each(p_jobs, _element_problem)
    refs: dict[str, int] = {}
    for idx, e in enumerate(p_jobs):
        if "ref" in e and e["ref"] in refs:
            raise bad_job(idx, f"ref {_quote(e['ref'][:100])} names two jobs of this call; give each its own")
        if "ref" in e:
            refs[e["ref"]] = idx
    if sum(len(e.get("depends_on", [])) for e in p_jobs) > MAX_EDGES:
        raise InvalidArgument(
            f"jobkit: p_jobs waits for more than {MAX_EDGES} jobs in all; split the pipeline"
        )
    dependencies = []
    for idx, e in enumerate(p_jobs):
        for position, given in enumerate(e.get("depends_on", [])):
            dependency = _dependency(idx, position, given, refs, on_failure)
            if isinstance(dependency, str):
                raise bad_job(idx, dependency)
            dependencies.append(dependency)
    jobs = [
        {k: v for k, v in e.items() if k not in ("ref", "depends_on")}
        | ({"user_id": str(user_id)} if user_id is not None and "user_id" not in e else {})
        for e in p_jobs
    ]
    check_each(jobs, job_problem)
    existing = list(dict.fromkeys(d.target for d in dependencies if isinstance(d.target, UUID)))
    for job_id in existing:
        if job_id not in state.jobs:
            raise JobNotFound(f"jobkit: depends_on names job {job_id}, which does not exist", job_id=job_id)
    return _Graph(
        [
            job | {"waiting": True} if e.get("depends_on") else job
            for job, e in zip(jobs, p_jobs, strict=True)
        ],
        [e.get("ref") for e in p_jobs],
        dependencies,
        existing,
    )


def _add(
    state: State, now: datetime, woken: Woken, graph: _Graph, pipeline_id: UUID | None, parent_id: UUID | None
) -> list[Row]:
    """add_graph's writes: a checked graph's jobs, their pipeline rows and what they wait for (an element
    whose idempotency key a live job holds gets that job and adds nothing to it: the jobs of the call that
    wait for it wait for it as a job that exists); then the jobs waited for that exist are settled. Returns
    [{ref, id, inserted, status}] in input order."""
    got = insert_all(state, now, woken, graph.jobs)
    waits = Counter(d.idx for d in graph.dependencies)
    for idx, (job, inserted) in enumerate(got):
        if inserted and pipeline_id is not None:
            state.add_node(now, job.id, pipeline_id, job.user_id, parent_id, waits[idx])
    for d in graph.dependencies:
        job, inserted = got[d.idx]
        if inserted:
            target = got[d.target][0].id if isinstance(d.target, int) else d.target
            state.add_edge(Edge(job.id, d.position, target, d.on_failure, job.user_id))
    state.settle(now, woken, graph.existing + [job.id for job, inserted in got if not inserted])
    return [
        {"ref": ref, "id": job.id, "inserted": inserted, "status": state.jobs[job.id].status}
        for ref, (job, inserted) in zip(graph.refs, got, strict=True)
    ]


def enqueue_pipeline(
    state: State,
    now: datetime,
    woken: Woken,
    p_jobs: Any,
    p_pipeline_id: UUID | None = None,
    p_on_failure: str = "cancel",
) -> Row:
    """The jobs of ``p_jobs`` as one pipeline, all or nothing: {pipeline_id, jobs}."""
    pipeline_id = p_pipeline_id or uuid.uuid4()
    graph = _plan(state, p_jobs, p_on_failure, None)
    return {"pipeline_id": pipeline_id, "jobs": _add(state, now, woken, graph, pipeline_id, None)}


def complete_adding(
    state: State,
    now: datetime,
    woken: Woken,
    p_id: UUID | None,
    p_lease_token: UUID | None,
    p_result: Any = None,
    p_jobs: Any = (),
    p_on_failure: str = "cancel",
) -> Row:
    """jobkit_complete for one job, fenced by its lease ({ok: false} when it was lost: nothing changes),
    adding ``p_jobs`` to its pipeline, or to a new one named by its id."""
    if p_id is None or p_lease_token is None:
        raise InvalidArgument("jobkit: p_id and p_lease_token are required")
    check_results({str(p_id): p_result})
    outcome = transitions.complete(state.jobs.get(p_id), p_lease_token, now=now, job_id=p_id, result=p_result)
    if not isinstance(outcome, transitions.Applied):
        return {"ok": False}
    owner = outcome.job.user_id
    graph = _plan(state, p_jobs, p_on_failure, owner)  # before any write: a bad graph completes nothing
    state.put(outcome.job)
    node = state.pipeline_jobs.get(p_id)
    pipeline_id = node.pipeline_id if node is not None else None
    if node is None and graph.jobs:
        pipeline_id = p_id
        state.add_node(now, p_id, p_id, owner, None, 0)
    jobs = _add(state, now, woken, graph, pipeline_id, p_id)
    state.settle(now, woken, [p_id])
    return {"ok": True, "pipeline_id": pipeline_id, "jobs": jobs}


def list_dependencies(
    state: State, now: datetime, woken: Woken, p_id: UUID, p_after: int | None = -1, p_limit: int = MAX_ROWS
) -> list[Row]:
    """What job ``p_id`` waits for, after position ``p_after``, with how each ended and its result."""
    check_limit(p_limit, MAX_ROWS)
    rows = []
    for edge in state.dependencies.get(p_id, []):
        job = state.jobs.get(edge.depends_on)
        if edge.position > (-1 if p_after is None else p_after):
            rows.append(
                {
                    "position": edge.position,
                    "id": edge.depends_on,
                    "type": job.type if job else None,
                    "status": job.status if job else edge.outcome,
                    "on_failure": edge.on_failure,
                    "outcome": edge.outcome,
                    "result": job.result if job else None,
                }
            )
    return rows[:p_limit]


def _jobs_of(state: State, pipeline_id: UUID) -> list[Job]:
    """The pipeline's jobs, in the order they were added."""
    return [state.jobs[i] for i, node in state.pipeline_jobs.items() if node.pipeline_id == pipeline_id]


def get_pipeline(
    state: State,
    now: datetime,
    woken: Woken,
    p_pipeline_id: UUID,
    p_after: int | None = 0,
    p_limit: int = MAX_ROWS,
) -> list[Row]:
    """The pipeline's jobs after seq ``p_after``, each with its parent and what it waits for."""
    check_limit(p_limit, MAX_ROWS)
    rows = []
    for job in _jobs_of(state, p_pipeline_id):
        node = state.pipeline_jobs[job.id]
        if node.seq > (p_after or 0):
            rows.append(
                {
                    "seq": node.seq,
                    "id": job.id,
                    "type": job.type,
                    "status": job.status,
                    "parent_id": node.parent_id,
                    "depends_on": [e.depends_on for e in state.dependencies.get(job.id, [])],
                    "waiting_for": node.waiting_for,
                    "attempts": job.attempts,
                    "progress": job.progress,
                    "progress_message": job.progress_message,
                    "error": job.error,
                    "user_id": job.user_id,
                    "created_at": node.created_at,
                    "updated_at": job.updated_at,
                }
            )
    return rows[:p_limit]


def pipeline_of(state: State, now: datetime, woken: Woken, p_id: UUID) -> UUID | None:
    node = state.pipeline_jobs.get(p_id)
    return None if node is None else node.pipeline_id


def pipeline_progress(state: State, now: datetime, woken: Woken, p_pipeline_id: UUID) -> list[Row]:
    """The pipeline's jobs by status in one row; no row when it has none."""
    jobs = _jobs_of(state, p_pipeline_id)
    if not jobs:
        return []
    n = Counter(j.status for j in jobs)
    return [
        {
            "pipeline_id": p_pipeline_id,
            "total": len(jobs),
            "succeeded": n[JobStatus.SUCCEEDED],
            "running": n[JobStatus.RUNNING],
            "queued": n[JobStatus.QUEUED] + n[JobStatus.RETRYING],
            "waiting": n[JobStatus.WAITING],
            "dead": n[JobStatus.DEAD],
            "cancelled": n[JobStatus.CANCELLED],
            "running_types": sorted({j.type for j in jobs if j.status == JobStatus.RUNNING}),
            "updated_at": max(j.updated_at for j in jobs),
        }
    ]


def cancel_pipeline(
    state: State, now: datetime, woken: Woken, p_pipeline_id: UUID, p_reason: str | None = None
) -> int:
    """Cancel every job of the pipeline not finished, settling the jobs that wait for them, until a pass
    finds none; how many."""
    reason = "cancelled with its pipeline" if p_reason is None else p_reason
    total = 0
    while True:
        gone = []
        for job in _jobs_of(state, p_pipeline_id):
            cancelled = transitions.cancel(job, now=now, reason=reason)
            if cancelled is not None:
                state.put(cancelled)
                gone.append(job.id)
        if not gone:
            return total
        total += len(gone)
        state.settle(now, woken, gone)
