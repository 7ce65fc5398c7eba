"""``pgjobkit jobs JOB_ID``: one job whole, with the traceback its latest failed attempt left."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from tests.cli.conftest import Run, parse

TRACEBACK = (
    "Traceback (most recent call last):\n  File \"/srv/app/handlers.py\", line 42, in embed\nKeyError: 's'\n"
)


def test_one_job_shows_its_traceback(jobkit: Run, pg: psycopg.Connection[Any]) -> None:
    pg.execute("select public.jobkit_enqueue('embed', '{\"doc\": 7}')")
    claimed = pg.execute("select * from public.jobkit_claim(array['embed'], 'w', 30, 1)").fetchone()
    assert claimed is not None
    job_id = str(claimed["id"])
    before = parse(jobkit("jobs", job_id, "--json"))
    assert before["job"]["id"] == job_id and before["traceback"] is None
    pg.execute(
        "select public.jobkit_fail(%s, %s, 'KeyError: ''s''', p_traceback => %s)",
        (claimed["id"], claimed["lease_token"], TRACEBACK + "\x1b[2J"),
    )
    shown = parse(jobkit("jobs", job_id, "--json"))
    assert shown["job"]["error"] == "KeyError: 's'" and "lease_token" not in shown["job"]
    assert shown["traceback"]["attempt"] == 1 and shown["traceback"]["text"].startswith(TRACEBACK)
    text = jobkit("jobs", job_id)
    assert text.returncode == 0, text.stderr
    assert 'File "/srv/app/handlers.py", line 42, in embed' in text.stdout
    assert "traceback (attempt 1," in text.stdout and '"doc": 7' in text.stdout
    assert "\x1b" not in text.stdout and "\\x1b[2J" in text.stdout  # a terminal's controls, written out
    assert "lease token" not in text.stdout and str(claimed["lease_token"]) not in text.stdout


def test_an_unknown_job_exits_1_and_a_filter_with_an_id_exits_2(jobkit: Run) -> None:
    missing = jobkit("jobs", str(uuid.uuid4()))
    assert missing.returncode == 1 and "no job" in missing.stderr
    assert jobkit("jobs", str(uuid.uuid4()), "--status", "dead").returncode == 2
    assert jobkit("jobs", "not-a-uuid").returncode == 2
