"""The security review of 0.5.0 (issue 42): a signed-in user's pipelines that cannot pass, the waits they
store, what a LISTEN hears, what deleting a user leaves waiting, and a pipeline's cancel against a
completion. Each test failed on 0.5.0's SQL; under both Supabase default-privilege modes."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from tests.doubles.postgrest import Postgrest
from tests.sql.helpers import SERVICE, make_user, user_claims
from tests.sql.test_hostile import as_user, open_type

pytestmark = pytest.mark.parametrize("db_name", ["current", "legacy"], indirect=True)

WRITTEN = (
    "select pg_stat_get_xact_tuples_inserted('public.jobkit_jobs'::regclass)"
    " + pg_stat_get_xact_tuples_inserted('public.jobkit_pipeline_jobs'::regclass)"
    " + pg_stat_get_xact_tuples_inserted('public.jobkit_dependencies'::regclass) as n"
)


def refused(conn: psycopg.Connection[dict[str, Any]], statement: str, *params: Any) -> tuple[str, str, int]:
    """Run ``statement`` in a transaction of its own on the user's session, as the Data API does: the
    SQLSTATE and message it was refused with, and how many rows it wrote to the jobs and pipeline tables
    before (the session's count of rows it tried to insert, rolled back or not: read in one transaction,
    which no flush of the session's statistics interrupts)."""
    conn.execute("begin")
    try:
        before = conn.execute(WRITTEN).fetchone()
        conn.execute("savepoint s")
        with pytest.raises(psycopg.Error) as info:
            conn.execute(statement, params)
        conn.execute("rollback to savepoint s")
        after = conn.execute(WRITTEN).fetchone()
    finally:
        conn.execute("rollback")
    assert before is not None and after is not None
    return str(info.value.sqlstate), str(info.value.diag.message_primary), int(after["n"] - before["n"])


def pipeline(*jobs: dict[str, Any]) -> str:
    return json.dumps(list(jobs))


# --- 9. a pipeline that can never pass is refused before anything is written ------------------------------
@pytest.mark.parametrize("case", ["more than the limit", "with the jobs live", "created in the window"])
def test_a_pipeline_that_cannot_pass_is_refused_before_add_graph_validates_or_writes(
    db_url: str, rest: Postgrest, pg: psycopg.Connection[Any], case: str
) -> None:
    open_type(pg, "t", max_live_per_user=3, max_created_per_user=5, per_seconds=3600)
    user = make_user(pg)
    claims = user_claims(user)
    if case == "with the jobs live":
        for _ in range(2):
            rest.rpc("jobkit_user_enqueue", {"p_type": "t"}, claims)
    if case == "created in the window":  # cancelled jobs count: 4 of 5 created
        for _ in range(4):
            [job] = rest.rpc("jobkit_user_enqueue", {"p_type": "t"}, claims)
            rest.rpc("jobkit_user_cancel", {"p_id": job["id"]}, claims)
    adding = {"more than the limit": 4, "with the jobs live": 2, "created in the window": 2}[case]
    valid: list[dict[str, Any]] = [{"type": "t", "ref": "first"}]
    valid += [{"type": "t", "depends_on": ["first"]}] * (adding - 1)
    # the first job waits for one listed after it, which add_graph refuses (JK001) once it validates
    misordered: list[dict[str, Any]] = [{"type": "t", "depends_on": ["later"]}, {"type": "t", "ref": "later"}]
    misordered += [{"type": "t"}] * (adding - 2)
    call = "select public.jobkit_user_enqueue_pipeline(%s::jsonb)"
    with as_user(db_url, user) as conn:
        code, message, written = refused(conn, call, pipeline(*valid))
        assert (code, written) == ("JK003", 0), message
        assert refused(conn, call, pipeline(*misordered)) == ("JK003", message, 0)
    expected = {
        "more than the limit": "at most 3 live jobs of type t per user (max_live_per_user); this call adds 4",
        "with the jobs live": "at most 3 live jobs of type t per user (max_live_per_user); you have 2 and "
        "this call adds 2",
        "created in the window": "at most 5 jobs of type t per user in 3600 seconds (max_created_per_user); "
        "you created 4 and this call adds 2",
    }[case]
    assert message == f"jobkit: {expected}"


def test_a_pipeline_at_its_limits_passes_and_an_idempotent_retry_is_answered(
    db_url: str, pg: psycopg.Connection[Any]
) -> None:
    """The early count takes a key a live job holds for no new job: sending a pipeline again is answered
    with its jobs, however near the limit; and one job more than the limit is refused before its insert."""
    open_type(pg, "t", max_live_per_user=3)
    user = make_user(pg)
    jobs = pipeline(
        {"type": "t", "ref": "a", "idempotency_key": "a"},
        {"type": "t", "ref": "b", "idempotency_key": "b", "depends_on": ["a"]},
        {"type": "t", "idempotency_key": "b", "depends_on": ["a"]},  # the same key: the same job
        {"type": "t", "idempotency_key": "c", "depends_on": ["b"]},
    )
    with as_user(db_url, user) as conn:
        call = "select public.jobkit_user_enqueue_pipeline(%s::jsonb) as p"
        first = conn.execute(call, (jobs,)).fetchone()
        again = conn.execute(call, (jobs,)).fetchone()
        assert first is not None and again is not None
        assert [j["id"] for j in again["p"]["jobs"]] == [j["id"] for j in first["p"]["jobs"]]
        assert [j["inserted"] for j in again["p"]["jobs"]] == [False] * 4
        code, message, written = refused(conn, "select * from public.jobkit_user_enqueue('t', '{}', null)")
    assert (code, written) == ("JK003", 0), message
    assert message.endswith("(max_live_per_user); you have 3 and this call adds 1")


# --- 10. the waits a users' pipeline stores ----------------------------------------------------------------
def test_a_users_pipeline_waits_for_at_most_100_jobs_each_and_1000_in_all(
    db_url: str, pg: psycopg.Connection[Any]
) -> None:
    open_type(pg, "t", max_live_per_user=2000, max_created_per_user=2000)
    user = make_user(pg)
    refs = [{"type": "t", "ref": f"r{i}"} for i in range(100)]
    call = "select public.jobkit_user_enqueue_pipeline(%s::jsonb) as p"
    over_one = pipeline(*refs, {"type": "t", "depends_on": [f"r{i}" for i in range(100)] + ["r0"]})
    over_all = pipeline(*refs, *[{"type": "t", "depends_on": [f"r{i}" for i in range(91)]}] * 11)
    too_big = pipeline(*[{"type": "t", "payload": {"d": "x" * 60_000}}] * 18)
    with as_user(db_url, user) as conn:
        code, message, written = refused(conn, call, over_one)
        assert (code, written, message) == (
            "JK001",
            0,
            "jobkit: job 100: depends_on must name at most 100 jobs in a users' pipeline",
        )
        code, message, written = refused(conn, call, over_all)
        assert (code, written, message) == (
            "JK001",
            0,
            "jobkit: p_jobs waits for 1001 jobs in all; a users' pipeline waits for at most 1000",
        )
        code, message, written = refused(conn, call, too_big)
        assert (code, written) == ("JK001", 0) and "a users' pipeline is at most 1048576 (1 MiB)" in message
        # at the bounds: 100 waits of one job, 1000 in all
        fan_in = pipeline(*refs, *[{"type": "t", "depends_on": [f"r{i}" for i in range(100)]}] * 10)
        row = conn.execute(call, (fan_in,)).fetchone()
    assert row is not None and len(row["p"]["jobs"]) == 110
    stored = pg.execute("select count(*) as n from public.jobkit_dependencies where user_id = %s", (user,))
    assert stored.fetchone() == {"n": 1000}


# --- 11. what a LISTEN hears -------------------------------------------------------------------------------
def test_a_users_listen_hears_that_something_was_enqueued_and_nothing_of_what(
    db_url: str, rest: Postgrest, pg: psycopg.Connection[Any]
) -> None:
    open_type(pg, "t")
    user = make_user(pg)
    with as_user(db_url, user) as listener:
        listener.execute("listen jobkit_jobs")
        rest.rpc("jobkit_enqueue", {"p_type": "payroll-export"}, SERVICE)  # the app's own
        rest.rpc(
            "jobkit_enqueue_many",
            {"p_jobs": [{"type": "invoice-7731"}, {"type": "t", "user_id": make_user(pg)}]},
            SERVICE,
        )
        rest.rpc(
            "jobkit_enqueue_pipeline",
            {"p_jobs": [{"ref": "a", "type": "ledger"}, {"type": "x", "depends_on": ["a"]}]},
            SERVICE,
        )
        [job] = rest.rpc(
            "jobkit_claim", {"p_types": ["ledger"], "p_worker": "w", "p_lease_seconds": 30}, SERVICE
        )
        rest.rpc("jobkit_complete", {"p_ids": [job["id"]], "p_lease_tokens": [job["lease_token"]]}, SERVICE)
        rest.rpc("jobkit_user_enqueue", {"p_type": "t"}, user_claims(user))
        heard = [n.payload for n in listener.notifies(timeout=0.5)]
    assert heard == [""] * 5  # each woke the workers (a completion freed "x"), and none said what


# --- (a). deleting a user settles what waits for their jobs --------------------------------------------------
@pytest.fixture
def auth_admin(pg: psycopg.Connection[Any]) -> Iterator[str]:
    """A role like GoTrue's supabase_auth_admin: it may delete users, and holds no right on jobkit's tables."""
    name = f"jk_auth_admin_{pg.info.backend_pid}"
    pg.execute(sql.SQL("create role {} nologin").format(sql.Identifier(name)))
    pg.execute(sql.SQL("grant usage on schema auth to {}").format(sql.Identifier(name)))
    pg.execute(sql.SQL("grant select, delete on auth.users to {}").format(sql.Identifier(name)))
    try:
        yield name
    finally:
        pg.execute(sql.SQL("drop owned by {}").format(sql.Identifier(name)))
        pg.execute(sql.SQL("drop role {}").format(sql.Identifier(name)))


def test_deleting_a_user_settles_the_jobs_of_others_that_wait_for_theirs(
    db_url: str, rest: Postgrest, pg: psycopg.Connection[Any], auth_admin: str
) -> None:
    """A deleted user's jobs go with them (the foreign key); what other owners and the app had waiting for
    one of them ends as if it had been cancelled, as GoTrue's role deletes the user."""
    open_type(pg, "t")
    gone, other = make_user(pg), make_user(pg)
    [queued] = rest.rpc("jobkit_user_enqueue", {"p_type": "t"}, user_claims(gone))
    rest.rpc(
        "jobkit_user_enqueue_pipeline",
        {"p_jobs": [{"type": "t", "depends_on": [queued["id"]]}]},
        user_claims(gone),
    )
    rest.rpc("jobkit_enqueue", {"p_type": "r", "p_user_id": gone}, SERVICE)
    [running] = rest.rpc("jobkit_claim", {"p_types": ["r"], "p_worker": "w", "p_lease_seconds": 30}, SERVICE)
    jobs = [
        {"ref": "cancel", "type": "w", "user_id": other, "depends_on": [queued["id"]]},
        {"ref": "then", "type": "w", "user_id": other, "depends_on": ["cancel"]},
        {
            "ref": "run",
            "type": "w",
            "user_id": other,
            "depends_on": [{"job": queued["id"], "on_failure": "run"}],
        },
        {"ref": "app", "type": "w", "depends_on": [running["id"]]},
    ]
    app = rest.rpc("jobkit_enqueue_pipeline", {"p_jobs": jobs}, SERVICE)
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(sql.SQL("set role {}").format(sql.Identifier(auth_admin)))
        admin.execute("delete from auth.users where id = %s", (gone,))
    status = {
        str(r["id"]): r for r in pg.execute("select id, status, error from public.jobkit_jobs").fetchall()
    }
    assert {j["ref"]: status[j["id"]]["status"] for j in app["jobs"]} == {
        "cancel": "cancelled",
        "then": "cancelled",
        "run": "queued",
        "app": "cancelled",
    }
    assert f"job {queued['id']}, which it waits for, ended cancelled" in status[app["jobs"][0]["id"]]["error"]
    assert len(status) == 4  # the user's own went with them
    left = pg.execute(
        "select count(*) as n from public.jobkit_jobs j where j.status = 'waiting' and exists ("
        "  select from public.jobkit_dependencies d where d.job_id = j.id and d.outcome is null"
        "  and not exists (select from public.jobkit_jobs x where x.id = d.depends_on))"
    )
    assert left.fetchone() == {"n": 0}


# --- (b). a pipeline's cancel against the completion of one of its jobs ---------------------------------------
def _waits_on_a_lock(pg: psycopg.Connection[Any], conn: psycopg.Connection[Any]) -> None:
    pid = conn.info.backend_pid
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = pg.execute("select wait_event_type from pg_stat_activity where pid = %s", (pid,)).fetchone()
        if row is not None and row["wait_event_type"] == "Lock":
            return
        time.sleep(0.01)
    pytest.fail(f"session {pid} never waited on a lock")


def test_a_pipelines_cancel_and_a_completion_of_its_job_do_not_deadlock(
    db_url: str, pg: psycopg.Connection[Any]
) -> None:
    """The interleaving that deadlocked, held in place: a completes and waits (a third session holds c's
    counter) while holding a; the cancel, reading the table in its physical order (c's row before a's, which
    the claim moved), took c and waited for a; the completion then waited for c. Now the cancel locks in the
    pipeline's order, a first, and waits there holding nothing the completion needs."""
    p = pg.execute(
        "select public.jobkit_enqueue_pipeline("
        '\'[{"ref": "a", "type": "a"}, {"type": "c", "depends_on": ["a"]}]\') as p'
    ).fetchone()
    assert p is not None
    pipeline_id, c = p["p"]["pipeline_id"], p["p"]["jobs"][1]["id"]
    job = pg.execute("select id, lease_token from public.jobkit_claim(array['a'], 'w', 60)").fetchone()
    assert job is not None
    outcome: dict[str, Any] = {}

    def run(name: str, conn: psycopg.Connection[Any], statement: str, *params: Any) -> Callable[[], None]:
        def go() -> None:
            try:
                outcome[name] = conn.execute(statement, params).fetchall()
            except psycopg.Error as exc:
                outcome[name] = exc.sqlstate

        return go

    def session() -> psycopg.Connection[dict[str, Any]]:
        conn = psycopg.connect(db_url, autocommit=True, row_factory=dict_row)
        conn.execute("set role service_role")
        return conn

    with session() as holder, session() as completer, session() as canceller:
        canceller.execute("set enable_indexscan = off")  # the table read in its physical order
        canceller.execute("set enable_bitmapscan = off")
        holder.execute("begin")
        holder.execute("select from public.jobkit_pipeline_jobs where job_id = %s for no key update", (c,))
        complete = threading.Thread(
            target=run(
                "complete",
                completer,
                "select ok from public.jobkit_complete(array[%s]::uuid[], array[%s]::uuid[])",
                job["id"],
                job["lease_token"],
            )
        )
        complete.start()
        _waits_on_a_lock(pg, completer)  # holding a, waiting for c's counter
        cancel = threading.Thread(
            target=run("cancel", canceller, "select public.jobkit_cancel_pipeline(%s) as n", pipeline_id)
        )
        cancel.start()
        _waits_on_a_lock(pg, canceller)
        holder.execute("commit")
        complete.join(10)
        cancel.join(10)
    assert outcome == {"complete": [{"ok": True}], "cancel": [{"n": 1}]}  # c, freed, then cancelled
    rows = pg.execute("select type, status from public.jobkit_jobs order by type").fetchall()
    assert rows == [{"type": "a", "status": "succeeded"}, {"type": "c", "status": "cancelled"}]
