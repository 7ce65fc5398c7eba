"""``pgjobkit pipeline show`` draws a pipeline as a tree with its states (a fan-out of many folded into
counts), ``--json`` lists every job, and ``pipeline cancel`` ends what has not finished."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import psycopg

from pgjobkit import PostgresStore
from pgjobkit.core.pipelines import Pipeline
from pgjobkit.worker.calls import WorkerCalls
from tests.cli.conftest import Run


def test_a_pipeline_shows_as_a_tree_and_cancels(
    jobkit: Run, db_url: str, pg: psycopg.Connection[Any]
) -> None:
    with PostgresStore(db_url) as store:
        p = Pipeline()
        p.add("chunk", {"doc": 1})
        e = store.enqueue_pipeline(p)
        calls = WorkerCalls(store)
        [chunk] = calls.claim(["chunk"], "w", timedelta(seconds=30), 1)
        fan = Pipeline()
        embeds = [fan.add("embed", {"n": n}) for n in range(12)]
        fan.add("reindex", after=embeds)
        assert chunk.lease_token is not None
        ok, _ = calls.complete_adding(chunk.id, chunk.lease_token, None, fan)
        assert ok
        calls.claim(["embed"], "w", timedelta(seconds=30), 2)  # two running
    assert e.pipeline_id is not None
    shown = jobkit("pipeline", "show", str(e.pipeline_id))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"pipeline {e.pipeline_id}: 1 of 14 succeeded, running embed")
    assert any("chunk succeeded" in line for line in lines)
    assert any("embed x 12: 10 queued, 2 running" in line for line in lines)
    assert any("reindex waiting for 12 of 12" in line for line in lines)
    listed = json.loads(jobkit("pipeline", "show", str(e.pipeline_id), "--json").stdout)
    assert [j["type"] for j in listed] == ["chunk"] + ["embed"] * 12 + ["reindex"]
    cancelled = jobkit("pipeline", "cancel", str(e.pipeline_id), "--reason", "not needed")
    assert cancelled.returncode == 0 and "13 jobs of pipeline" in cancelled.stdout
    left = pg.execute(
        "select count(*) as n from public.jobkit_jobs where status not in ('succeeded', 'cancelled')"
    )
    assert left.fetchone() == {"n": 0}
    missing = jobkit("pipeline", "show", "00000000-0000-4000-8000-000000000000")
    assert missing.returncode == 1 and "no pipeline" in missing.stderr
