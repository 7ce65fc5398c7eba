"""What the queue shows of itself, in SQL: trace contexts as an attacker with a valid session would send
them, the queue's depth read through partial indexes whatever the table holds, and what the beats prune."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from tests.doubles.postgrest import Postgrest, PostgrestError, Raw
from tests.sql.helpers import SERVICE, make_user, user_claims

pytestmark = pytest.mark.parametrize("db_name", ["current", "legacy"], indirect=True)

GOOD = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
BAD = {
    "not an object": "[1, 2]",
    "a nested object": '{"traceparent": {"a": "b"}}',
    "a number": '{"traceparent": 5}',
    "over 1 KiB": json.dumps({"tracestate": "x" * 1100}),
}


@pytest.mark.parametrize("what", list(BAD))
def test_a_trace_context_that_is_not_a_small_object_of_strings_is_refused_on_every_path(
    rest: Postgrest, pg: psycopg.Connection[Any], what: str
) -> None:
    pg.execute("insert into public.jobkit_user_types (type) values ('t')")
    user = make_user(pg)
    bad = Raw(BAD[what])
    calls: dict[str, Callable[[], Any]] = {
        "enqueue": lambda: rest.rpc("jobkit_enqueue", {"p_type": "t", "p_trace_context": bad}, SERVICE),
        "enqueue_many": lambda: rest.rpc(
            "jobkit_enqueue_many",
            {"p_jobs": Raw(f'[{{"type": "t"}}, {{"type": "t", "trace_context": {BAD[what]}}}]')},
            SERVICE,
        ),
        "user_enqueue": lambda: rest.rpc(
            "jobkit_user_enqueue", {"p_type": "t", "p_trace_context": bad}, user_claims(user)
        ),
    }
    for path, call in calls.items():
        with pytest.raises(PostgrestError) as refused:
            call()
        assert refused.value.code == "JK001", path
        assert "trace_context must be a JSON object of strings" in str(refused.value), path
    counts = pg.execute(
        "select (select count(*) from public.jobkit_jobs) as jobs, (select count(*) from public.jobkit_traces) as traces"
    ).fetchone()
    assert counts == {"jobs": 0, "traces": 0}


def test_a_users_trace_context_is_kept_and_only_the_service_role_reads_it(
    rest: Postgrest, pg: psycopg.Connection[Any]
) -> None:
    pg.execute("insert into public.jobkit_user_types (type) values ('t')")
    user = make_user(pg)
    [job] = rest.rpc("jobkit_user_enqueue", {"p_type": "t", "p_trace_context": GOOD}, user_claims(user))
    assert rest.rpc("jobkit_trace_contexts", {"p_ids": [job["id"]]}, SERVICE) == [
        {"id": job["id"], "trace_context": GOOD}
    ]
    for claims in (user_claims(user), {"role": "anon"}):
        with pytest.raises(PostgrestError) as refused:
            rest.rpc("jobkit_trace_contexts", {"p_ids": [job["id"]]}, claims)
        assert refused.value.code == "42501"
    # a job found by its key keeps the first enqueue's context
    again = rest.rpc(
        "jobkit_enqueue", {"p_type": "t", "p_idempotency_key": "k", "p_trace_context": GOOD}, SERVICE
    )[0]
    rest.rpc(
        "jobkit_enqueue", {"p_type": "t", "p_idempotency_key": "k", "p_trace_context": {"a": "b"}}, SERVICE
    )
    assert rest.rpc("jobkit_trace_contexts", {"p_ids": [again["id"]]}, SERVICE)[0]["trace_context"] == GOOD


def test_queue_depth_reads_the_unfinished_jobs_through_partial_indexes(pg: psycopg.Connection[Any]) -> None:
    """Its cost follows the backlog: 20,000 finished rows and fresh statistics, and no plan node scans the
    jobs table whole."""
    pg.execute(
        "insert into public.jobkit_jobs (type, status, attempts) "
        "select 'done', 'succeeded', 1 from generate_series(1, 20000)"
    )
    pg.execute("insert into public.jobkit_jobs (type) select 'live' from generate_series(1, 50)")
    pg.execute("analyze public.jobkit_jobs")
    plan = pg.execute("explain (format json) select * from public.jobkit_queue_depth()").fetchone()
    assert plan is not None
    nodes: list[dict[str, Any]] = []
    stack = [plan["QUERY PLAN"][0]["Plan"]]
    while stack:
        node = stack.pop()
        nodes.append(node)
        stack.extend(node.get("Plans", []))
    # SQL functions are inlined: the plan is the function's own
    scanned = {
        (n["Node Type"], n.get("Relation Name"), n.get("Index Name")) for n in nodes if "Relation Name" in n
    }
    assert ("Seq Scan", "jobkit_jobs", None) not in scanned, scanned
    assert pg.execute("select type, status, jobs from public.jobkit_queue_depth()").fetchall() == [
        {"type": "live", "status": "queued", "jobs": 50}
    ]


def test_a_beat_prunes_old_trace_contexts_of_finished_jobs_only(
    rest: Postgrest, pg: psycopg.Connection[Any]
) -> None:
    ids = [
        rest.rpc("jobkit_enqueue", {"p_type": "t", "p_trace_context": GOOD}, SERVICE)[0]["id"]
        for _ in range(3)
    ]
    pg.execute("update public.jobkit_jobs set status = 'cancelled' where id = %s", (ids[0],))
    pg.execute("delete from public.jobkit_jobs where id = %s", (ids[1],))
    pg.execute("update public.jobkit_traces set created_at = now() - interval '2 days'")
    rest.rpc("jobkit_worker_beat", {"p_worker": "w"}, SERVICE)
    left = pg.execute("select job_id::text from public.jobkit_traces").fetchall()
    assert left == [{"job_id": ids[2]}]  # the queued one keeps its context however old
