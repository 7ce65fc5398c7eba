"""enqueue_bulk: many jobs without idempotency keys written with COPY, the direct Postgres path only.

jobkit_enqueue_many validates JSON and matches keys in SQL; COPY skips both. What it keeps: the jobs are
``NewJob``s (validated in Python by the same rules as the SQL), the table's CHECK constraints hold, each job
takes the fairness turn jobkit_fair_round gives (looked up once per (type, priority, key) in the batch), a
job's run_after is counted from the database's clock, workers are woken by NOTIFY, and it is one
transaction: all the jobs or none. What it gives up: deduplication (a job with an idempotency key is
refused: use enqueue_many). The steps are written once, as a generator of ``Step`` values; the sync and
async stores each drive it on one connection inside one transaction.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID, uuid4

import psycopg
from psycopg.rows import tuple_row

from pgjobkit.core import fairness
from pgjobkit.core.bounds import BATCH_LIMIT
from pgjobkit.core.models import NewJob
from pgjobkit.errors import InvalidArgument
from pgjobkit.stores.postgres.listen import CHANNEL

COPY = (
    "copy public.jobkit_jobs (id, user_id, type, payload, priority, max_attempts, run_after, fair_key, "
    "fair_round) from stdin"
)
BASE_TURNS = (  # each (type, priority, key)'s base turn (jobkit_fair_round), and the clock
    "select g.t, g.p, g.k, public.jobkit_fair_round(g.t, g.p, g.k), now() "
    "from unnest(%s::text[], %s::integer[], %s::text[]) as g(t, p, k)"
)
NOTIFY = f"select pg_notify('{CHANNEL}', %s)"
TRACES = (
    "insert into public.jobkit_traces (job_id, trace_context) "
    "select * from unnest(%s::uuid[], %s::text[]::jsonb[]) returning job_id"
)


@dataclass(frozen=True, slots=True)
class Step:
    """One statement on the bulk connection: a query (its rows are sent back) or a COPY of ``rows``."""

    sql: str
    params: Sequence[Any] = ()
    rows: Sequence[tuple[Any, ...]] | None = None  # set for COPY


BulkOp = Generator[Step, list[tuple[Any, ...]], list[UUID]]


def enqueue_bulk(jobs: Sequence[NewJob]) -> BulkOp:
    """The steps of one bulk enqueue, its result the new jobs' ids in input order. What it cannot do is
    refused here, at once, before a connection is taken or anything sent."""
    if len(jobs) > BATCH_LIMIT:
        raise InvalidArgument(f"jobkit: enqueue_bulk got {len(jobs)} jobs; at most {BATCH_LIMIT} per call")
    keyed = next((i for i, j in enumerate(jobs) if j.idempotency_key is not None), None)
    if keyed is not None:
        raise InvalidArgument(
            f"jobkit: job {keyed} has an idempotency_key; enqueue_bulk does not deduplicate: "
            "use enqueue_many for jobs with keys"
        )
    return _steps(jobs)


def _steps(jobs: Sequence[NewJob]) -> BulkOp:
    if not jobs:
        return []
    # the fairness rules are core.fairness', as jobkit_enqueue_many's: each (type, priority, key)'s base turn
    # is looked up once (jobkit_fair_round), then a key's jobs take consecutive turns in input order
    objects = [
        {"type": j.type, "priority": j.priority, "fair_key": j.fair_key, "user_id": j.user_id} for j in jobs
    ]
    groups = list(dict.fromkeys(fairness.group(o) for o in objects))
    rows = yield Step(BASE_TURNS, ([g[0] for g in groups], [g[1] for g in groups], [g[2] for g in groups]))
    base = {(t, p, k): r for t, p, k, r, _ in rows}
    now = rows[0][4]
    turns = fairness.turns(objects, lambda t, p, k: base[(t, p, k)])
    ids = [uuid4() for _ in jobs]
    copied = []
    runnable = False  # a job runnable now: workers are woken
    for job_id, job, obj, turn in zip(ids, jobs, objects, turns, strict=True):
        key = fairness.fair_key(obj)
        run_after = job.run_after if job.run_after is not None else now + job.delay if job.delay else now
        runnable = runnable or run_after <= now
        payload = json.dumps(job.payload, separators=(",", ":"))
        copied.append(
            (job_id, job.user_id, job.type, payload, job.priority, job.max_attempts, run_after, key, turn)
        )
    yield Step(COPY, rows=copied)
    traced = [(i, j.trace_context) for i, j in zip(ids, jobs, strict=True) if j.trace_context is not None]
    if traced:
        yield Step(TRACES, ([i for i, _ in traced], [json.dumps(t) for _, t in traced]))
    if runnable:  # an empty payload: any role may LISTEN, so a wake-up names no type (as the SQL's)
        yield Step(NOTIFY, ("",))
    return ids


def run(op: BulkOp, conn: psycopg.Connection[Any], *, own: bool) -> list[UUID]:
    """Drive ``op`` on ``conn``: in a transaction of its own when ``own`` (a pooled autocommit connection),
    else in whatever transaction the caller has open on it (committed or rolled back with it)."""
    try:
        step = next(op)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    with conn.transaction() if own else contextlib.nullcontext(), conn.cursor(row_factory=tuple_row) as cur:
        while True:
            answer: list[tuple[Any, ...]] = []
            if step.rows is None:
                answer = cur.execute(step.sql, step.params).fetchall()
            else:
                with cur.copy(step.sql) as copy:
                    for row in step.rows:
                        copy.write_row(row)
            try:
                step = op.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]


async def arun(op: BulkOp, conn: psycopg.AsyncConnection[Any], *, own: bool) -> list[UUID]:
    """``run`` for an async connection."""
    try:
        step = next(op)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    async with (
        conn.transaction() if own else contextlib.nullcontext(),
        conn.cursor(row_factory=tuple_row) as cur,
    ):
        while True:
            answer: list[tuple[Any, ...]] = []
            if step.rows is None:
                await cur.execute(step.sql, step.params)
                answer = await cur.fetchall()
            else:
                async with cur.copy(step.sql) as copy:
                    for row in step.rows:
                        await copy.write_row(row)
            try:
                step = op.send(answer)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
