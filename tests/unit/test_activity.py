"""A worker's attempts tallied by the minute until its next beat (pgjobkit.core.workers.Activity)."""

from __future__ import annotations

from datetime import UTC, datetime

from pgjobkit.core.workers import Activity

T = datetime(2026, 12, 6, 10, 0, 30, tzinfo=UTC).timestamp()


def test_attempts_are_tallied_by_minute_type_and_outcome() -> None:
    a = Activity()
    a.add(T, "embed", "succeeded", run=1.0, wait=2.0)
    a.add(T + 20, "embed", "succeeded", run=3.0, wait=0.5)
    a.add(T + 40, "embed", "succeeded", run=1.0, wait=0.0)  # the next minute
    a.add(T, "embed", "dead", run=-1.0, wait=-1.0)  # a clock step back counts as nothing
    rows = a.take()
    assert [(r["minute"], r["outcome"], r["jobs"]) for r in rows] == [
        ("2026-12-06T10:00:00+00:00", "dead", 1),
        ("2026-12-06T10:00:00+00:00", "succeeded", 2),
        ("2026-12-06T10:01:00+00:00", "succeeded", 1),
    ]
    assert (rows[1]["run_seconds"], rows[1]["run_max"], rows[1]["wait_seconds"], rows[1]["wait_max"]) == (
        4.0,
        3.0,
        2.5,
        2.0,
    )
    assert (rows[0]["run_seconds"], rows[0]["wait_max"]) == (0.0, 0.0)
    assert not a and a.take() == []


def test_a_beat_that_failed_gives_its_tallies_back_to_the_next() -> None:
    a = Activity()
    a.add(T, "embed", "succeeded", run=1.0, wait=1.0)
    taken = a.take()
    a.add(T + 5, "embed", "succeeded", run=2.0, wait=0.0)
    a.give_back(taken)
    [row] = a.take()
    assert (row["jobs"], row["run_seconds"], row["run_max"], row["wait_seconds"]) == (2, 3.0, 2.0, 1.0)


def test_past_its_limit_the_oldest_minutes_go_first() -> None:
    a = Activity(limit=3)
    for minute in range(5):
        a.add(T + 60 * minute, "embed", "succeeded", run=0.0, wait=0.0)
    assert [r["minute"][11:16] for r in a.take()] == ["10:02", "10:03", "10:04"]
