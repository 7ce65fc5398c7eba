"""The PostgREST emulation itself behaves like PostgREST where jobkit depends on it."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.postgrest import Postgrest, PostgrestError
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
