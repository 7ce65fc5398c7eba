"""Wake-ups: an enqueue notifies channel jobkit_jobs with the types that became runnable now, once per
call, and nothing when it inserted nothing or only future work."""

from __future__ import annotations

import json
from typing import Any

import psycopg


def _notified(listener: psycopg.Connection[Any]) -> list[str]:
    return [n.payload for n in listener.notifies(timeout=0.3)]


def test_enqueue_notifies_types_runnable_now(db_url: str, pg: psycopg.Connection[Any]) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("listen jobkit_jobs")
        jobs = [
            {"type": "a", "idempotency_key": "k1"},
            {"type": "a"},
            {"type": "b", "delay_seconds": 60},
            {"type": "c", "run_after": "2999-01-01T00:00:00Z"},
            {"type": "d", "delay_seconds": 0},
        ]
        pg.execute("select count(*) from public.jobkit_enqueue_many(%s::jsonb)", (json.dumps(jobs),))
        [payload] = _notified(listener)
        assert sorted(payload.split(",")) == ["a", "d"]

        # every element deduplicated: nothing was inserted, nobody is woken
        pg.execute(
            "select count(*) from public.jobkit_enqueue_many(%s::jsonb)",
            (json.dumps([{"type": "a", "idempotency_key": "k1"}]),),
        )
        assert _notified(listener) == []

        pg.execute("select public.jobkit_enqueue('e')")
        pg.execute("select public.jobkit_enqueue('f', p_delay_seconds => 60)")
        pg.execute("select public.jobkit_enqueue('a', p_idempotency_key => 'k1')")  # a duplicate
        assert _notified(listener) == ["e"]
