"""The PostgREST emulation itself behaves like PostgREST where jobkit depends on it."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.doubles.postgrest import Postgrest, PostgrestError, http_status
from tests.sql.helpers import SERVICE, make_user, user_claims


def test_claims_reach_auth_uid(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    user = make_user(pg)
    rows = rest.execute("select auth.uid()::text as uid, current_user as role", [], user_claims(user))
    assert rows == [{"uid": user, "role": "authenticated"}]


def test_stable_function_runs_read_only(rest: Postgrest) -> None:
    with pytest.raises(PostgrestError) as info:
        rest.execute("create table public.nope (x int)", [], SERVICE, method="GET")
    assert info.value.code == "25006"


def test_each_request_is_its_own_transaction(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    with pytest.raises(PostgrestError):
        rest.rpc("jobkit_enqueue_many", {"p_jobs": [{"type": "a"}, {"type": ""}]}, SERVICE)
    rest.rpc("jobkit_enqueue", {"p_type": "a"}, SERVICE)
    assert pg.execute("select count(*) as n from public.jobkit_jobs").fetchone() == {"n": 1}


@pytest.mark.parametrize(
    ("claims", "timeout"),
    [({"role": "anon"}, "3s"), ({"role": "authenticated"}, "8s"), (SERVICE, "8s")],
)
def test_requests_run_under_the_roles_statement_timeout(
    rest: Postgrest, claims: dict[str, Any], timeout: str
) -> None:
    [row] = rest.execute("select current_setting('statement_timeout') as t", [], claims)
    assert row == {"t": timeout}


def test_a_statement_past_the_timeout_fails_as_on_supabase(rest: Postgrest) -> None:
    with pytest.raises(PostgrestError) as info:
        rest.execute("select pg_sleep(3.5)", [], {"role": "anon"})
    assert (info.value.code, info.value.status) == ("57014", 500)


def test_max_rows_cuts_the_answer_not_the_work(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    """What PostgREST does to a set-returning call of 1,500 rows: 1,000 come back, 1,500 were inserted."""
    jobs = [{"type": "a"}] * 1500
    assert len(rest.rpc("jobkit_enqueue_many", {"p_jobs": jobs}, SERVICE)) == 1000
    assert pg.execute("select count(*) as n from public.jobkit_jobs").fetchone() == {"n": 1500}
    assert len(rest.rpc("jobkit_enqueue_many_json", {"p_jobs": jobs}, SERVICE)) == 1500  # one value: whole


@pytest.mark.parametrize(
    ("sqlstate", "status"),
    [
        ("57P01", 503),  # admin shutdown
        ("57014", 500),  # statement timeout
        ("08006", 503),
        ("53100", 503),
        ("53400", 500),
        ("40001", 500),
        ("40P01", 500),
        ("55P03", 500),
        ("58030", 500),
        ("XX000", 500),
        ("P0001", 400),
        ("P0002", 500),
        ("P0003", 500),
        ("P0004", 500),
        ("23505", 409),
        ("23503", 409),
        ("25006", 405),
        ("28P01", 403),
        ("42883", 404),
        ("42P01", 404),
        ("42P17", 500),
        ("JK001", 400),
        ("JK002", 400),
        ("22P02", 400),
        ("PT402", 402),
    ],
)
def test_status_table_is_postgrests(sqlstate: str, status: int) -> None:
    assert http_status(sqlstate) == status


def test_permission_denied_is_401_for_anon_and_403_for_others() -> None:
    assert http_status("42501", authenticated=False) == 401
    assert http_status("42501", authenticated=True) == 403
