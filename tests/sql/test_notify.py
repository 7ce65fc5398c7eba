"""Wake-ups: an enqueue that inserted a job runnable now notifies channel jobkit_jobs, once per call, and
nothing when it inserted nothing or only future work; so does a completion that makes waiting jobs
runnable. The payload is empty: any role may LISTEN on any channel (tests/sql/test_hostile_0_5_1.py)."""

from __future__ import annotations

import json
from typing import Any

import psycopg


def _notified(listener: psycopg.Connection[Any]) -> list[str]:
    return [n.payload for n in listener.notifies(timeout=0.3)]


def test_enqueue_notifies_when_a_job_is_runnable_now(db_url: str, pg: psycopg.Connection[Any]) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("listen jobkit_jobs")
        jobs = [
            {"type": "a", "idempotency_key": "k1"},
            {"type": "a"},
            {"type": "b", "delay_seconds": 60},
            {"type": "d", "delay_seconds": 0},
        ]
        pg.execute("select count(*) from public.jobkit_enqueue_many(%s::jsonb)", (json.dumps(jobs),))
        assert _notified(listener) == [""]  # one wake-up for the call, naming nothing

        # every element deduplicated: nothing was inserted, nobody is woken
        pg.execute(
            "select count(*) from public.jobkit_enqueue_many(%s::jsonb)",
            (json.dumps([{"type": "a", "idempotency_key": "k1"}]),),
        )
        future = [{"type": "b", "delay_seconds": 60}, {"type": "c", "run_after": "2999-01-01T00:00:00Z"}]
        pg.execute("select count(*) from public.jobkit_enqueue_many(%s::jsonb)", (json.dumps(future),))
        assert _notified(listener) == []

        pg.execute("select public.jobkit_enqueue('e')")
        pg.execute("select public.jobkit_enqueue('f', p_delay_seconds => 60)")
        pg.execute("select public.jobkit_enqueue('a', p_idempotency_key => 'k1')")  # a duplicate
        assert _notified(listener) == [""]


def test_a_completion_that_frees_a_waiting_job_notifies(db_url: str, pg: psycopg.Connection[Any]) -> None:
    pg.execute(
        "select public.jobkit_enqueue_pipeline("
        '\'[{"ref": "a", "type": "first"}, {"type": "then", "depends_on": ["a"]}]\')'
    )
    row = pg.execute("select id, lease_token from public.jobkit_claim(array['first'], 'w', 30)").fetchone()
    assert row is not None
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("listen jobkit_jobs")
        pg.execute(
            "select * from public.jobkit_complete(array[%s]::uuid[], array[%s]::uuid[])",
            (row["id"], row["lease_token"]),
        )
        assert _notified(listener) == [""]
