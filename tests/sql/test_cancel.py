"""Cancel, the batched heartbeat, progress and results, in SQL, called exactly as PostgREST calls them."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import psycopg
import pytest

from tests.doubles.postgrest import Postgrest, PostgrestError
from tests.sql.helpers import SERVICE
from tests.sql.test_transitions import claim, enqueue, row

NIL = "00000000-0000-0000-0000-000000000000"


def cancel(rest: Postgrest, *ids: str, reason: str | None = None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = rest.rpc("jobkit_cancel", {"p_ids": list(ids), "p_reason": reason}, SERVICE)
    return rows


def beat(rest: Postgrest, held: list[tuple[str, str]], lease: float = 30) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = rest.rpc(
        "jobkit_heartbeat",
        {"p_ids": [h[0] for h in held], "p_lease_tokens": [h[1] for h in held], "p_lease_seconds": lease},
        SERVICE,
    )
    return rows


def test_cancel_ends_queued_and_running_jobs_and_leaves_finished_ones(
    rest: Postgrest, pg: psycopg.Connection[Any]
) -> None:
    running = enqueue(rest, p_priority=1)
    queued = enqueue(rest)
    [claimed] = claim(rest, limit=1)
    assert claimed["id"] == running["id"]
    done = enqueue(rest, p_type="other")
    pg.execute(
        "update public.jobkit_jobs set status = 'succeeded', attempts = 1 where id = %s", (done["id"],)
    )
    result = cancel(rest, queued["id"], running["id"], done["id"], NIL, reason="user asked")
    assert [(r["cancelled"], r["status"]) for r in result] == [
        (True, "cancelled"),
        (True, "cancelled"),
        (False, "succeeded"),
        (False, None),
    ]
    was_running = row(pg, running["id"])
    assert (was_running["status"], was_running["error"]) == ("cancelled", "user asked")
    assert was_running["lease_token"] is None and was_running["lease_until"] is None
    # The worker that held it is fenced off: its completion and its heartbeat change nothing.
    token = claimed["lease_token"]
    [completed] = rest.rpc("jobkit_complete", {"p_ids": [running["id"]], "p_lease_tokens": [token]}, SERVICE)
    assert completed["ok"] is False
    [b] = beat(rest, [(running["id"], token)])
    assert (b["held"], b["status"], b["lease_until"]) == (False, "cancelled", None)
    assert row(pg, running["id"])["status"] == "cancelled"
    assert cancel(rest, running["id"])[0] == {"id": running["id"], "cancelled": False, "status": "cancelled"}


def test_a_cancelled_job_frees_its_key_and_is_pruned(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    first = enqueue(rest, p_idempotency_key="transcribe:7")
    cancel(rest, first["id"])
    again = enqueue(rest, p_idempotency_key="transcribe:7")
    assert again["inserted"] is True and again["id"] != first["id"]
    assert enqueue(rest, p_idempotency_key="transcribe:7")["id"] == again["id"]  # the new one holds it
    assert rest.rpc("jobkit_requeue", {"p_ids": [first["id"]]}, SERVICE) == []  # not dead: not requeued
    assert rest.rpc("jobkit_prune", {"p_older_than_seconds": 0}, SERVICE) == 1


def test_heartbeat_extends_only_what_needs_it(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    a, b = enqueue(rest), enqueue(rest)
    held = [(j["id"], j["lease_token"]) for j in claim(rest, lease=30)]
    pg.execute(
        "update public.jobkit_jobs set lease_until = now() + interval '5 seconds' where id = %s", (a["id"],)
    )
    before = {
        r["id"]: r["lease_until"] for r in pg.execute("select id::text, lease_until from public.jobkit_jobs")
    }
    result = {r["id"]: r for r in beat(rest, held, lease=30)}
    assert all(r["held"] and r["status"] == "running" for r in result.values())
    after = {
        r["id"]: r["lease_until"] for r in pg.execute("select id::text, lease_until from public.jobkit_jobs")
    }
    assert after[a["id"]] > before[a["id"]]  # 5 s of 30 left: extended to the full lease
    assert after[b["id"]] == before[b["id"]]  # still fresh: only read
    assert {k: datetime.fromisoformat(v["lease_until"]) for k, v in result.items()} == after


def test_heartbeat_reports_a_reclaimed_lease(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    job = enqueue(rest)
    [first] = claim(rest, lease=30)
    pg.execute(
        "update public.jobkit_jobs set lease_until = now() - interval '1 second' where id = %s", (job["id"],)
    )
    [second] = claim(rest, lease=30, worker="w2")  # reclaimed, then claimed again
    assert second["id"] == job["id"]
    [lost] = beat(rest, [(job["id"], first["lease_token"])])
    assert (lost["held"], lost["status"]) == (False, "running")
    [kept] = beat(rest, [(job["id"], second["lease_token"])])
    assert kept["held"] is True


def test_results_and_progress_are_bounded_by_the_database(
    rest: Postgrest, pg: psycopg.Connection[Any]
) -> None:
    job = enqueue(rest)
    [claimed] = claim(rest)
    pair = {"p_ids": [job["id"]], "p_lease_tokens": [claimed["lease_token"]]}
    for progress, message in ((1.5, None), (0.5, "x" * 201)):
        with pytest.raises(PostgrestError) as bad:
            rest.rpc("jobkit_progress", pair | {"p_progress": [progress], "p_messages": [message]}, SERVICE)
        assert bad.value.code == "JK001"
    with pytest.raises(PostgrestError) as big:
        rest.rpc("jobkit_complete", pair | {"p_results": {job["id"]: "x" * 70_000}}, SERVICE)
    assert big.value.code == "23514"  # jobkit_jobs_result_bounded: the batch is refused whole
    assert row(pg, job["id"])["status"] == "running"
    [ok] = rest.rpc("jobkit_complete", pair | {"p_results": {job["id"]: {"words": 3}}}, SERVICE)
    assert ok["ok"] and row(pg, job["id"])["result"] == {"words": 3}
