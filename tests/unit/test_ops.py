"""How operations encode their calls: what reaches the SQL functions, independent of any store."""

from __future__ import annotations

from datetime import timedelta

from pgjobkit.core.models import NewJob
from pgjobkit.ops.jobs import job_object


def test_a_new_job_is_sent_with_its_defaults_left_out() -> None:
    assert job_object(NewJob(type="a")) == {"type": "a", "payload": {}}
    full = job_object(
        NewJob(
            type="a",
            payload={"x": None},
            idempotency_key="k",
            priority=2,
            max_attempts=5,
            delay=timedelta(seconds=1.5),
        )
    )
    assert full == {
        "type": "a",
        "payload": {"x": None},
        "idempotency_key": "k",
        "priority": 2,
        "max_attempts": 5,
        "delay_seconds": 1.5,
    }
