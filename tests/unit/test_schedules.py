"""Schedules' due times by misfire policy, their input checks, and the scheduler and worker on the memory
store with a clock the test moves."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pgjobkit import Worker
from pgjobkit.core.schedules import Schedule
from pgjobkit.errors import InvalidArgument
from pgjobkit.stores.memory import MemoryStore
from pgjobkit.worker.scheduler import Scheduler

T0 = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


@pytest.mark.parametrize(("misfire", "expected"), [("catch_up", [1, 2, 3, 4, 5]), ("skip", [5])])
def test_due_times_after_a_gap_by_misfire(misfire: Any, expected: list[int]) -> None:
    s = Schedule(name="s", cron="* * * * * *", type="t", misfire=misfire, last_due_at=T0)
    assert s.due(_at(5.5)) == [_at(n) for n in expected]
    assert s.due(_at(0.5)) == []  # nothing due yet


def test_catch_up_hands_out_at_most_1000_at_a_time() -> None:
    s = Schedule(name="s", cron="* * * * * *", type="t", misfire="catch_up", last_due_at=T0)
    due = s.due(_at(3000))
    assert len(due) == 1000 and due[0] == _at(1) and due[-1] == _at(1000)


def test_skip_finds_the_latest_after_a_long_gap() -> None:
    s = Schedule(name="s", cron="* * * * * *", type="t", last_due_at=T0)
    assert s.due(_at(86_400.5)) == [_at(86_400)]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cron": "61 * * * *"}, "minute"),
        ({"timezone": "Mars/Base"}, "Mars/Base"),
        ({"name": ""}, "name"),
        ({"name": "x" * 151}, "name"),
        ({"misfire": "sometimes"}, "misfire"),
        ({"type": ""}, "type"),
        ({"max_attempts": 0}, "max_attempts"),
    ],
)
def test_bad_schedules_name_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        Schedule(**({"name": "s", "cron": "* * * * *", "type": "t"} | fields))


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def test_schedulers_share_each_due_time() -> None:
    clock = Clock()
    store = MemoryStore(clock=clock)
    store.set_schedule(Schedule(name="s", cron="* * * * * *", type="tick", misfire="catch_up"))
    first, second = Scheduler(store.as_async()), Scheduler(store.as_async())

    async def both() -> tuple[tuple[int, float], tuple[int, float]]:
        return await first.atick(), await second.atick()

    clock.now = _at(3.2)
    (enqueued, wait), (again, _) = asyncio.run(both())
    assert (enqueued, again) == (3, 0)
    assert wait == pytest.approx(0.8)  # until the next due time
    assert sorted(j.run_after for j in store.jobs()) == [_at(1), _at(2), _at(3)]


def test_a_worker_with_schedules_runs_the_scheduled_jobs() -> None:
    store = MemoryStore()
    store.set_schedule(Schedule(name="s", cron="* * * * * *", type="tick"))
    worker = Worker(store, schedules=True, poll_interval=0.05)
    ran: list[datetime] = []
    worker.register("tick", lambda payload, job: ran.append(job.run_after))
    stopper = threading.Timer(2.5, worker.stop)
    stopper.start()
    try:
        worker.run(install_signals=False)
    finally:
        stopper.cancel()
    assert 1 <= len(ran) <= 3 and len(set(ran)) == len(ran)
