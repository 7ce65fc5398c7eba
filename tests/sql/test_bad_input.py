"""Bad input to every function: a jobkit SQLSTATE, a message naming the argument, nothing written."""

from __future__ import annotations

import math
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.doubles.postgrest import Postgrest, PostgrestError
from tests.sql.helpers import SERVICE

TOKEN = "00000000-0000-0000-0000-000000000001"
ID = "00000000-0000-0000-0000-000000000002"

CASES: list[tuple[str, dict[str, Any], str]] = [
    ("jobkit_enqueue", {"p_type": None}, "type is required"),
    ("jobkit_enqueue", {"p_type": ""}, "type must be 1 to 200"),
    ("jobkit_enqueue", {"p_type": "x" * 201}, "type must be 1 to 200"),
    ("jobkit_enqueue", {"p_type": "a\tb"}, "control characters"),
    ("jobkit_enqueue", {"p_type": "a", "p_payload": [1, 2]}, "payload must be a JSON object"),
    ("jobkit_enqueue", {"p_type": "a", "p_payload": "text"}, "payload must be a JSON object"),
    ("jobkit_enqueue", {"p_type": "a", "p_max_attempts": 0}, "max_attempts"),
    ("jobkit_enqueue", {"p_type": "a", "p_max_attempts": -3}, "max_attempts"),
    ("jobkit_enqueue", {"p_type": "a", "p_priority": 2_000_000}, "priority"),
    ("jobkit_enqueue", {"p_type": "a", "p_idempotency_key": ""}, "idempotency_key"),
    ("jobkit_enqueue", {"p_type": "a", "p_delay_seconds": -1}, "delay_seconds"),
    (
        "jobkit_enqueue",
        {"p_type": "a", "p_delay_seconds": 1, "p_run_after": "2030-01-01T00:00:00Z"},
        "not both",
    ),
    ("jobkit_enqueue_many", {"p_jobs": {"type": "a"}}, "p_jobs must be a JSON array"),
    ("jobkit_enqueue_many", {"p_jobs": None}, "p_jobs must be a JSON array"),
    ("jobkit_enqueue_many", {"p_jobs": [{"type": "a"}, 5]}, "job 1: must be a JSON object"),
    ("jobkit_enqueue_many", {"p_jobs": [{"type": "a"}, {"typo": "a"}]}, "job 1: has an unknown key"),
    ("jobkit_enqueue_many", {"p_jobs": [{"type": "a", "priority": 1.5}]}, "priority must be an integer"),
    ("jobkit_enqueue_many", {"p_jobs": [{"type": "a", "user_id": "nope"}]}, "user_id must be a uuid"),
    ("jobkit_enqueue_many", {"p_jobs": [{"type": "a"}] * 10001}, "at most 10000"),
    ("jobkit_claim", {"p_types": [], "p_worker": "w", "p_lease_seconds": 30}, "p_types"),
    ("jobkit_claim", {"p_types": None, "p_worker": "w", "p_lease_seconds": 30}, "p_types"),
    ("jobkit_claim", {"p_types": ["a", None], "p_worker": "w", "p_lease_seconds": 30}, "p_types"),
    ("jobkit_claim", {"p_types": ["a", ""], "p_worker": "w", "p_lease_seconds": 30}, "p_types"),
    ("jobkit_claim", {"p_types": ["a"], "p_worker": "", "p_lease_seconds": 30}, "p_worker"),
    ("jobkit_claim", {"p_types": ["a"], "p_worker": "w", "p_lease_seconds": 0}, "p_lease_seconds"),
    ("jobkit_claim", {"p_types": ["a"], "p_worker": "w", "p_lease_seconds": -5}, "p_lease_seconds"),
    ("jobkit_claim", {"p_types": ["a"], "p_worker": "w", "p_lease_seconds": 1e9}, "p_lease_seconds"),
    ("jobkit_claim", {"p_types": ["a"], "p_worker": "w", "p_lease_seconds": 30, "p_limit": 0}, "p_limit"),
    ("jobkit_claim", {"p_types": ["a"], "p_worker": "w", "p_lease_seconds": 30, "p_limit": -1}, "p_limit"),
    (
        "jobkit_claim",
        {"p_types": ["a"], "p_worker": "w", "p_lease_seconds": 30, "p_done_ids": [ID], "p_done_tokens": []},
        "p_done_ids and p_done_tokens",
    ),
    (
        "jobkit_claim",
        {"p_types": ["a"], "p_worker": "w", "p_lease_seconds": 30, "p_done_tokens": [TOKEN]},
        "p_done_ids and p_done_tokens",
    ),
    ("jobkit_complete", {"p_ids": [ID], "p_lease_tokens": []}, "equal length"),
    ("jobkit_complete", {"p_ids": None, "p_lease_tokens": [TOKEN]}, "equal length"),
    ("jobkit_complete", {"p_ids": [ID], "p_lease_tokens": [TOKEN], "p_delete": None}, "p_delete"),
    (
        "jobkit_claim",
        {"p_types": ["a"], "p_worker": "w", "p_lease_seconds": 30, "p_done_delete": None},
        "p_done_delete",
    ),
    ("jobkit_fail", {"p_id": ID, "p_lease_token": None, "p_error": "x"}, "p_lease_token"),
    (
        "jobkit_fail",
        {"p_id": ID, "p_lease_token": TOKEN, "p_error": "x", "p_retry_delay_seconds": -1},
        "p_retry_delay_seconds",
    ),
    ("jobkit_heartbeat", {"p_ids": [ID], "p_lease_tokens": [TOKEN], "p_lease_seconds": 0}, "p_lease_seconds"),
    ("jobkit_heartbeat", {"p_ids": None, "p_lease_tokens": [TOKEN], "p_lease_seconds": 5}, "p_ids"),
    ("jobkit_reclaim_expired", {"p_limit": 0}, "p_limit"),
    ("jobkit_prune", {"p_older_than_seconds": -1}, "p_older_than_seconds"),
    ("jobkit_prune", {"p_older_than_seconds": 1, "p_statuses": ["queued"]}, "p_statuses"),
    ("jobkit_prune", {"p_older_than_seconds": 1, "p_limit": 0}, "p_limit"),
    ("jobkit_list_jobs", {"p_limit": 0}, "p_limit"),
    ("jobkit_list_jobs", {"p_status": "done"}, "p_status"),
]


@pytest.mark.parametrize(("fn", "args", "message"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_bad_input(
    rest: Postgrest, pg: psycopg.Connection[Any], fn: str, args: dict[str, Any], message: str
) -> None:
    rest.rpc("jobkit_enqueue", {"p_type": "seed"}, SERVICE)
    before = pg.execute("select * from public.jobkit_jobs order by id").fetchall()
    with pytest.raises(PostgrestError) as info:
        rest.rpc(fn, args, SERVICE)
    assert info.value.code == "JK001", info.value
    assert message in info.value.message
    assert info.value.message.startswith("jobkit: ")
    assert pg.execute("select * from public.jobkit_jobs order by id").fetchall() == before


def test_batch_with_one_bad_job_writes_nothing(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    with pytest.raises(PostgrestError, match="job 2: type is required"):
        rest.rpc("jobkit_enqueue_many", {"p_jobs": [{"type": "a"}, {"type": "b"}, {}]}, SERVICE)
    assert pg.execute("select count(*) as n from public.jobkit_jobs").fetchone() == {"n": 0}


def test_unknown_job_for_requeue(rest: Postgrest) -> None:
    with pytest.raises(PostgrestError) as info:
        rest.rpc("jobkit_requeue", {"p_ids": [ID]}, SERVICE)
    assert info.value.code == "JK002"


def test_unknown_user_is_a_clear_error(rest: Postgrest) -> None:
    with pytest.raises(PostgrestError) as info:
        rest.rpc("jobkit_enqueue", {"p_type": "a", "p_user_id": ID}, SERVICE)
    assert info.value.code == "23503"  # foreign key: jobkit maps it to InvalidArgument


def test_table_rejects_invalid_rows_written_directly(pg: psycopg.Connection[Any]) -> None:
    bad_rows = [
        "insert into public.jobkit_jobs (type) values ('')",
        "insert into public.jobkit_jobs (type, payload) values ('a', '[]')",
        "insert into public.jobkit_jobs (type, attempts) values ('a', -1)",
        "insert into public.jobkit_jobs (type, max_attempts) values ('a', 0)",
        "insert into public.jobkit_jobs (type, status) values ('a', 'running')",
        "insert into public.jobkit_jobs (type, status) values ('a', 'paused')",
        "insert into public.jobkit_jobs (type, status, attempts) values ('a', 'succeeded', 0)",
        "insert into public.jobkit_jobs (type, attempts, max_attempts) values ('a', 4, 3)",
        "insert into public.jobkit_jobs (type, lease_until, lease_token) "
        "values ('a', now(), gen_random_uuid())",
    ]
    for statement in bad_rows:
        with pytest.raises(psycopg.errors.CheckViolation):
            pg.execute(statement.encode())


def test_table_rejects_invalid_updates_naming_the_rule(pg: psycopg.Connection[Any]) -> None:
    # One-column rules are domains, the rules across columns CHECKs: both name the rule, as before.
    job = pg.execute("insert into public.jobkit_jobs (type) values ('a') returning id").fetchone()
    assert job is not None
    bad = {
        "priority = 2000000": "jobkit_jobs_priority_valid",
        "status = 'paused'": "jobkit_jobs_status_valid",
        "payload = '[]'": "jobkit_jobs_payload_object",
        "progress = 2": "jobkit_jobs_progress_valid",
        "error = repeat('x', 4001)": "jobkit_jobs_error_bounded",
        "fair_key = ''": "jobkit_jobs_fair_key_valid",
        "fair_round = -1": "jobkit_jobs_fair_round_valid",
        "result = jsonb_build_object('x', repeat('x', 70000))": "jobkit_jobs_result_bounded",
        "status = 'succeeded'": "jobkit_jobs_finished_ran",
        "lease_token = gen_random_uuid(), lease_until = now()": "jobkit_jobs_lease_iff_running",
    }
    for change, rule in bad.items():
        with pytest.raises(psycopg.errors.CheckViolation) as info:
            pg.execute(f"update public.jobkit_jobs set {change} where id = %s".encode(), (job["id"],))
        assert info.value.diag.constraint_name == rule, change


# Every argument given (None is SQL null, not the default), typed as jobkit_enqueue declares it.
_ENQUEUE_ARGS = {
    "p_type": "text",
    "p_payload": "jsonb",
    "p_idempotency_key": "text",
    "p_priority": "integer",
    "p_max_attempts": "integer",
    "p_run_after": "timestamptz",
    "p_delay_seconds": "double precision",
    "p_fair_key": "text",
}
_ARGS = st.fixed_dictionaries(
    {
        "p_type": st.none()
        | st.text(max_size=3)
        | st.sampled_from(["a\x1fb", "a\x85", "x" * 200, "x" * 201]),
        "p_payload": st.sampled_from(["{}", '{"a": 1}', "null", "[1]", '"s"', "5", None]),
        "p_idempotency_key": st.none() | st.sampled_from(["", "k", "k" * 200, "k" * 201]),
        "p_priority": st.none() | st.sampled_from([-1_000_001, -1_000_000, 0, 1_000_000, 1_000_001]),
        "p_max_attempts": st.none() | st.sampled_from([-3, 0, 1, 3, 1000, 1001]),
        "p_run_after": st.none() | st.just("2030-01-01T00:00:00Z"),
        "p_delay_seconds": st.none()
        | st.sampled_from(
            [-1.0, -0.0, 0.0, 2.5, 315_576_000.0, 315_576_001.0, math.inf, -math.inf, math.nan]
        ),
        "p_fair_key": st.none() | st.sampled_from(["", "f", "f" * 201]),
    }
)


@settings(
    max_examples=200,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(args=_ARGS)
def test_enqueue_refuses_exactly_what_check_jobs_refuses(
    pg: psycopg.Connection[Any], args: dict[str, Any]
) -> None:
    # jobkit_enqueue asks jobkit_check_jobs only about jobs its own quick expression flags: that expression
    # must flag every job jobkit_check_jobs refuses, or a bad job would meet a bare domain error or, for
    # the rules no domain holds (delay_seconds), be written.
    typed = {name: f"%({name})s::{sqltype}" for name, sqltype in _ENQUEUE_ARGS.items()}
    built = ", ".join(f"'{name[2:]}', {expr}" for name, expr in typed.items() if name != "p_payload")
    row = pg.execute(
        f"select problem from public.jobkit_check_jobs(jsonb_build_array(jsonb_build_object({built},"
        " 'payload', coalesce(nullif(%(p_payload)s::jsonb, 'null'::jsonb), '{}'::jsonb))))",
        args,
    ).fetchone()
    problem = None if row is None else row["problem"]
    call = ", ".join(f"{name} => {expr}" for name, expr in typed.items())
    with pg.transaction(force_rollback=True):
        if problem is None:
            assert pg.execute(f"select inserted from public.jobkit_enqueue({call})", args).fetchone()
        else:
            with pytest.raises(psycopg.Error) as info:
                pg.execute(f"select inserted from public.jobkit_enqueue({call})", args)
            assert info.value.sqlstate == "JK001"
            assert info.value.diag.message_primary == f"jobkit: {problem}"
