"""Every transition of the SQL API, called exactly as PostgREST calls it (service_role)."""

from __future__ import annotations

from typing import Any

import psycopg

from tests.doubles.postgrest import Postgrest
from tests.sql.helpers import SERVICE, expire_lease, make_runnable


def enqueue(rest: Postgrest, **args: Any) -> dict[str, Any]:
    rows: list[dict[str, Any]] = rest.rpc("jobkit_enqueue", {"p_type": "embed", **args}, SERVICE)
    return rows[0]


def claim(
    rest: Postgrest, types: list[str] | None = None, limit: int = 10, lease: float = 30, worker: str = "w1"
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = rest.rpc(
        "jobkit_claim",
        {"p_types": types or ["embed"], "p_worker": worker, "p_lease_seconds": lease, "p_limit": limit},
        SERVICE,
    )
    return rows


def row(pg: psycopg.Connection[Any], job_id: str) -> dict[str, Any]:
    result = pg.execute("select * from public.jobkit_jobs where id = %s", (job_id,)).fetchone()
    assert result is not None
    return dict(result)


def test_enqueue_defaults(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    job = enqueue(rest, p_payload={"doc": 1})
    assert job["inserted"] is True
    assert job["status"] == "queued"
    assert job["attempts"] == 0 and job["max_attempts"] == 3 and job["priority"] == 0
    assert job["payload"] == {"doc": 1}
    assert row(pg, job["id"])["lease_until"] is None


def test_queued_running_succeeded(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    job = enqueue(rest)
    [claimed] = claim(rest)
    assert claimed["id"] == job["id"]
    assert claimed["status"] == "running" and claimed["attempts"] == 1
    assert claimed["claimed_by"] == "w1" and claimed["lease_token"]
    [done] = rest.rpc(
        "jobkit_complete", {"p_ids": [job["id"]], "p_lease_tokens": [claimed["lease_token"]]}, SERVICE
    )
    assert done == {"id": job["id"], "ok": True}
    final = row(pg, job["id"])
    assert final["status"] == "succeeded"
    assert final["lease_until"] is None and final["lease_token"] is None
    assert final["claimed_by"] == "w1"
    assert final["updated_at"] >= final["created_at"]


def test_retrying_then_dead_at_max_attempts_keeps_last_error(
    rest: Postgrest, pg: psycopg.Connection[Any]
) -> None:
    job = enqueue(rest, p_max_attempts=2)
    [first] = claim(rest)
    [failed] = rest.rpc(
        "jobkit_fail",
        {
            "p_id": job["id"],
            "p_lease_token": first["lease_token"],
            "p_error": "boom 1",
            "p_retry_delay_seconds": 60,
        },
        SERVICE,
    )
    assert failed["ok"] is True and failed["status"] == "retrying" and failed["attempts"] == 1
    after = row(pg, job["id"])
    assert after["status"] == "retrying" and after["error"] == "boom 1"
    delay = (after["run_after"] - after["updated_at"]).total_seconds()
    assert 59 <= delay <= 61
    # not claimable before its run_after
    assert claim(rest) == []
    make_runnable(pg, job["id"])
    [second] = claim(rest)
    assert second["attempts"] == 2
    [dead] = rest.rpc(
        "jobkit_fail",
        {
            "p_id": job["id"],
            "p_lease_token": second["lease_token"],
            "p_error": "boom 2",
            "p_retry_delay_seconds": 60,
        },
        SERVICE,
    )
    assert dead["status"] == "dead"
    final = row(pg, job["id"])
    assert final["status"] == "dead" and final["error"] == "boom 2" and final["attempts"] == 2
    assert claim(rest) == []


def test_permanent_failure_is_dead_at_once(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    job = enqueue(rest, p_max_attempts=5)
    [c] = claim(rest)
    [res] = rest.rpc(
        "jobkit_fail",
        {"p_id": job["id"], "p_lease_token": c["lease_token"], "p_error": "bad input", "p_permanent": True},
        SERVICE,
    )
    assert res["status"] == "dead"
    assert row(pg, job["id"])["attempts"] == 1


def test_error_text_is_bounded(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    job = enqueue(rest)
    [c] = claim(rest)
    rest.rpc(
        "jobkit_fail",
        {"p_id": job["id"], "p_lease_token": c["lease_token"], "p_error": "x" * 10_000},
        SERVICE,
    )
    assert len(row(pg, job["id"])["error"]) == 4000


def test_delayed_job_is_not_claimable_before_run_after(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    job = enqueue(rest, p_delay_seconds=3600)
    assert claim(rest) == []
    make_runnable(pg, job["id"])
    assert [c["id"] for c in claim(rest)] == [job["id"]]


def test_heartbeat_moves_deadline(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    job = enqueue(rest)
    [c] = claim(rest, lease=5)
    [ext] = rest.rpc(
        "jobkit_heartbeat",
        {"p_ids": [job["id"]], "p_lease_tokens": [c["lease_token"]], "p_lease_seconds": 600},
        SERVICE,
    )
    assert ext["held"] is True
    r = row(pg, job["id"])
    assert 599 <= (r["lease_until"] - r["updated_at"]).total_seconds() <= 601


def test_reclaim_expired(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    keep = enqueue(rest, p_max_attempts=3)
    poison = enqueue(rest, p_type="poison", p_max_attempts=1)
    claim(rest)
    claim(rest, types=["poison"])
    expire_lease(pg, keep["id"])
    expire_lease(pg, poison["id"])
    reclaimed = {r["id"]: r["status"] for r in rest.rpc("jobkit_reclaim_expired", {}, SERVICE)}
    assert reclaimed == {keep["id"]: "retrying", poison["id"]: "dead"}
    assert "lease expired" in row(pg, keep["id"])["error"]
    assert row(pg, poison["id"])["lease_token"] is None
    # a second pass finds nothing
    assert rest.rpc("jobkit_reclaim_expired", {}, SERVICE) == []


def test_claim_reclaims_expired_leases_itself(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    job = enqueue(rest)
    [first] = claim(rest, worker="crashed")
    expire_lease(pg, job["id"])
    [again] = claim(rest, worker="w2")
    assert again["id"] == job["id"] and again["attempts"] == 2 and again["claimed_by"] == "w2"
    assert again["lease_token"] != first["lease_token"]


def test_poison_job_ends_dead_through_reclaim(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    job = enqueue(rest, p_max_attempts=3)
    for _ in range(3):
        [c] = claim(rest)
        assert c["id"] == job["id"]
        expire_lease(pg, job["id"])  # the worker died holding it
    assert claim(rest) == []
    assert row(pg, job["id"])["status"] == "dead"


def test_fencing_after_lost_lease(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    job = enqueue(rest)
    [stale] = claim(rest, worker="slow")
    expire_lease(pg, job["id"])
    [fresh] = claim(rest, worker="fast")
    before = row(pg, job["id"])
    token = stale["lease_token"]
    [c] = rest.rpc("jobkit_complete", {"p_ids": [job["id"]], "p_lease_tokens": [token]}, SERVICE)
    [f] = rest.rpc("jobkit_fail", {"p_id": job["id"], "p_lease_token": token, "p_error": "x"}, SERVICE)
    [e] = rest.rpc(
        "jobkit_heartbeat", {"p_ids": [job["id"]], "p_lease_tokens": [token], "p_lease_seconds": 60}, SERVICE
    )
    assert (c["ok"], f["ok"], e["held"]) == (False, False, False)
    assert row(pg, job["id"]) == before
    # the fresh holder still completes
    [ok] = rest.rpc(
        "jobkit_complete", {"p_ids": [job["id"]], "p_lease_tokens": [fresh["lease_token"]]}, SERVICE
    )
    assert ok["ok"] is True


def test_fencing_survives_requeue(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    """A token from before a job died and was requeued cannot complete the new attempt."""
    job = enqueue(rest, p_max_attempts=1)
    [stale] = claim(rest)
    expire_lease(pg, job["id"])
    rest.rpc("jobkit_reclaim_expired", {}, SERVICE)
    rest.rpc("jobkit_requeue", {"p_ids": [job["id"]]}, SERVICE)
    [fresh] = claim(rest)
    assert fresh["attempts"] == stale["attempts"] == 1
    [c] = rest.rpc(
        "jobkit_complete", {"p_ids": [job["id"]], "p_lease_tokens": [stale["lease_token"]]}, SERVICE
    )
    assert c["ok"] is False
    assert row(pg, job["id"])["status"] == "running"


def test_requeue_dead(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    job = enqueue(rest, p_max_attempts=1, p_idempotency_key="k")
    [c] = claim(rest)
    rest.rpc("jobkit_fail", {"p_id": job["id"], "p_lease_token": c["lease_token"], "p_error": "x"}, SERVICE)
    [back] = rest.rpc("jobkit_requeue", {"p_ids": [job["id"]]}, SERVICE)
    assert back["status"] == "queued" and back["attempts"] == 0
    # a live job is left alone
    assert rest.rpc("jobkit_requeue", {"p_ids": [job["id"]]}, SERVICE) == []


def test_requeue_skips_dead_job_whose_key_is_live_again(rest: Postgrest) -> None:
    job = enqueue(rest, p_max_attempts=1, p_idempotency_key="k")
    [c] = claim(rest)
    rest.rpc(
        "jobkit_fail",
        {"p_id": job["id"], "p_lease_token": c["lease_token"], "p_error": "x", "p_permanent": True},
        SERVICE,
    )
    again = enqueue(rest, p_idempotency_key="k")
    assert again["inserted"] is True
    assert rest.rpc("jobkit_requeue", {}, SERVICE) == []


def test_requeue_all_dead_of_type(rest: Postgrest) -> None:
    ids = []
    for t in ("a", "a", "b"):
        j = enqueue(rest, p_type=t, p_max_attempts=1)
        [c] = claim(rest, types=[t])
        rest.rpc("jobkit_fail", {"p_id": j["id"], "p_lease_token": c["lease_token"], "p_error": "x"}, SERVICE)
        ids.append(j["id"])
    back = rest.rpc("jobkit_requeue", {"p_type": "a"}, SERVICE)
    assert sorted(b["id"] for b in back) == sorted(ids[:2])


def test_prune(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    done = enqueue(rest)
    live = enqueue(rest, p_type="other")
    [c] = claim(rest)
    rest.rpc("jobkit_complete", {"p_ids": [done["id"]], "p_lease_tokens": [c["lease_token"]]}, SERVICE)
    assert rest.rpc("jobkit_prune", {"p_older_than_seconds": 3600}, SERVICE) == 0
    pg.execute("update public.jobkit_jobs set updated_at = now() - interval '2 hours'")
    assert rest.rpc("jobkit_prune", {"p_older_than_seconds": 3600}, SERVICE) == 1
    remaining = [str(r["id"]) for r in pg.execute("select id from public.jobkit_jobs").fetchall()]
    assert remaining == [live["id"]]


def test_stats(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    enqueue(rest)
    enqueue(rest)
    enqueue(rest, p_type="t2", p_delay_seconds=600)
    claim(rest, limit=1)
    pg.execute(
        "update public.jobkit_jobs set run_after = now() - interval '10 seconds', updated_at = now() "
        "where status = 'queued' and type = 'embed'"
    )
    stats = {(s["type"], s["status"]): s for s in rest.rpc("jobkit_stats", {}, SERVICE)}
    assert stats[("embed", "queued")]["count"] == 1
    assert stats[("embed", "running")]["count"] == 1
    assert stats[("t2", "queued")]["count"] == 1
    assert stats[("t2", "queued")]["oldest_runnable_seconds"] is None  # not runnable yet
    assert 9 <= stats[("embed", "queued")]["oldest_runnable_seconds"] <= 60


def test_updated_at_kept_current_by_trigger(pg: psycopg.Connection[Any], rest: Postgrest) -> None:
    job = enqueue(rest)
    pg.execute("update public.jobkit_jobs set updated_at = '2000-01-01' where id = %s", (job["id"],))
    pg.execute("update public.jobkit_jobs set priority = 5 where id = %s", (job["id"],))
    assert row(pg, job["id"])["updated_at"].year > 2000
