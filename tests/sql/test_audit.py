"""The security audit: every object the migrations create, and what each API role can do with it, checked
against one explicit table, under both Supabase default-privilege modes. A new object fails this test
until it is added here, on purpose."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.doubles.postgrest import Postgrest, PostgrestError
from tests.sql.helpers import SERVICE, make_user, user_claims

pytestmark = pytest.mark.parametrize("db_name", ["current", "legacy"], indirect=True)

NIL = "00000000-0000-0000-0000-000000000000"
FUNCTIONS = {  # name -> arguments for a harmless call
    "jobkit_enqueue": {"p_type": "audit"},
    "jobkit_enqueue_many": {"p_jobs": []},
    "jobkit_claim": {"p_types": ["nothing"], "p_worker": "audit", "p_lease_seconds": 1},
    "jobkit_complete": {"p_ids": [NIL], "p_lease_tokens": [NIL]},
    "jobkit_fail": {"p_id": NIL, "p_lease_token": NIL, "p_error": "x"},
    "jobkit_release": {"p_id": NIL, "p_lease_token": NIL},
    "jobkit_heartbeat": {"p_ids": [NIL], "p_lease_tokens": [NIL], "p_lease_seconds": 1},
    "jobkit_cancel": {"p_ids": [NIL]},
    "jobkit_progress": {"p_ids": [NIL], "p_lease_tokens": [NIL], "p_progress": [0.5], "p_messages": [None]},
    "jobkit_reclaim_expired": {},
    "jobkit_requeue": {"p_type": "nothing"},
    "jobkit_prune": {"p_older_than_seconds": 999999},
    "jobkit_stats": {},
    "jobkit_schema_version": {},
    "jobkit_get": {"p_id": NIL},
    "jobkit_list_jobs": {},
    "jobkit_check_jobs": {"p_jobs": [{"type": "a"}]},
    "jobkit_enqueue_many_json": {"p_jobs": []},
    "jobkit_enqueue_many_ids_json": {"p_jobs": []},
    "jobkit_fair_round": {"p_type": "a", "p_priority": 0, "p_fair_key": "k"},
    "jobkit_set_limit": {"p_type": "audit", "p_max_running": 1},
    "jobkit_delete_limit": {"p_type": "nothing"},
    "jobkit_list_limits": {},
    "jobkit_set_schedule": {"p_name": "audit", "p_cron": "* * * * *", "p_type": "audit"},
    "jobkit_delete_schedule": {"p_name": "nothing"},
    "jobkit_list_schedules": {},
    "jobkit_fire_schedule": {  # a stale last_due_at: fired = false, nothing enqueued
        "p_name": "audit-schedule",
        "p_last_due_at": "2000-01-01T00:00:00Z",
        "p_due": ["2000-01-01T00:00:01Z"],
    },
    "jobkit_enqueue_pipeline": {"p_jobs": []},
    "jobkit_complete_adding": {"p_id": NIL, "p_lease_token": NIL},
    "jobkit_cancel_pipeline": {"p_pipeline_id": NIL},
    "jobkit_worker_beat": {"p_worker": "audit"},
    "jobkit_worker_stop": {"p_worker": "audit"},
    "jobkit_list_workers": {},
    "jobkit_activity": {"p_since": "2000-01-01T00:00:00Z"},
    "jobkit_queue_depth": {},
    "jobkit_trace_contexts": {"p_ids": [NIL]},
    "jobkit_pipeline_of": {"p_id": NIL},
    "jobkit_traceback": {"p_id": NIL},
    "jobkit_project": {"p_jobs": []},
    "jobkit_outbox_enqueue": {"p_jobs": [{"type": "audit", "idempotency_key": "audit"}]},
    "jobkit_outbox_take": {},
    "jobkit_outbox_done": {"p_seqs": []},
}
# Reads through RLS: the service role reads every row, a signed-in user their own (tests/sql/test_pipelines).
READ_FUNCTIONS = {
    "jobkit_list_dependencies": {"p_id": NIL},
    "jobkit_get_pipeline": {"p_pipeline_id": NIL},
    "jobkit_pipeline_progress": {"p_pipeline_id": NIL},
}
# Tables a signed-in user reads their own rows of (RLS), and only service_role writes.
USER_READ_TABLES = ("jobkit_pipeline_jobs", "jobkit_dependencies")
# Tables only service_role may read and write (RLS on, one policy for service_role).
SERVICE_TABLES = (
    "jobkit_user_types",
    "jobkit_limits",
    "jobkit_starts",
    "jobkit_schedules",
    "jobkit_workers",
    "jobkit_activity",
    "jobkit_traces",
    "jobkit_tracebacks",
    "jobkit_projected",
    "jobkit_outbox",
)
TABLE_ROWS = {  # a row each table takes, for the insert check
    "jobkit_user_types": "(type) values ('y')",
    "jobkit_limits": "(type, max_running) values ('y', 1)",
    "jobkit_starts": "(type, started_at, n) values ('y', now(), 1)",
    "jobkit_schedules": "(name, cron, type) values ('y', '* * * * *', 'y')",
    "jobkit_workers": "(name) values ('y')",
    "jobkit_activity": "(minute, type, outcome) values (now(), 'y', 'lost')",
    "jobkit_traces": '(job_id, trace_context) values (gen_random_uuid(), \'{"y": "y"}\')',
    "jobkit_tracebacks": "(job_id, attempt, traceback) values (gen_random_uuid(), 1, 'y')",
    "jobkit_projected": "(job_id, version) values (gen_random_uuid(), 1)",
    "jobkit_outbox": """(job) values ('{"type": "y"}')""",
}
TABLE_KEYS = {  # (column, a value no row has, the test row's value), for tables not keyed by a type
    "jobkit_schedules": ("name", "'nothing-matches'", "'y'"),
    "jobkit_workers": ("name", "'nothing-matches'", "'y'"),
    "jobkit_traces": ("trace_context", '\'{"nothing": "matches"}\'', '\'{"y": "y"}\''),
    "jobkit_tracebacks": ("traceback", "'nothing-matches'", "'y'"),
    "jobkit_projected": ("version", "0", "1"),
    "jobkit_outbox": ("job", """'{"nothing": 1}'""", """'{"type": "y"}'"""),
}
# What signed-in users may call: enqueue for themselves (an open type), cancel their own (JK002: no such
# job of theirs). Everyone else is refused.
USER_FUNCTIONS = {
    "jobkit_user_enqueue": ({"p_type": "audit-open"}, "allowed"),
    "jobkit_user_cancel": ({"p_id": NIL}, "error JK002"),
    "jobkit_user_enqueue_pipeline": ({"p_jobs": [{"type": "audit-open"}]}, "allowed"),
    "jobkit_user_cancel_pipeline": ({"p_pipeline_id": NIL}, "error JK002"),
}
ROLES = ("anon", "authenticated", "service_role")
# What each role may do. "own rows" = select, filtered by RLS to user_id = auth.uid(), user columns only.
EXPECTED: dict[str, dict[str, str]] = {
    "table jobkit_jobs: select": {"anon": "denied", "authenticated": "own rows", "service_role": "all rows"},
    "table jobkit_jobs: insert": {"anon": "denied", "authenticated": "denied", "service_role": "allowed"},
    "table jobkit_jobs: update": {"anon": "denied", "authenticated": "denied", "service_role": "allowed"},
    "table jobkit_jobs: delete": {"anon": "denied", "authenticated": "denied", "service_role": "allowed"},
    "table jobkit_jobs: truncate": {"anon": "denied", "authenticated": "denied", "service_role": "denied"},
    "function jobkit_touch (trigger)": {
        "anon": "denied",
        "authenticated": "denied",
        "service_role": "allowed",
    },
    **{
        f"function {fn}": {"anon": "denied", "authenticated": "denied", "service_role": "allowed"}
        for fn in FUNCTIONS
    },
    **{
        f"function {fn}": {"anon": "denied", "authenticated": outcome, "service_role": "denied"}
        for fn, (_, outcome) in USER_FUNCTIONS.items()
    },
    **{
        f"table {table}: {verb}": {"anon": "denied", "authenticated": "denied", "service_role": "allowed"}
        for table in SERVICE_TABLES
        for verb in ("select", "insert", "update", "delete")
    },
    **{
        f"function {fn}": {"anon": "denied", "authenticated": "allowed", "service_role": "allowed"}
        for fn in READ_FUNCTIONS
    },
    **{
        f"table {table}: {verb}": {
            "anon": "denied",
            "authenticated": "allowed" if verb == "select" else "denied",
            "service_role": "allowed",
        }
        for table in USER_READ_TABLES
        for verb in ("select", "insert", "update", "delete")
    },
}
OBJECTS = {  # (kind, name) the migrations create in public; indexes and the policy ride on the table
    ("r", "jobkit_jobs"),
    ("i", "jobkit_jobs_pkey"),
    ("i", "jobkit_jobs_idempotency_key"),
    ("i", "jobkit_jobs_claim"),
    ("i", "jobkit_jobs_lease"),
    ("i", "jobkit_jobs_user_created"),
    *{("f", fn) for fn in FUNCTIONS},
    *{("f", fn) for fn in USER_FUNCTIONS},
    ("f", "jobkit_touch"),
    ("i", "jobkit_jobs_user_live"),
    ("r", "jobkit_user_types"),
    ("i", "jobkit_user_types_pkey"),
    ("i", "jobkit_jobs_fair"),
    ("r", "jobkit_limits"),
    ("i", "jobkit_limits_pkey"),
    ("r", "jobkit_starts"),
    ("i", "jobkit_starts_pkey"),
    ("r", "jobkit_schedules"),
    ("i", "jobkit_schedules_pkey"),
    *{("f", fn) for fn in READ_FUNCTIONS},
    ("r", "jobkit_pipeline_jobs"),
    ("S", "jobkit_pipeline_jobs_seq_seq"),
    ("i", "jobkit_pipeline_jobs_pkey"),
    ("i", "jobkit_pipeline_jobs_pipeline"),
    ("i", "jobkit_pipeline_jobs_user"),
    ("r", "jobkit_dependencies"),
    ("i", "jobkit_dependencies_pkey"),
    ("i", "jobkit_dependencies_open"),
    ("i", "jobkit_dependencies_on"),
    ("r", "jobkit_workers"),
    ("i", "jobkit_workers_pkey"),
    ("r", "jobkit_activity"),
    ("i", "jobkit_activity_pkey"),
    ("r", "jobkit_traces"),
    ("i", "jobkit_traces_pkey"),
    ("i", "jobkit_traces_created"),
    ("r", "jobkit_tracebacks"),
    ("i", "jobkit_tracebacks_pkey"),
    ("i", "jobkit_tracebacks_failed"),
    ("i", "jobkit_tracebacks_user"),
    ("r", "jobkit_projected"),  # the view of a JetStream queue (75_projection.sql)
    ("i", "jobkit_projected_pkey"),
    ("r", "jobkit_outbox"),  # enqueues in the app's SQL for a JetStream queue (76_outbox.sql)
    ("i", "jobkit_outbox_pkey"),
    ("i", "jobkit_outbox_pending"),
    ("S", "jobkit_outbox_seq_seq"),
}
# jobkit_private: not exposed by the Data API. The trigger functions and the one they send through exist
# where Realtime does.
PRIVATE = {
    ("f", "user_enqueue"),
    ("f", "user_cancel"),
    ("f", "broadcast_job"),
    ("f", "wake_workers"),
    ("f", "send"),
    ("f", "complete_after_lock_wait"),
    ("f", "complete_done"),
    ("f", "check_claim_args"),
    ("f", "open_limits"),
    ("f", "pick_limited"),
    ("f", "pick_after"),
    ("c", "claim_limits"),  # the composite type open_limits answers
    ("f", "insert_jobs"),
    ("f", "release_waiters"),
    ("f", "settle"),  # 0.5.1's name of release_waiters, kept for one release (88_compat.sql)
    ("f", "complete_held"),  # 0.5.1's name of complete_after_lock_wait, likewise
    ("f", "settle_deleted"),  # the trigger that settles what waits for a deleted job
    ("f", "add_graph"),
    ("f", "check_graph_keys"),
    ("f", "graph_edges"),
    ("f", "insert_graph"),
    ("c", "edge"),  # one wait of a graph's element, as add_graph reads it
    ("f", "cancel_pipeline"),
    ("f", "user_limits"),
    ("f", "user_enqueue_pipeline"),
    ("f", "user_cancel_pipeline"),
    ("f", "wake_released"),
    ("f", "refuse_projected"),
    ("f", "refuse_users_enqueue"),
}


def _outcome(call: Any) -> str:
    try:
        call()
    except PostgrestError as exc:
        return "denied" if exc.code == "42501" else f"error {exc.code}"
    return "allowed"


def _run_as(rest: Postgrest, claims: dict[str, Any], statement: str) -> str:
    """The outcome of one SQL statement run as PostgREST would run it for ``claims``."""
    return _outcome(
        lambda: rest.transaction(
            claims, method="POST", path="/", read_only=False, query=psycopg.sql.SQL(statement), params=[]
        )
    )


def test_every_object_is_in_the_audit(pg: psycopg.Connection[Any]) -> None:
    rows = pg.execute(
        "select relkind::text as kind, relname as name from pg_class "
        "where relnamespace = 'public'::regnamespace union all "
        "select 'f', proname from pg_proc where pronamespace = 'public'::regnamespace"
    ).fetchall()
    assert {(r["kind"], r["name"]) for r in rows} == OBJECTS
    private = pg.execute(
        "select relkind::text as kind, relname as name from pg_class "
        "where relnamespace = 'jobkit_private'::regnamespace union all "
        "select 'f', proname from pg_proc where pronamespace = 'jobkit_private'::regnamespace"
    ).fetchall()
    assert {(r["kind"], r["name"]) for r in private} == PRIVATE
    policies = pg.execute(
        "select policyname, roles::text[] as roles, cmd from pg_policies where schemaname = 'public' order by 1"
    ).fetchall()
    assert policies == [
        {"policyname": "jobkit_activity_service", "roles": ["service_role"], "cmd": "ALL"},
        {"policyname": "jobkit_dependencies_select_own", "roles": ["authenticated"], "cmd": "SELECT"},
        {"policyname": "jobkit_jobs_select_own", "roles": ["authenticated"], "cmd": "SELECT"},
        {"policyname": "jobkit_limits_service", "roles": ["service_role"], "cmd": "ALL"},
        {"policyname": "jobkit_outbox_service", "roles": ["service_role"], "cmd": "ALL"},
        {"policyname": "jobkit_pipeline_jobs_select_own", "roles": ["authenticated"], "cmd": "SELECT"},
        {"policyname": "jobkit_projected_service", "roles": ["service_role"], "cmd": "ALL"},
        {"policyname": "jobkit_schedules_service", "roles": ["service_role"], "cmd": "ALL"},
        {"policyname": "jobkit_starts_service", "roles": ["service_role"], "cmd": "ALL"},
        {"policyname": "jobkit_tracebacks_service", "roles": ["service_role"], "cmd": "ALL"},
        {"policyname": "jobkit_traces_service", "roles": ["service_role"], "cmd": "ALL"},
        {"policyname": "jobkit_user_types_service", "roles": ["service_role"], "cmd": "ALL"},
        {"policyname": "jobkit_workers_service", "roles": ["service_role"], "cmd": "ALL"},
    ]
    # Callable only by the roles that should: the definer functions run the checks for signed-in users.
    private_rights = pg.execute(
        "select p.proname, p.prosecdef, has_function_privilege('anon', p.oid, 'EXECUTE') as anon, "
        "has_function_privilege('authenticated', p.oid, 'EXECUTE') as authenticated "
        "from pg_proc p where p.pronamespace = 'jobkit_private'::regnamespace order by 1"
    ).fetchall()
    assert private_rights == [
        {"proname": "add_graph", "prosecdef": False, "anon": False, "authenticated": False},
        {"proname": "broadcast_job", "prosecdef": True, "anon": False, "authenticated": False},
        {"proname": "cancel_pipeline", "prosecdef": False, "anon": False, "authenticated": False},
        {"proname": "check_claim_args", "prosecdef": False, "anon": False, "authenticated": False},
        {"proname": "check_graph_keys", "prosecdef": False, "anon": False, "authenticated": False},
        {"proname": "complete_after_lock_wait", "prosecdef": False, "anon": False, "authenticated": False},
        {"proname": "complete_done", "prosecdef": False, "anon": False, "authenticated": False},
        {"proname": "complete_held", "prosecdef": False, "anon": False, "authenticated": False},
        {"proname": "graph_edges", "prosecdef": False, "anon": False, "authenticated": False},
        {"proname": "insert_graph", "prosecdef": False, "anon": False, "authenticated": False},
        {"proname": "insert_jobs", "prosecdef": False, "anon": False, "authenticated": False},
        {"proname": "open_limits", "prosecdef": False, "anon": False, "authenticated": False},
        {"proname": "pick_after", "prosecdef": False, "anon": False, "authenticated": False},
        {"proname": "pick_limited", "prosecdef": False, "anon": False, "authenticated": False},
        {"proname": "refuse_projected", "prosecdef": False, "anon": False, "authenticated": False},
        {"proname": "refuse_users_enqueue", "prosecdef": True, "anon": False, "authenticated": True},
        {"proname": "release_waiters", "prosecdef": False, "anon": False, "authenticated": False},
        {"proname": "send", "prosecdef": False, "anon": False, "authenticated": False},
        {"proname": "settle", "prosecdef": False, "anon": False, "authenticated": False},
        {"proname": "settle_deleted", "prosecdef": True, "anon": False, "authenticated": False},
        {"proname": "user_cancel", "prosecdef": True, "anon": False, "authenticated": True},
        {"proname": "user_cancel_pipeline", "prosecdef": True, "anon": False, "authenticated": True},
        {"proname": "user_enqueue", "prosecdef": True, "anon": False, "authenticated": True},
        {"proname": "user_enqueue_pipeline", "prosecdef": True, "anon": False, "authenticated": True},
        {"proname": "user_limits", "prosecdef": False, "anon": False, "authenticated": False},
        {"proname": "wake_released", "prosecdef": True, "anon": False, "authenticated": False},
        {"proname": "wake_workers", "prosecdef": True, "anon": False, "authenticated": False},
    ]
    realtime = pg.execute(
        "select policyname, permissive, roles::text[] as roles, cmd from pg_policies "
        "where schemaname = 'realtime' order by 1"
    ).fetchall()
    users = ["anon", "authenticated"]
    assert realtime == [
        {"policyname": "jobkit_topics_insert", "permissive": "RESTRICTIVE", "roles": users, "cmd": "INSERT"},
        {"policyname": "jobkit_topics_read", "permissive": "RESTRICTIVE", "roles": users, "cmd": "SELECT"},
        {"policyname": "jobkit_topics_update", "permissive": "RESTRICTIVE", "roles": users, "cmd": "UPDATE"},
        {
            "policyname": "jobkit_user_topic",
            "permissive": "PERMISSIVE",
            "roles": ["authenticated"],
            "cmd": "SELECT",
        },
    ]


def test_what_each_role_can_do(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    owner, other = make_user(pg), make_user(pg)
    pg.execute("insert into public.jobkit_user_types (type) values ('audit-open')")
    pg.execute(
        "insert into public.jobkit_schedules (name, cron, type) values ('audit-schedule', '* * * * *', 'a')"
    )
    [job] = rest.rpc("jobkit_enqueue", {"p_type": "audit", "p_user_id": owner}, SERVICE)
    claims = {"anon": {"role": "anon"}, "authenticated": user_claims(other), "service_role": SERVICE}
    cols = ["id", "type", "status"]
    actual: dict[str, dict[str, str]] = {key: {} for key in EXPECTED}
    for role in ROLES:
        c = claims[role]

        def select(c: dict[str, Any] = c) -> None:
            seen = rest.select("jobkit_jobs", cols, c)
            if not any(r["id"] == job["id"] for r in seen):
                raise PostgrestError("own", "cannot see the owner's row", 200)

        sel = _outcome(select)
        actual["table jobkit_jobs: select"][role] = {"allowed": "all rows", "error own": "own rows"}.get(
            sel, sel
        )
        if sel == "error own":  # it reads, but not another user's row: check it reads its own
            mine = rest.rpc("jobkit_enqueue", {"p_type": "mine", "p_user_id": other}, SERVICE)[0]
            assert [r["id"] for r in rest.select("jobkit_jobs", cols, c)] == [mine["id"]]
            pg.execute("delete from public.jobkit_jobs where id = %s", (mine["id"],))
        statements = {
            "insert": "insert into public.jobkit_jobs (type) values ('x') returning id",
            "update": "update public.jobkit_jobs set priority = priority",
            "delete": "delete from public.jobkit_jobs where type = 'nothing-matches'",
            "truncate": "truncate public.jobkit_jobs",
        }
        for verb, statement in statements.items():
            actual[f"table jobkit_jobs: {verb}"][role] = _run_as(rest, c, statement)
            pg.execute("delete from public.jobkit_jobs where type = 'x'")
        calls = FUNCTIONS | READ_FUNCTIONS | {fn: args for fn, (args, _) in USER_FUNCTIONS.items()}
        for fn, args in calls.items():
            actual[f"function {fn}"][role] = _outcome(lambda fn=fn, args=args, c=c: rest.rpc(fn, args, c))
        for table in SERVICE_TABLES:
            column, nothing, test_row = TABLE_KEYS.get(table, ("type", "'nothing-matches'", "'y'"))
            table_statements = {
                "select": f"select * from public.{table}",
                "insert": f"insert into public.{table} {TABLE_ROWS[table]}",
                "update": f"update public.{table} set {column} = {column}",
                "delete": f"delete from public.{table} where {column} = {nothing}",
            }
            for verb, statement in table_statements.items():
                actual[f"table {table}: {verb}"][role] = _run_as(rest, c, statement)
                pg.execute(f"delete from public.{table} where {column} = {test_row}")
        for table in USER_READ_TABLES:
            table_statements = {
                "select": f"select * from public.{table}",
                "insert": f"insert into public.{table} (job_id) select '{NIL}'::uuid where false",
                "update": f"update public.{table} set job_id = job_id",
                "delete": f"delete from public.{table} where job_id = '{NIL}'",
            }
            for verb, statement in table_statements.items():
                actual[f"table {table}: {verb}"][role] = _run_as(rest, c, statement)
        ok = rest.transaction(
            c,
            method="GET",
            path="/",
            read_only=True,
            params=[],
            query=psycopg.sql.SQL("select has_function_privilege('public.jobkit_touch()', 'EXECUTE') as ok"),
        )
        actual["function jobkit_touch (trigger)"][role] = "allowed" if ok[0]["ok"] else "denied"
    assert actual == EXPECTED
