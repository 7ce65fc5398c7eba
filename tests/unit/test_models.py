"""NewJob validates what the SQL would reject, before anything is sent."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest
from pydantic import ValidationError

from jobkit.models import Job, JobStatus, NewJob


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


def test_a_job_is_built_from_a_typed_row_validated() -> None:
    now = datetime.now(UTC)
    row: dict[str, Any] = {
        "id": uuid4(),
        "user_id": None,
        "type": "embed",
        "status": "running",
        "payload": {"n": [1, 2]},
        "idempotency_key": "k",
        "attempts": 1,
        "max_attempts": 3,
        "priority": 5,
        "run_after": now,
        "lease_until": now + timedelta(seconds=30),
        "lease_token": uuid4(),
        "claimed_by": "w1",
        "error": None,
        "created_at": now,
        "updated_at": now,
        "ord": 1,
        "inserted": True,
    }
    claimed = row | {"progress": 0.5, "progress_message": "half", "result": {"ok": [1]}}
    for r in (row, claimed):  # an enqueue's row has no progress nor result; a claim's has both
        job = Job.from_row(r)
        assert job.model_dump() == {k: r.get(k) for k in Job.model_fields} | {
            "status": JobStatus.RUNNING,
            "fair_round": 0,
        }
        assert job.model_fields_set == set(r) & set(Job.model_fields)  # "ord" and "inserted" are ignored
    job = Job.from_row(row)
    assert job.status is JobStatus.RUNNING and job == Job.from_row(dict(row))
    assert job.model_copy(update={"attempts": 2}).attempts == 2 and copy.deepcopy(job) == job
    assert "lease_token" not in repr(job)
    with pytest.raises(ValidationError):
        job.attempts = 2  # frozen, like every Job
    with pytest.raises(ValidationError, match="attempts"):
        Job.from_row(row | {"attempts": "many"})  # validated: a row that is not a job is refused


def test_enqueue_ids_asks_postgres_for_two_columns_only() -> None:
    from jobkit.ops import enqueue_ids
    from jobkit.stores.postgres import CODEC, _sql

    call = next(enqueue_ids(CODEC, [NewJob(type="a"), NewJob(type="b")]))
    query, params = _sql(call)
    assert query.startswith(b'select "inserted", "id" from public."jobkit_enqueue_many"('), query
    assert params == ['[{"type":"a","payload":{}},{"type":"b","payload":{}}]']
    call = next(enqueue_ids(CODEC, [NewJob(type="a", idempotency_key="k")]))  # one job: typed arguments
    query, params = _sql(call)
    assert query == (
        b'select "inserted", "id" from public."jobkit_enqueue"("p_type" => %s::text, '
        b'"p_payload" => %s::jsonb, "p_idempotency_key" => %s::text)'
    ), query
    assert params == ["a", "{}", "k"]
