"""The users' side in SQL: jobkit_user_enqueue and jobkit_user_cancel called exactly as PostgREST calls them
with a signed-in user's claims, under both default-privilege modes."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.doubles.postgrest import Postgrest, PostgrestError
from tests.sql.helpers import SERVICE, make_user, user_claims

pytestmark = pytest.mark.parametrize("db_name", ["current", "legacy"], indirect=True)


@pytest.fixture
def open_types(pg: psycopg.Connection[Any]) -> None:
    pg.execute(
        "insert into public.jobkit_user_types (type, max_live_per_user, max_attempts, priority, max_payload_bytes) "
        "values ('transcribe', 2, 5, 7, 100), ('sync', 10, 3, 0, 65536)"
    )


def start(rest: Postgrest, user: str, type: str = "transcribe", **args: Any) -> dict[str, Any]:
    rows: list[dict[str, Any]] = rest.rpc("jobkit_user_enqueue", {"p_type": type, **args}, user_claims(user))
    return rows[0]


def code(call: Any) -> str | None:
    try:
        call()
    except PostgrestError as exc:
        return exc.code
    return None


@pytest.mark.usefixtures("open_types")
def test_a_user_starts_jobs_for_themselves_with_the_types_rules(
    rest: Postgrest, pg: psycopg.Connection[Any]
) -> None:
    a = make_user(pg)
    job = start(rest, a, p_payload={"upload": 1})
    assert job["inserted"] and job["user_id"] == a and job["status"] == "queued"
    assert (job["max_attempts"], job["priority"]) == (5, 7)  # the type's, not the caller's
    assert "lease_token" not in job and "claimed_by" not in job
    assert set(job) >= {"id", "type", "payload", "created_at"}


@pytest.mark.usefixtures("open_types")
def test_what_users_cannot_do(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    a = make_user(pg)
    assert code(lambda: start(rest, a, type="embed")) == "JK001"  # a type nobody opened
    assert code(lambda: start(rest, a, p_payload={"x": "y" * 200})) == "JK001"  # over the type's 100 bytes
    assert code(lambda: rest.rpc("jobkit_user_enqueue", {"p_type": "sync"}, {"role": "anon"})) == "42501"
    assert code(lambda: rest.rpc("jobkit_user_enqueue", {"p_type": "sync"}, SERVICE)) == "42501"
    # The user id is never an argument: a user cannot start a job as someone else.
    b = make_user(pg)
    assert code(
        lambda: rest.rpc("jobkit_user_enqueue", {"p_type": "sync", "p_user_id": b}, user_claims(a))
    ) in (
        "PGRST202",
        "42883",
    )
    # Nor reach the functions behind the entry points, or the worker's.
    assert code(lambda: rest.rpc("jobkit_enqueue", {"p_type": "sync"}, user_claims(a))) == "42501"
    assert code(lambda: rest.rpc("jobkit_cancel", {"p_ids": []}, user_claims(a))) == "42501"


@pytest.mark.usefixtures("open_types")
def test_each_users_keys_are_their_own(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    a, b = make_user(pg), make_user(pg)
    first = start(rest, a, type="sync", p_idempotency_key="drive")
    again = start(rest, a, type="sync", p_idempotency_key="drive")
    theirs = start(rest, b, type="sync", p_idempotency_key="drive")
    assert first["inserted"] and not again["inserted"] and again["id"] == first["id"]
    assert theirs["inserted"] and theirs["id"] != first["id"] and theirs["user_id"] == b
    # A service-role job with the same plain key is another job again.
    [plain] = rest.rpc("jobkit_enqueue", {"p_type": "sync", "p_idempotency_key": "drive"}, SERVICE)
    assert plain["inserted"]


@pytest.mark.usefixtures("open_types")
def test_live_jobs_per_user_are_limited(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    a, b = make_user(pg), make_user(pg)
    one, _ = start(rest, a), start(rest, a)
    assert code(lambda: start(rest, a)) == "JK003"  # at most 2 live transcribe jobs per user
    assert start(rest, a, p_idempotency_key=None, type="sync")["inserted"]  # another type: its own limit
    assert start(rest, b)["inserted"]  # another user: their own limit
    rest.rpc("jobkit_user_cancel", {"p_id": one["id"]}, user_claims(a))
    assert start(rest, a)["inserted"]  # a cancelled job no longer counts


@pytest.mark.usefixtures("open_types")
def test_a_user_cancels_only_their_own_jobs(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    a, b = make_user(pg), make_user(pg)
    job = start(rest, a)
    assert code(lambda: rest.rpc("jobkit_user_cancel", {"p_id": job["id"]}, user_claims(b))) == "JK002"
    [service_job] = rest.rpc("jobkit_enqueue", {"p_type": "sync"}, SERVICE)
    assert (
        code(lambda: rest.rpc("jobkit_user_cancel", {"p_id": service_job["id"]}, user_claims(a))) == "JK002"
    )
    assert code(lambda: rest.rpc("jobkit_user_cancel", {"p_id": job["id"]}, {"role": "anon"})) == "42501"
    [done] = rest.rpc("jobkit_user_cancel", {"p_id": job["id"]}, user_claims(a))
    assert done == {"id": job["id"], "cancelled": True, "status": "cancelled"}
    row = pg.execute("select status, error from public.jobkit_jobs where id = %s", (job["id"],)).fetchone()
    assert row == {"status": "cancelled", "error": "cancelled by its user"}
