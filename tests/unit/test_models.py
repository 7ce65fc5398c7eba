"""NewJob validates what the SQL would reject, before anything is sent."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest
from pydantic import ValidationError

from pgjobkit.core.models import Job, JobStatus, NewJob, check_result
from pgjobkit.errors import InvalidArgument


def nested(containers: int) -> dict[str, Any]:
    """A payload of ``containers`` nested containers, itself the first (as the SQL counts them)."""
    value: Any = []
    for _ in range(containers - 2):
        value = [value]
    return {"a": value}


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
        ({"type": "a", "payload": {"n": 10**4300}}, "beyond a double's range"),
        ({"type": "a", "payload": {"n": -(17976931348623157 * 10**292) - 1}}, "beyond a double's range"),
        ({"type": "a", "payload": {"n": [[1, 2**2000]]}}, "beyond a double's range"),
        ({"type": "a", "payload": nested(101)}, "deeper than 100"),
        ({"type": "a", "payload": nested(5000)}, "deeper than 100"),
        ({"type": "a", "payload": {"s": "\ud800"}}, "lone surrogates"),
        ({"type": "a", "payload": {"s": "a\x00"}}, "NUL"),
        ({"type": "a", "run_after": datetime(1969, 12, 31, tzinfo=UTC)}, "from 1970"),
        ({"type": "a", "run_after": datetime(9999, 1, 1, tzinfo=UTC)}, "from 1970"),
    ],
)
def test_new_job_rejects(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        NewJob.model_validate(fields)


def test_new_job_takes_json_at_the_bounds() -> None:
    largest = 17976931348623157 * 10**292  # 1.7976931348623157e308 written out, as PostgreSQL keeps it
    payload = {"deep": nested(100)["a"], "ints": [largest, -largest], "floats": [1.7976931348623157e308]}
    assert NewJob(type="a", payload=payload).payload == payload
    assert NewJob(type="a", run_after=datetime(1970, 1, 1, tzinfo=UTC)).run_after is not None


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (10**400, "beyond a double's range"),
        ({"r": nested(101)}, "deeper than 100"),
        ({"s": "\udfff"}, "lone surrogates"),
        (float("inf"), "NaN or Infinity"),
        ({1: object()}, "must be JSON"),
        ("x" * 70_000, "at most 65536 bytes"),
    ],
)
def test_a_result_no_client_could_read_back_is_refused(result: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_result(result)
    assert check_result({"ok": [1.5, 17976931348623157 * 10**292]}) is not None


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


def test_enqueue_asks_postgres_for_three_columns_only() -> None:
    from pgjobkit.ops.jobs import enqueue, enqueue_many
    from pgjobkit.stores.postgres.statements import DIALECT, render

    call = next(enqueue_many(DIALECT, [NewJob(type="a"), NewJob(type="b")]))
    query, params = render(call)
    assert query.startswith(b'select "inserted", "id", "status" from public."jobkit_enqueue_many"('), query
    assert params == ['[{"type":"a","payload":{}},{"type":"b","payload":{}}]']
    for op in (
        enqueue(DIALECT, NewJob(type="a", idempotency_key="k")),
        enqueue_many(DIALECT, [NewJob(type="a", idempotency_key="k")]),
    ):
        query, params = render(next(op))  # one job: typed arguments
        assert query == (
            b'select "inserted", "id", "status" from public."jobkit_enqueue"("p_type" => %s::text, '
            b'"p_payload" => %s::jsonb, "p_idempotency_key" => %s::text)'
        ), query
    assert params == ["a", "{}", "k"]
