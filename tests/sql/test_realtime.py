"""Live updates, the database half, against the realtime schema as supabase/realtime defines it (the
bootstrap's section 3b): what jobkit's triggers broadcast, to which private topic, and who may join each
topic, checked the way Realtime's join check does it (lib/realtime/tenants/authorization.ex
get_read_policies_for_connection, v2.129.8): as Realtime's own user, insert a probe message for the topic
in a transaction; switch to the joining role with its claims and realtime.topic set; the join is allowed
when that role can select the probe; roll back."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.doubles.postgrest import Postgrest
from tests.doubles.realtime_server import may_join
from tests.sql.helpers import SERVICE, make_user, user_claims

pytestmark = pytest.mark.parametrize("db_name", ["current", "legacy"], indirect=True)


def messages(pg: psycopg.Connection[Any], topic: str) -> list[dict[str, Any]]:
    rows = pg.execute(
        "select event, payload, private, extension from realtime.messages where topic = %s order by inserted_at",
        (topic,),
    ).fetchall()
    return [dict(r) for r in rows]


def test_who_may_join_which_topic(db_url: str, pg: psycopg.Connection[Any]) -> None:
    a, b = make_user(pg), make_user(pg)
    assert may_join(db_url, f"jobkit:user:{a}", user_claims(a))
    assert not may_join(db_url, f"jobkit:user:{b}", user_claims(a))  # another user's topic
    assert not may_join(db_url, f"jobkit:user:{a}", {"role": "anon"})
    assert not may_join(db_url, "jobkit:workers", user_claims(a))  # the workers' topic: service role only
    assert not may_join(db_url, "jobkit:workers", {"role": "anon"})
    assert may_join(db_url, "jobkit:workers", SERVICE)


def test_a_users_job_changes_reach_only_their_topic(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    a, b = make_user(pg), make_user(pg)
    [job] = rest.rpc("jobkit_enqueue", {"p_type": "transcribe", "p_user_id": a}, SERVICE)
    rest.rpc("jobkit_enqueue", {"p_type": "transcribe"}, SERVICE)  # nobody's: no user topic
    [claimed] = rest.rpc(
        "jobkit_claim",
        {"p_types": ["transcribe"], "p_worker": "w", "p_lease_seconds": 30, "p_limit": 1},
        SERVICE,
    )
    assert claimed["id"] == job["id"]
    token = claimed["lease_token"]
    pair = {"p_ids": [job["id"]], "p_lease_tokens": [token]}
    rest.rpc("jobkit_heartbeat", pair | {"p_lease_seconds": 30}, SERVICE)  # a lease only: no message
    rest.rpc("jobkit_progress", pair | {"p_progress": [0.5], "p_messages": ["half"]}, SERVICE)
    rest.rpc("jobkit_progress", pair | {"p_progress": [0.5], "p_messages": ["half"]}, SERVICE)  # unchanged
    rest.rpc("jobkit_complete", pair | {"p_results": {job["id"]: {"words": 3}}}, SERVICE)
    sent = messages(pg, f"jobkit:user:{a}")
    assert [(m["event"], m["payload"]["status"], m["payload"]["progress"]) for m in sent] == [
        ("job", "queued", None),
        ("job", "running", None),
        ("job", "running", 0.5),
        ("job", "succeeded", 1),
    ]
    assert all(
        m["private"] and m["extension"] == "broadcast" and m["payload"]["id"] == job["id"] for m in sent
    )
    assert (
        "result" not in sent[-1]["payload"] and "payload" not in sent[-1]["payload"]
    )  # read the row for them
    assert messages(pg, f"jobkit:user:{b}") == []
    assert pg.execute(
        "select count(*) as n from realtime.messages where topic like 'jobkit:user:%%'"
    ).fetchone() == {"n": 4}


def test_workers_are_woken_once_per_statement_with_runnable_jobs(
    rest: Postgrest, pg: psycopg.Connection[Any]
) -> None:
    rest.rpc("jobkit_enqueue", {"p_type": "a"}, SERVICE)
    rest.rpc("jobkit_enqueue_many", {"p_jobs": [{"type": "b"}] * 50}, SERVICE)
    rest.rpc("jobkit_enqueue", {"p_type": "c", "p_delay_seconds": 3600}, SERVICE)  # not runnable yet
    rest.rpc("jobkit_enqueue", {"p_type": "d", "p_idempotency_key": "k"}, SERVICE)
    rest.rpc("jobkit_enqueue", {"p_type": "d", "p_idempotency_key": "k"}, SERVICE)  # a duplicate: no insert
    woken = messages(pg, "jobkit:workers")
    assert [(m["event"], m["private"]) for m in woken] == [("enqueued", True)] * 3
