"""NewJob validates what the SQL would reject, before anything is sent."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from jobkit.models import NewJob


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"type": ""}, "type"),
        ({"type": "a\x00b"}, "control characters"),
        ({"type": "x" * 201}, "type"),
        ({"type": "a", "payload": [1]}, "payload"),
        ({"type": "a", "max_attempts": 0}, "max_attempts"),
        ({"type": "a", "priority": 10**7}, "priority"),
        ({"type": "a", "idempotency_key": ""}, "idempotency_key"),
        ({"type": "a", "run_after": datetime(2030, 1, 1)}, "timezone-aware"),
        ({"type": "a", "delay": timedelta(seconds=-1)}, "delay"),
        ({"type": "a", "delay": timedelta(1), "run_after": datetime(2030, 1, 1, tzinfo=UTC)}, "not both"),
        ({"type": "a", "typo": 1}, "typo"),
    ],
)
def test_new_job_rejects(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        NewJob.model_validate(fields)


def test_to_sql_is_minimal() -> None:
    assert NewJob(type="a").to_sql() == {"type": "a", "payload": {}}
    full = NewJob(
        type="a",
        payload={"x": None},
        idempotency_key="k",
        priority=2,
        max_attempts=5,
        delay=timedelta(seconds=1.5),
    ).to_sql()
    assert full == {
        "type": "a",
        "payload": {"x": None},
        "idempotency_key": "k",
        "priority": 2,
        "max_attempts": 5,
        "delay_seconds": 1.5,
    }
