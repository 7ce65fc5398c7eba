"""``pgjobkit limit`` and ``pgjobkit schedule``: the happy paths, --json that parses, bad input that exits 2."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.cli.conftest import Run, parse


def test_limits_set_list_show_in_stats_and_delete(jobkit: Run) -> None:
    out = jobkit("limit", "set", "embed", "--max-running", "20", "--rate", "3000/1m", "--per-key", "2")
    assert out.returncode == 0, out.stderr
    assert "running 0/20" in out.stdout and "started 0/3000 per 60s" in out.stdout
    [lim] = parse(jobkit("limit", "list", "--json"))
    assert (lim["type"], lim["max_running"], lim["max_starts"], lim["max_running_per_key"]) == (
        "embed",
        20,
        3000,
        2,
    )
    assert parse(jobkit("stats", "--json"))["limits"][0]["type"] == "embed"
    assert "limits:" in jobkit("stats").stdout
    assert jobkit("limit", "set", "embed", "--max-running", "0").returncode == 0  # the others are removed
    [lim] = parse(jobkit("limit", "list", "--json"))
    assert (lim["max_running"], lim["max_starts"]) == (0, None)
    assert "paused" in jobkit("limit", "list").stdout
    assert "removed" in jobkit("limit", "delete", "embed").stdout
    assert parse(jobkit("limit", "list", "--json")) == []


def test_schedules_set_list_and_delete(jobkit: Run) -> None:
    out = jobkit(
        "schedule", "set", "nightly", "--cron", "0 3 * * *", "--type", "reindex",
        "--timezone", "Europe/Berlin", "--payload", '{"full": true}', "--misfire", "catch_up",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "schedule nightly: reindex" in out.stdout
    [s] = parse(jobkit("schedule", "list", "--json"))
    assert (s["name"], s["cron"], s["timezone"], s["payload"], s["misfire"]) == (
        "nightly", "0 3 * * *", "Europe/Berlin", {"full": True}, "catch_up",
    )  # fmt: skip
    assert s["next_due_at"] is not None and s["next_due_at"].endswith(("T01:00:00+00:00", "T02:00:00+00:00"))
    assert "nightly" in jobkit("schedule", "list").stdout
    assert "removed" in jobkit("schedule", "delete", "nightly").stdout
    assert "no schedule" in jobkit("schedule", "delete", "nightly").stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["limit", "set", "embed"], "at least one limit"),
        (["limit", "set", "embed", "--rate", "fast"], "3000/1m"),
        (["limit", "set", "embed", "--max-running", "-1"], "--max-running"),
        (["schedule", "set", "s", "--cron", "0 25 * * *", "--type", "t"], "hour field '25'"),
        (["schedule", "set", "s", "--cron", "* * *", "--type", "t"], "expected 5 fields"),
        (
            ["schedule", "set", "s", "--cron", "* * * * *", "--type", "t", "--timezone", "Mars/Base"],
            "Mars/Base",
        ),
        (["schedule", "set", "s", "--cron", "* * * * *", "--type", "t", "--payload", "[]"], "payload"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(
    jobkit: Run, pg: psycopg.Connection[Any], args: list[str], message: str
) -> None:
    result = jobkit(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr
    row = pg.execute(
        "select (select count(*) from public.jobkit_limits) + (select count(*) from public.jobkit_schedules) as n"
    ).fetchone()
    assert row is not None and row["n"] == 0
