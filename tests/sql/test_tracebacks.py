"""A failure's traceback, as PostgREST serves it: the operator reads it (jobkit_traceback), the job's owner
reads the one-line error on their row and never the traceback, and the table holds no more than its bound;
under both default-privilege modes."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.doubles.postgrest import Postgrest, PostgrestError
from tests.sql.helpers import SERVICE, make_user, user_claims
from tests.sql.test_security import USER_COLUMNS

pytestmark = pytest.mark.parametrize("db_name", ["current", "legacy"], indirect=True)

TRACEBACK = (
    "Traceback (most recent call last):\n  File \"/srv/app/handlers.py\", line 42, in embed\nKeyError: 's'\n"
)


def _failed_job_of(rest: Postgrest, user: str) -> str:
    [job] = rest.rpc("jobkit_enqueue", {"p_type": "embed", "p_user_id": user}, SERVICE)
    [c] = rest.rpc("jobkit_claim", {"p_types": ["embed"], "p_worker": "w", "p_lease_seconds": 30}, SERVICE)
    args = {"p_id": c["id"], "p_lease_token": c["lease_token"], "p_error": "KeyError: 's'"}
    [f] = rest.rpc("jobkit_fail", args | {"p_traceback": TRACEBACK, "p_max_attempts": 5}, SERVICE)
    assert f["ok"] and f["status"] == "retrying"
    return str(job["id"])


def test_the_owner_reads_the_error_and_never_the_traceback(
    rest: Postgrest, pg: psycopg.Connection[Any]
) -> None:
    user = make_user(pg)
    job_id = _failed_job_of(rest, user)
    [row] = rest.select("jobkit_jobs", USER_COLUMNS, user_claims(user))
    assert (row["id"], row["error"], row["max_attempts"]) == (job_id, "KeyError: 's'", 5)
    assert "handlers.py" not in str(row)
    for claims in (user_claims(user), {"role": "anon"}):
        with pytest.raises(PostgrestError) as read:
            rest.select("jobkit_tracebacks", ["job_id", "traceback"], claims)
        assert read.value.code == "42501"
        with pytest.raises(PostgrestError) as call:
            rest.rpc("jobkit_traceback", {"p_id": job_id}, claims)
        assert call.value.code == "42501"
    [kept] = rest.rpc("jobkit_traceback", {"p_id": job_id}, SERVICE)
    assert (kept["attempt"], kept["traceback"]) == (1, TRACEBACK)


def test_the_table_holds_a_traceback_of_at_most_8000_characters(
    rest: Postgrest, pg: psycopg.Connection[Any]
) -> None:
    job_id = _failed_job_of(rest, make_user(pg))
    with pytest.raises(psycopg.errors.CheckViolation, match="jobkit_tracebacks_bounded"):
        pg.execute(
            "update public.jobkit_tracebacks set traceback = repeat('x', 8001) where job_id = %s", (job_id,)
        )
    # what jobkit_fail is handed beyond it, it keeps the end of, whoever calls it
    [c] = rest.rpc("jobkit_claim", {"p_types": ["embed"], "p_worker": "w", "p_lease_seconds": 30}, SERVICE)
    args = {
        "p_id": c["id"],
        "p_lease_token": c["lease_token"],
        "p_error": "x",
        "p_traceback": "a" * 9000 + "end",
    }
    rest.rpc("jobkit_fail", args, SERVICE)
    [kept] = rest.rpc("jobkit_traceback", {"p_id": job_id}, SERVICE)
    assert kept["attempt"] == 2 and len(kept["traceback"]) == 8000 and kept["traceback"].endswith("aend")


def test_a_users_tracebacks_go_with_the_user(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    """A traceback may quote what the user's job held: deleting the user deletes it, as it does their jobs
    (the foreign key to auth.users), and leaves another user's."""
    gone, stays = make_user(pg), make_user(pg)
    kept_job = _failed_job_of(rest, stays)
    pg.execute(
        "update public.jobkit_jobs set run_after = now() + interval '1 hour' where id = %s", (kept_job,)
    )
    gone_job = _failed_job_of(rest, gone)  # not the retrying one: it waits an hour
    pg.execute("delete from auth.users where id = %s", (gone,))
    assert rest.rpc("jobkit_traceback", {"p_id": gone_job}, SERVICE) == []
    assert [r["attempt"] for r in rest.rpc("jobkit_traceback", {"p_id": kept_job}, SERVICE)] == [1]
