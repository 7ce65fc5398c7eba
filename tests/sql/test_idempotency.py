"""Idempotent enqueue through the partial unique index on live keys."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from tests.doubles.postgrest import Postgrest
from tests.sql.helpers import SERVICE
from tests.sql.test_transitions import claim, enqueue


def count(pg: psycopg.Connection[Any]) -> int:
    row = pg.execute("select count(*) as n from public.jobkit_jobs").fetchone()
    assert row is not None
    return int(row["n"])


def test_same_key_twice_gives_one_row(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    first = enqueue(rest, p_idempotency_key="doc-1", p_payload={"v": 1})
    second = enqueue(rest, p_idempotency_key="doc-1", p_payload={"v": 2})
    assert first["inserted"] is True and second["inserted"] is False
    assert second["id"] == first["id"] and second["payload"] == {"v": 1}
    assert count(pg) == 1


def test_key_of_running_and_succeeded_jobs_still_dedups(rest: Postgrest) -> None:
    job = enqueue(rest, p_idempotency_key="k")
    [c] = claim(rest)
    assert enqueue(rest, p_idempotency_key="k")["inserted"] is False
    rest.rpc("jobkit_complete", {"p_ids": [job["id"]], "p_lease_tokens": [c["lease_token"]]}, SERVICE)
    again = enqueue(rest, p_idempotency_key="k")
    assert again["inserted"] is False and again["status"] == "succeeded"


def test_dead_key_can_be_enqueued_again(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    job = enqueue(rest, p_idempotency_key="k", p_max_attempts=1)
    [c] = claim(rest)
    rest.rpc("jobkit_fail", {"p_id": job["id"], "p_lease_token": c["lease_token"], "p_error": "x"}, SERVICE)
    again = enqueue(rest, p_idempotency_key="k")
    assert again["inserted"] is True and again["id"] != job["id"]
    assert count(pg) == 2


def test_batch_dedups_within_itself_and_against_table(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    existing = enqueue(rest, p_idempotency_key="old")
    rows = rest.rpc(
        "jobkit_enqueue_many",
        {
            "p_jobs": [
                {"type": "a", "idempotency_key": "new"},
                {"type": "b", "idempotency_key": "old"},
                {"type": "c"},
                {"type": "d", "idempotency_key": "new"},
            ]
        },
        SERVICE,
    )
    assert [r["ord"] for r in rows] == [1, 2, 3, 4]
    assert [r["inserted"] for r in rows] == [True, False, True, False]
    assert rows[1]["id"] == existing["id"]
    assert rows[3]["id"] == rows[0]["id"] and rows[3]["type"] == "a"
    assert count(pg) == 3


def test_eight_concurrent_enqueues_of_one_key(db_url: str, pg: psycopg.Connection[Any]) -> None:
    for round_ in range(5):
        key = f"race-{round_}"
        barrier = threading.Barrier(8)
        results: list[tuple[str, bool]] = []
        errors: list[BaseException] = []

        def go(
            key: str = key,
            barrier: threading.Barrier = barrier,
            results: list[tuple[str, bool]] = results,
            errors: list[BaseException] = errors,
        ) -> None:
            try:
                with psycopg.connect(db_url, autocommit=True) as conn:
                    barrier.wait()
                    row = conn.execute(
                        "select id, inserted from public.jobkit_enqueue('embed', p_idempotency_key => %s)",
                        (key,),
                    ).fetchone()
                    assert row is not None
                    results.append((str(row[0]), bool(row[1])))
            except BaseException as exc:  # collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=go) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len({r[0] for r in results}) == 1
        assert sorted(r[1] for r in results) == [False] * 7 + [True]
        n = pg.execute("select count(*) as n from public.jobkit_jobs where idempotency_key = %s", (key,))
        assert n.fetchone() == {"n": 1}
