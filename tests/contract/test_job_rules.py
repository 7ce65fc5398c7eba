"""A job's rules, the JobStore contract: every bad example of core.job_rules' table is refused by every store
(jobkit_check_jobs in SQL, the table in the MemoryStore) with the SQL's message, through jobkit_enqueue_many
and through jobkit_enqueue, and nothing is written; a job that uses every key is taken."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import pytest

from pgjobkit.core.job_rules import JOB_KEYS, RULES
from pgjobkit.errors import InvalidArgument
from pgjobkit.ops import Call, Op, as_uuid
from pgjobkit.stores.base import JobStore

CASES = [(rule.message, bad) for rule in RULES for bad in rule.bad]
GOOD: dict[str, Any] = {  # every key but delay_seconds (given with run_after, it is a problem of its own)
    "type": "embed",
    "payload": {"n": 1},
    "idempotency_key": "rules-good",
    "priority": -5,
    "max_attempts": 7,
    "user_id": None,
    "run_after": "2030-01-01T00:00:00+00:00",
    "fair_key": "tenant",
    "trace_context": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
}
# jobkit_enqueue's typed arguments, by key, and the Python values each carries as itself (user_id is left
# out: a malformed uuid fails its cast before any rule)
_ARGUMENTS: dict[str, tuple[str, Any]] = {
    "type": ("text", str),
    "payload": ("jsonb", object),
    "idempotency_key": ("text", str),
    "priority": ("integer", int),
    "max_attempts": ("integer", int),
    "run_after": ("timestamptz", str),
    "delay_seconds": ("double precision", int | float),
    "fair_key": ("text", str),
    "trace_context": ("jsonb", object),
}


def _many(jobs: list[Any]) -> Op[Any]:
    """jobkit_enqueue_many as any client may call it: the objects unchecked by Python."""
    return (yield Call("jobkit_enqueue_many", {"p_jobs": ("jsonb", jobs)}, columns=("id",)))


def _one(job: dict[str, Any]) -> Op[Any]:
    """jobkit_enqueue, one typed argument per key."""
    args = {f"p_{k}": (_ARGUMENTS[k][0], v) for k, v in job.items()}
    return (yield Call("jobkit_enqueue", args, columns=("id",)))


_OVER_HTTP = re.compile(r"jobkit: jobkit_\w+: (.*) \(HTTP 400, JK001\)", re.DOTALL)


def said(refused: InvalidArgument) -> str:
    """The SQL's message in ``refused``: as raised, or as the Supabase store quotes it (the function, the
    message, the HTTP status and SQLSTATE)."""
    quoted = _OVER_HTTP.fullmatch(str(refused))
    return quoted.group(1) if quoted else str(refused)


def _typed(job: Any) -> bool:
    """Whether ``job`` can travel as jobkit_enqueue's typed arguments: a type, and each value of its
    argument's own type (a time that parses, an integer within int4)."""
    if (
        not isinstance(job, dict)
        or not isinstance(job.get("type"), str)
        or not job.keys() <= _ARGUMENTS.keys()
    ):
        return False
    for key, value in job.items():
        sql, kind = _ARGUMENTS[key]
        if isinstance(value, bool) or not isinstance(value, kind):
            return False
        if sql == "integer" and not -(2**31) <= value < 2**31:
            return False
        if sql == "timestamptz":
            try:
                datetime.fromisoformat(value)
            except ValueError:
                return False
    return True


def test_every_bad_example_is_refused_with_the_sqls_message(store: JobStore) -> None:
    for message, bad in CASES:
        with pytest.raises(InvalidArgument) as refused:
            store.run(_many([GOOD, bad]))
        assert said(refused.value) == f"jobkit: job 1: {message}", bad
    assert store.stats().rows == ()  # not even the good one: a batch is all or nothing


def test_a_bad_typed_argument_is_refused_by_enqueue_with_the_same_message(store: JobStore) -> None:
    typed = [(message, bad) for message, bad in CASES if _typed(bad)]
    assert len({message for message, _ in typed}) >= 10  # most rules are reachable by typed arguments
    for message, bad in typed:
        with pytest.raises(InvalidArgument) as refused:
            store.run(_one(bad))
        assert said(refused.value) == f"jobkit: {message}", bad
    assert store.stats().rows == ()


def test_a_job_that_uses_every_key_is_taken(store: JobStore) -> None:
    assert set(GOOD) | {"delay_seconds"} == set(JOB_KEYS)
    [row] = store.run(_many([GOOD]))
    job = store.get(as_uuid(row["id"]))
    assert job is not None and (job.priority, job.max_attempts, job.fair_key) == (-5, 7, "tenant")
    assert store.trace_contexts([job.id]) == {job.id: GOOD["trace_context"]}
    [row] = store.run(_one({"type": "embed", "delay_seconds": 1.5, "trace_context": {"traceparent": "x"}}))
    assert store.trace_contexts([as_uuid(row["id"])]) == {as_uuid(row["id"]): {"traceparent": "x"}}
