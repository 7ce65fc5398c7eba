"""Claims: order, filters, batches, and two real sessions never sharing a job."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from tests.doubles.postgrest import Postgrest
from tests.sql.helpers import SERVICE
from tests.sql.test_transitions import claim, enqueue


def test_priority_then_age_order(rest: Postgrest) -> None:
    low_old = enqueue(rest, p_priority=0)
    high = enqueue(rest, p_priority=10)
    low_new = enqueue(rest, p_priority=0)
    mid = enqueue(rest, p_priority=5)
    order = [c["id"] for c in claim(rest, limit=10)]
    assert order == [high["id"], mid["id"], low_old["id"], low_new["id"]]


def test_one_at_a_time_follows_order(rest: Postgrest) -> None:
    a = enqueue(rest, p_priority=1)
    b = enqueue(rest, p_priority=2)
    assert claim(rest, limit=1)[0]["id"] == b["id"]
    assert claim(rest, limit=1)[0]["id"] == a["id"]


def test_type_filter_and_batch_limit(rest: Postgrest) -> None:
    for _ in range(5):
        enqueue(rest, p_type="a")
    enqueue(rest, p_type="b")
    got = claim(rest, types=["a"], limit=3)
    assert len(got) == 3 and {g["type"] for g in got} == {"a"}
    assert len(claim(rest, types=["a"], limit=10)) == 2
    assert [g["type"] for g in claim(rest, types=["a", "b"], limit=10)] == ["b"]


def test_only_runnable_jobs(rest: Postgrest, pg: psycopg.Connection[Any]) -> None:
    enqueue(rest, p_delay_seconds=60)
    done = enqueue(rest)
    [c] = claim(rest)
    rest.rpc("jobkit_complete", {"p_ids": [done["id"]], "p_lease_tokens": [c["lease_token"]]}, SERVICE)
    assert claim(rest) == []  # one running-then-succeeded, one in the future


def test_limit_is_clamped_below_postgrest_row_cap(rest: Postgrest) -> None:
    rest.rpc("jobkit_enqueue_many", {"p_jobs": [{"type": "embed"}] * 1200}, SERVICE)
    got = claim(rest, limit=5000)
    assert len(got) == 999


def test_concurrent_claims_never_share_a_job(db_url: str, rest: Postgrest) -> None:
    rest.rpc("jobkit_enqueue_many", {"p_jobs": [{"type": "embed"}] * 400}, SERVICE)
    seen: list[list[str]] = [[], []]
    barrier = threading.Barrier(2)

    def worker(i: int) -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            barrier.wait()
            while True:
                rows = conn.execute(
                    "select id from public.jobkit_claim(array['embed'], %s, 30, 3)", (f"w{i}",)
                ).fetchall()
                if not rows:
                    return
                seen[i].extend(str(r[0]) for r in rows)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not set(seen[0]) & set(seen[1])
    assert len(seen[0]) + len(seen[1]) == 400
    assert len(set(seen[0]) | set(seen[1])) == 400
    assert seen[0] and seen[1], "both sessions should have claimed something"


def test_skip_locked_with_open_transaction(db_url: str, rest: Postgrest) -> None:
    """A claim inside a still-open transaction hides its rows from a second session, without blocking."""
    rest.rpc("jobkit_enqueue_many", {"p_jobs": [{"type": "embed"}] * 4}, SERVICE)
    with psycopg.connect(db_url) as a, psycopg.connect(db_url) as b:
        first = {r[0] for r in a.execute("select id from public.jobkit_claim(array['embed'], 'a', 30, 2)")}
        b.execute("set lock_timeout = '2s'")
        second = {r[0] for r in b.execute("select id from public.jobkit_claim(array['embed'], 'b', 30, 10)")}
        assert len(first) == 2 and len(second) == 2 and not first & second
        a.rollback()
        b.rollback()
