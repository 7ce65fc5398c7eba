"""The pure core: every transition and the backoff schedule, with no clock and no database."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest

from pgjobkit.core import transitions
from pgjobkit.core.models import Job, JobStatus
from pgjobkit.errors import InvalidArgument

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)


def job(**kw: object) -> Job:
    base: dict[str, object] = {
        "id": uuid4(),
        "type": "embed",
        "status": JobStatus.QUEUED,
        "payload": {},
        "attempts": 0,
        "max_attempts": 3,
        "priority": 0,
        "run_after": NOW,
        "created_at": NOW,
        "updated_at": NOW,
    }
    return Job.model_validate({**base, **kw})


def running(attempts: int = 1, max_attempts: int = 3) -> Job:
    j = job(attempts=attempts - 1, max_attempts=max_attempts)
    return transitions.claim(j, now=NOW, worker="w", lease=LEASE, token=uuid4())


def applied(outcome: transitions.Transition) -> Job:
    assert isinstance(outcome, transitions.Applied)
    return outcome.job


def test_runnable_is_status_and_time() -> None:
    assert transitions.is_runnable(job(), NOW)
    assert transitions.is_runnable(job(status=JobStatus.RETRYING), NOW)
    assert not transitions.is_runnable(job(run_after=NOW + timedelta(seconds=1)), NOW)
    for status in (JobStatus.RUNNING, JobStatus.SUCCEEDED, JobStatus.DEAD):
        assert not transitions.is_runnable(job(status=status), NOW)


def test_claim() -> None:
    token = uuid4()
    c = transitions.claim(job(), now=NOW, worker="w1", lease=LEASE, token=token)
    assert (c.status, c.attempts, c.lease_until, c.lease_token, c.claimed_by, c.updated_at) == (
        JobStatus.RUNNING,
        1,
        NOW + LEASE,
        token,
        "w1",
        NOW,
    )
    with pytest.raises(ValueError, match="not runnable"):
        transitions.claim(c, now=NOW, worker="w1", lease=LEASE, token=token)


def test_claim_order() -> None:
    a = job(priority=1, run_after=NOW)
    b = job(priority=5, run_after=NOW + timedelta(seconds=1))
    c = job(priority=1, run_after=NOW - timedelta(seconds=1))
    assert sorted([a, b, c], key=transitions.claim_order) == [b, c, a]


def test_complete_and_lease_fencing() -> None:
    r = running()
    assert r.lease_token is not None
    done = applied(transitions.complete(r, r.lease_token, now=NOW, job_id=r.id))
    assert (done.status, done.lease_until, done.lease_token) == (JobStatus.SUCCEEDED, None, None)
    assert transitions.complete(r, uuid4(), now=NOW, job_id=r.id) == transitions.LeaseLost(r.id)
    assert transitions.complete(None, uuid4(), now=NOW, job_id=r.id) == transitions.LeaseLost(r.id)
    assert transitions.complete(done, r.lease_token, now=NOW, job_id=r.id) == transitions.LeaseLost(r.id)


def test_fail_retrying_then_dead() -> None:
    r = running(attempts=1, max_attempts=2)
    assert r.lease_token is not None
    retry = applied(
        transitions.fail(r, r.lease_token, now=NOW, job_id=r.id, error="e1", retry_delay=timedelta(seconds=4))
    )
    assert (retry.status, retry.run_after, retry.error, retry.lease_token) == (
        JobStatus.RETRYING,
        NOW + timedelta(seconds=4),
        "e1",
        None,
    )
    again = transitions.claim(retry, now=NOW + timedelta(seconds=4), worker="w", lease=LEASE, token=uuid4())
    assert again.lease_token is not None
    dead = applied(
        transitions.fail(again, again.lease_token, now=NOW, job_id=r.id, error="e2", retry_delay=timedelta(0))
    )
    assert (dead.status, dead.attempts, dead.error) == (JobStatus.DEAD, 2, "e2")


def test_fail_permanent_and_bounded_error() -> None:
    r = running(attempts=1, max_attempts=5)
    assert r.lease_token is not None
    dead = applied(
        transitions.fail(
            r, r.lease_token, now=NOW, job_id=r.id, error="x" * 5000, retry_delay=timedelta(0), permanent=True
        )
    )
    assert dead.status == JobStatus.DEAD and len(dead.error or "") == 4000
    assert transitions.fail(
        r, uuid4(), now=NOW, job_id=r.id, error="x", retry_delay=timedelta(0)
    ) == transitions.LeaseLost(r.id)
    with pytest.raises(InvalidArgument):
        transitions.fail(r, r.lease_token, now=NOW, job_id=r.id, error="x", retry_delay=timedelta(seconds=-1))


def test_heartbeat_and_release() -> None:
    r = running(attempts=2)
    assert r.lease_token is not None
    ext = applied(transitions.heartbeat(r, r.lease_token, now=NOW, job_id=r.id, lease=timedelta(minutes=5)))
    assert ext.lease_until == NOW + timedelta(minutes=5)
    assert transitions.heartbeat(r, uuid4(), now=NOW, job_id=r.id, lease=LEASE) == transitions.LeaseLost(r.id)
    rel = applied(transitions.release(r, r.lease_token, now=NOW, job_id=r.id))
    assert (rel.status, rel.attempts, rel.lease_token) == (JobStatus.RETRYING, 1, None)
    first = running(attempts=1)
    assert first.lease_token is not None
    assert (
        applied(transitions.release(first, first.lease_token, now=NOW, job_id=first.id)).status
        == JobStatus.QUEUED
    )


def test_reclaim() -> None:
    r = running(attempts=1, max_attempts=2)
    later = NOW + LEASE
    assert not transitions.is_expired(r, NOW)
    assert transitions.is_expired(r, later)
    back = transitions.reclaim(r, now=later)
    assert (back.status, back.run_after, back.lease_token) == (JobStatus.RETRYING, later, None)
    assert "lease expired" in (back.error or "")
    last = running(attempts=2, max_attempts=2)
    assert transitions.reclaim(last, now=later).status == JobStatus.DEAD
    with pytest.raises(ValueError, match="expired"):
        transitions.reclaim(r, now=NOW)


def test_requeue() -> None:
    d = job(status=JobStatus.DEAD, attempts=3)
    q = transitions.requeue(d, now=NOW)
    assert (q.status, q.attempts, q.run_after) == (JobStatus.QUEUED, 0, NOW)
    with pytest.raises(ValueError, match="not dead"):
        transitions.requeue(job(), now=NOW)


def test_backoff_schedule() -> None:
    got = [transitions.backoff(n).total_seconds() for n in range(1, 12)]
    assert got == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]
    assert transitions.backoff(10_000).total_seconds() == 300
    assert transitions.backoff(3, base=0.5, cap=10).total_seconds() == 2


def test_backoff_jitter_bounds_and_determinism() -> None:
    rng = random.Random(7)
    values = [transitions.backoff(4, jitter=0.25, random=rng.random).total_seconds() for _ in range(500)]
    assert all(6 <= v <= 10 for v in values)
    assert max(values) - min(values) > 3  # it really varies
    again = random.Random(7)
    assert values[:5] == [
        transitions.backoff(4, jitter=0.25, random=again.random).total_seconds() for _ in range(5)
    ]
    assert transitions.backoff(20, jitter=1.0, random=lambda: 0.999).total_seconds() == 300  # still capped
    assert transitions.backoff(1, jitter=0.5, random=lambda: 0.0).total_seconds() == 0.5


@pytest.mark.parametrize("kwargs", [{"attempt": 0}, {"attempt": 1, "base": 0}, {"attempt": 1, "jitter": 2}])
def test_backoff_bad_input(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidArgument):
        transitions.backoff(**kwargs)  # type: ignore[arg-type]


def test_jitter_needs_a_random_source() -> None:
    with pytest.raises(InvalidArgument, match="random source"):
        transitions.backoff(1, jitter=0.1)
