"""RLS, grants and the function audit, run as PostgREST would, under both default-privilege modes."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.doubles.postgrest import Postgrest, PostgrestError
from tests.sql.helpers import SERVICE, make_user, user_claims

pytestmark = pytest.mark.parametrize("db_name", ["current", "legacy"], indirect=True)

USER_COLUMNS = [
    "id",
    "user_id",
    "type",
    "status",
    "payload",
    "idempotency_key",
    "attempts",
    "max_attempts",
    "priority",
    "run_after",
    "error",
    "created_at",
    "updated_at",
    "progress",
    "progress_message",
    "result",
    "started_at",
]
ANON = {"role": "anon"}
NIL = "00000000-0000-0000-0000-000000000000"


def seed(rest: Postgrest, pg: psycopg.Connection[Any]) -> tuple[str, str, dict[str, list[str]]]:
    a, b = make_user(pg), make_user(pg)
    jobs: dict[str, list[str]] = {a: [], b: [], "system": []}
    for owner, t in [(a, "embed"), (a, "sync"), (b, "embed"), (None, "embed")]:
        [j] = rest.rpc("jobkit_enqueue", {"p_type": t, "p_user_id": owner}, SERVICE)
        jobs[owner or "system"].append(j["id"])
    return a, b, jobs


def test_user_sees_only_own_jobs(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    a, b, jobs = seed(rest, pg)
    mine = rest.select("jobkit_jobs", USER_COLUMNS, user_claims(a))
    assert sorted(r["id"] for r in mine) == sorted(jobs[a])
    # with filters
    only_embed = rest.select(
        "jobkit_jobs", USER_COLUMNS, user_claims(a), where=sql.SQL("type = %s"), params=["embed"]
    )
    assert [r["id"] for r in only_embed] == [jobs[a][0]]
    # by id: another user's job, or a system job, is simply not there
    for other in (jobs[b][0], jobs["system"][0]):
        got = rest.select(
            "jobkit_jobs", USER_COLUMNS, user_claims(a), where=sql.SQL("id = %s"), params=[other]
        )
        assert got == []
    # filtering on someone else's user_id shows nothing either
    got = rest.select("jobkit_jobs", USER_COLUMNS, user_claims(a), where=sql.SQL("user_id = %s"), params=[b])
    assert got == []


def test_user_cannot_read_lease_columns(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    a, _, _ = seed(rest, pg)
    for column in ("lease_token", "claimed_by", "lease_until"):
        with pytest.raises(PostgrestError) as info:
            rest.select("jobkit_jobs", ["id", column], user_claims(a))
        assert info.value.code == "42501"


def test_anon_sees_nothing(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    seed(rest, pg)
    with pytest.raises(PostgrestError) as info:
        rest.select("jobkit_jobs", ["id"], ANON)
    assert info.value.code == "42501"


@pytest.mark.parametrize(
    "statement",
    [
        "insert into public.jobkit_jobs (type, user_id) values ('x', auth.uid())",
        "update public.jobkit_jobs set priority = 100",
        "delete from public.jobkit_jobs",
        "truncate public.jobkit_jobs",
    ],
)
@pytest.mark.parametrize("who", ["authenticated", "anon"])
def test_users_cannot_write(rest: Postgrest, pg: psycopg.Connection[Any], statement: str, who: str) -> None:
    a, _, _ = seed(rest, pg)
    before = pg.execute("select * from public.jobkit_jobs order by id").fetchall()
    claims = user_claims(a) if who == "authenticated" else ANON
    with pytest.raises(PostgrestError) as info:
        rest.execute(statement, [], claims)
    assert info.value.code == "42501"
    assert pg.execute("select * from public.jobkit_jobs order by id").fetchall() == before


@pytest.mark.parametrize("who", ["authenticated", "anon"])
def test_users_cannot_call_jobkit_functions(rest: Postgrest, pg: psycopg.Connection[Any], who: str) -> None:
    a, _, _ = seed(rest, pg)
    claims = user_claims(a) if who == "authenticated" else ANON
    calls: list[tuple[str, dict[str, Any]]] = [
        ("jobkit_enqueue", {"p_type": "x"}),
        ("jobkit_enqueue_many", {"p_jobs": [{"type": "x"}]}),
        ("jobkit_claim", {"p_types": ["embed"], "p_worker": "evil", "p_lease_seconds": 30}),
        ("jobkit_reclaim_expired", {}),
        ("jobkit_release", {"p_id": NIL, "p_lease_token": NIL}),
        ("jobkit_complete", {"p_ids": [NIL], "p_lease_tokens": [NIL]}),
        ("jobkit_fail", {"p_id": NIL, "p_lease_token": NIL, "p_error": "x"}),
        ("jobkit_get", {"p_id": NIL}),
        ("jobkit_traceback", {"p_id": NIL}),
        ("jobkit_requeue", {}),
        ("jobkit_prune", {"p_older_than_seconds": 0}),
        ("jobkit_stats", {}),
        ("jobkit_list_jobs", {}),
    ]
    for fn, args in calls:
        with pytest.raises(PostgrestError) as info:
            rest.rpc(fn, args, claims)
        assert info.value.code == "42501", fn


CUSTOM_PLANS = "plan_cache_mode=force_custom_plan"
GENERIC_PLANS = "plan_cache_mode=force_generic_plan"  # planned once per session, by index only
SEARCH_PATH = "search_path=pg_catalog, pg_temp"  # pg_temp last: it shadows nothing
OBSERVE = (  # 0.5.0's: the workers' beats and the operators' views of the queue
    "jobkit_worker_beat",
    "jobkit_worker_stop",
    "jobkit_list_workers",
    "jobkit_activity",
    "jobkit_queue_depth",
    "jobkit_trace_contexts",
    "jobkit_pipeline_of",
    "jobkit_traceback",  # 0.5.1's: the operator's read of a failure's traceback
)
PROCONFIG = {  # every function pins search_path; see the functions migration for the planner settings
    "jobkit_claim": [SEARCH_PATH, GENERIC_PLANS, "enable_bitmapscan=off", "enable_seqscan=off"],
    "jobkit_complete": [SEARCH_PATH, GENERIC_PLANS, "enable_bitmapscan=off", "enable_seqscan=off"],
    "jobkit_heartbeat": [SEARCH_PATH, CUSTOM_PLANS, "enable_seqscan=off"],
    "jobkit_progress": [SEARCH_PATH, CUSTOM_PLANS, "enable_seqscan=off"],
    "jobkit_cancel": [SEARCH_PATH, CUSTOM_PLANS, "enable_seqscan=off"],
    "jobkit_enqueue": [SEARCH_PATH, "enable_seqscan=off"],  # its cached plans stay index-bound
    "jobkit_fair_round": [SEARCH_PATH, "enable_seqscan=off"],
    "jobkit_check_jobs": [SEARCH_PATH],  # a plan cached per session, one call per batch
    "jobkit_enqueue_many_json": [SEARCH_PATH],
    "jobkit_enqueue_many_ids_json": [SEARCH_PATH],
    "jobkit_stats": [SEARCH_PATH],
    "jobkit_schema_version": [SEARCH_PATH],
    "jobkit_touch": [SEARCH_PATH],
    "jobkit_user_enqueue": [SEARCH_PATH],
    "jobkit_user_cancel": [SEARCH_PATH],
    # pipelines': set-based statements on the pipeline's own rows, each by an index made for it
    "jobkit_complete_adding": [SEARCH_PATH, "lock_timeout=250ms"],
    **{
        fn: [SEARCH_PATH]
        for fn in (
            "jobkit_enqueue_pipeline",
            "jobkit_cancel_pipeline",
            "jobkit_list_dependencies",
            "jobkit_get_pipeline",
            "jobkit_pipeline_progress",
            "jobkit_user_enqueue_pipeline",
            "jobkit_user_cancel_pipeline",
        )
    },
    # their one row, waited for at most 250 ms when another transaction holds it
    **{fn: [SEARCH_PATH, CUSTOM_PLANS, "lock_timeout=250ms"] for fn in ("jobkit_fail", "jobkit_release")},
    # flow control's: each statement index-bound or on a small table, whatever the queue's size
    **{
        fn: [SEARCH_PATH]
        for fn in (
            "jobkit_set_limit",
            "jobkit_delete_limit",
            "jobkit_list_limits",
            "jobkit_set_schedule",
            "jobkit_delete_schedule",
            "jobkit_list_schedules",
            "jobkit_fire_schedule",
        )
    },
    # the workers' and the operators' views of them: small tables, and partial indexes of jobkit_jobs
    **{fn: [SEARCH_PATH] for fn in OBSERVE},
}
USER_ENTRY_POINTS = {
    "jobkit_user_enqueue",
    "jobkit_user_cancel",
    "jobkit_user_enqueue_pipeline",
    "jobkit_user_cancel_pipeline",
}
READS_THROUGH_RLS = {"jobkit_list_dependencies", "jobkit_get_pipeline", "jobkit_pipeline_progress"}


def test_function_audit(pg: psycopg.Connection[Any]) -> None:
    rows = pg.execute(
        """select p.proname, p.prosecdef, p.proconfig,
                  has_function_privilege('public', p.oid, 'EXECUTE') as by_public,
                  has_function_privilege('anon', p.oid, 'EXECUTE') as by_anon,
                  has_function_privilege('authenticated', p.oid, 'EXECUTE') as by_authenticated,
                  has_function_privilege('service_role', p.oid, 'EXECUTE') as by_service
           from pg_proc p where p.pronamespace = 'public'::regnamespace order by 1"""
    ).fetchall()
    names = [r["proname"] for r in rows]
    assert names == sorted(
        [
            "jobkit_cancel",
            "jobkit_check_jobs",
            "jobkit_claim",
            "jobkit_complete",
            "jobkit_enqueue",
            "jobkit_enqueue_many",
            "jobkit_enqueue_many_json",
            "jobkit_enqueue_many_ids_json",
            "jobkit_fail",
            "jobkit_fair_round",
            "jobkit_get",
            "jobkit_delete_limit",
            "jobkit_list_limits",
            "jobkit_set_limit",
            "jobkit_heartbeat",
            "jobkit_list_jobs",
            "jobkit_progress",
            "jobkit_project",
            "jobkit_outbox_enqueue",
            "jobkit_outbox_take",
            "jobkit_outbox_done",
            "jobkit_prune",
            "jobkit_reclaim_expired",
            "jobkit_release",
            "jobkit_requeue",
            "jobkit_delete_schedule",
            "jobkit_fire_schedule",
            "jobkit_list_schedules",
            "jobkit_set_schedule",
            "jobkit_stats",
            "jobkit_schema_version",
            "jobkit_touch",
            "jobkit_user_cancel",
            "jobkit_user_enqueue",
            "jobkit_enqueue_pipeline",
            "jobkit_complete_adding",
            "jobkit_cancel_pipeline",
            "jobkit_user_enqueue_pipeline",
            "jobkit_user_cancel_pipeline",
            *OBSERVE,
            *READS_THROUGH_RLS,
        ]
    )
    assert len(set(names)) == len(names), "no overloads"
    for r in rows:
        for_users = r["proname"] in USER_ENTRY_POINTS  # signed-in users' only entry points
        reads = r["proname"] in READS_THROUGH_RLS  # and reads that RLS filters, the service role's too
        assert (r["by_public"], r["by_anon"], r["by_authenticated"]) == (False, False, for_users or reads), r
        assert r["by_service"] is not for_users, r
        assert r["prosecdef"] is False, r  # the definer functions behind them live in jobkit_private
        assert r["proconfig"] == PROCONFIG.get(r["proname"], [SEARCH_PATH, CUSTOM_PLANS]), r


def test_table_privileges(pg: psycopg.Connection[Any]) -> None:
    privs = ["SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER"]
    expected = {
        "anon": set(),
        "authenticated": set(),  # column-level SELECT only (checked below)
        "service_role": {"SELECT", "INSERT", "UPDATE", "DELETE"},
    }
    for role, allowed in expected.items():
        have = {
            p
            for p in privs
            if pg.execute(
                "select has_table_privilege(%s, 'public.jobkit_jobs', %s) as ok", (role, p)
            ).fetchone()
            == {"ok": True}
        }
        assert have == allowed, role
    cols = pg.execute(
        """select attname from pg_attribute where attrelid = 'public.jobkit_jobs'::regclass and attnum > 0
           and not attisdropped and has_column_privilege('authenticated', attrelid, attnum, 'SELECT')
           order by attnum"""
    ).fetchall()
    assert [c["attname"] for c in cols] == USER_COLUMNS
    rls = pg.execute("select relrowsecurity from pg_class where oid = 'public.jobkit_jobs'::regclass")
    assert rls.fetchone() == {"relrowsecurity": True}
