"""What a failure leaves, on every store: the attempts its handler gives the job's type (jobkit_fail's
p_max_attempts, which a later reclaim honours too), and the traceback kept for operators (p_traceback)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest

from pgjobkit.core.failures import CUT, MAX_TRACEBACK_LENGTH
from pgjobkit.core.models import JobStatus
from pgjobkit.errors import InvalidArgument
from pgjobkit.stores.base import JobStore
from pgjobkit.worker.calls import WorkerCalls
from tests.contract.conftest import Harness
from tests.contract.test_contract import claim_one, new, token


def _status(store: JobStore, job_id: UUID) -> tuple[JobStatus, int, int]:
    job = store.get(job_id)
    assert job is not None
    return job.status, job.attempts, job.max_attempts


# --- a handler's max_attempts -------------------------------------------------------------------------------
def test_a_handlers_max_attempts_raises_the_jobs_own(store: JobStore, harness: Harness) -> None:
    """The README's max_attempts=5 on a job enqueued with the default 3: five attempts, not three."""
    job = store.enqueue(new())
    for attempt in (1, 2, 3, 4):
        c = claim_one(store)
        r = WorkerCalls(store).fail(c.id, token(c), "boom", timedelta(0), max_attempts=5)
        assert (r.status, r.attempts) == (JobStatus.RETRYING, attempt)
        assert _status(store, job.id) == (JobStatus.RETRYING, attempt, 5)
        harness.make_runnable(job.id)
    c = claim_one(store)
    r = WorkerCalls(store).fail(c.id, token(c), "boom", timedelta(0), max_attempts=5)
    assert (r.status, r.attempts) == (JobStatus.DEAD, 5)
    assert _status(store, job.id) == (JobStatus.DEAD, 5, 5)


def test_a_reclaim_after_a_failure_honours_the_handlers_max_attempts(
    store: JobStore, harness: Harness
) -> None:
    """A crash after the first failure counts against the handler's value the failure kept; before it,
    against the job's own."""
    job = store.enqueue(new(max_attempts=2))
    c = claim_one(store)
    WorkerCalls(store).fail(c.id, token(c), "boom", timedelta(0), max_attempts=4)
    harness.make_runnable(job.id)
    for attempt in (2, 3):  # past the job's own 2: still retried
        assert claim_one(store).attempts == attempt
        harness.expire_lease(job.id)
        assert {r.id: r.status for r in WorkerCalls(store).reclaim_expired()} == {job.id: JobStatus.RETRYING}
    assert claim_one(store).attempts == 4
    harness.expire_lease(job.id)
    assert {r.id: r.status for r in WorkerCalls(store).reclaim_expired()} == {job.id: JobStatus.DEAD}
    assert _status(store, job.id) == (JobStatus.DEAD, 4, 4)


def test_a_handlers_max_attempts_lowers_the_jobs_own_never_below_its_attempts(
    store: JobStore, harness: Harness
) -> None:
    lowered = store.enqueue(new(max_attempts=10))
    c = claim_one(store)
    r = WorkerCalls(store).fail(c.id, token(c), "boom", timedelta(0), max_attempts=2)
    assert r.status == JobStatus.RETRYING and _status(store, lowered.id) == (JobStatus.RETRYING, 1, 2)
    harness.make_runnable(lowered.id)
    c = claim_one(store)
    assert (
        WorkerCalls(store).fail(c.id, token(c), "boom", timedelta(0), max_attempts=2).status == JobStatus.DEAD
    )
    # three crashes (the job's own 5 allows them), then a handler that allows 2: dead, keeping attempts
    # <= max_attempts true
    crashed = store.enqueue(new("crashy", max_attempts=5))
    for _ in range(2):
        claim_one(store, "crashy")
        harness.expire_lease(crashed.id)
        WorkerCalls(store).reclaim_expired()
    c = claim_one(store, "crashy")
    r = WorkerCalls(store).fail(c.id, token(c), "boom", timedelta(seconds=60), max_attempts=2)
    assert (r.status, r.attempts) == (JobStatus.DEAD, 3)
    assert _status(store, crashed.id) == (JobStatus.DEAD, 3, 3)


def test_a_permanent_failure_keeps_the_handlers_max_attempts(store: JobStore) -> None:
    job = store.enqueue(new())
    c = claim_one(store)
    r = WorkerCalls(store).fail(c.id, token(c), "bad input", timedelta(0), True, max_attempts=7)
    assert (r.status, r.attempts) == (JobStatus.DEAD, 1)
    assert _status(store, job.id) == (JobStatus.DEAD, 1, 7)


@pytest.mark.parametrize("bad", [0, -1, 1001])
def test_a_max_attempts_out_of_range_is_refused_changing_nothing(store: JobStore, bad: int) -> None:
    job = store.enqueue(new())
    c = claim_one(store)
    with pytest.raises(InvalidArgument, match="max_attempts"):
        WorkerCalls(store).fail(c.id, token(c), "boom", timedelta(0), max_attempts=bad)
    assert _status(store, job.id) == (JobStatus.RUNNING, 1, 3)
    assert store.traceback(job.id) is None


def test_a_lost_lease_keeps_neither_max_attempts_nor_traceback(store: JobStore, harness: Harness) -> None:
    job = store.enqueue(new())
    stale = claim_one(store)
    harness.expire_lease(job.id)
    WorkerCalls(store).reclaim_expired()
    r = WorkerCalls(store).fail(stale.id, token(stale), "late", timedelta(0), max_attempts=9, traceback="tb")
    assert r.ok is False
    assert _status(store, job.id) == (JobStatus.RETRYING, 1, 3)
    assert store.traceback(job.id) is None


# --- tracebacks -----------------------------------------------------------------------------------------------
def test_a_failures_traceback_is_the_operators_latest_attempt(store: JobStore, harness: Harness) -> None:
    job = store.enqueue(new(max_attempts=5))
    assert store.traceback(job.id) is None and store.traceback(uuid4()) is None
    for attempt in (1, 2):
        c = claim_one(store)
        WorkerCalls(store).fail(c.id, token(c), "KeyError: 's'", timedelta(0), traceback=f"tb {attempt}\n")
        harness.make_runnable(job.id)
    kept = store.traceback(job.id)
    assert kept is not None
    assert (kept.job_id, kept.attempt, kept.text) == (job.id, 2, "tb 2\n")
    assert abs((kept.failed_at - datetime.now(UTC)).total_seconds()) < 60
    got = store.get(job.id)
    assert got is not None and got.error == "KeyError: 's'"  # what the job's owner reads: one line
    c = claim_one(store)  # a failure that sends none (a 0.5.0 worker's) leaves the last one
    WorkerCalls(store).fail(c.id, token(c), "again", timedelta(0))
    kept = store.traceback(job.id)
    assert kept is not None and kept.attempt == 2


def test_a_traceback_is_kept_to_its_end(store: JobStore) -> None:
    store.enqueue(new())
    c = claim_one(store)
    frames = "".join(f'  File "app.py", line {n}, in f{n}\n' for n in range(100_000))  # ~3.5 MB
    WorkerCalls(store).fail(c.id, token(c), "deep", timedelta(0), traceback=frames + "KeyError: 's'\n")
    kept = store.traceback(c.id)
    assert kept is not None and len(kept.text) <= MAX_TRACEBACK_LENGTH
    assert kept.text.startswith(CUT + '  File "app.py"')  # cut at a line's start
    assert kept.text.endswith("line 99999, in f99999\nKeyError: 's'\n")


def test_hostile_text_in_a_traceback_fails_nothing(store: JobStore, harness: Harness) -> None:
    job = store.enqueue(new(max_attempts=5))
    for text in ("nul \x00 here", "lone \ud800 surrogate \udcff", "é✓ \x1b[31m" * 200_000, ""):
        c = claim_one(store)
        r = WorkerCalls(store).fail(c.id, token(c), "hostile", timedelta(0), traceback=text)
        assert r.ok and r.status == JobStatus.RETRYING
        kept = store.traceback(job.id)
        assert kept is not None and len(kept.text) <= MAX_TRACEBACK_LENGTH
        harness.make_runnable(job.id)
    emptied = store.traceback(job.id)
    assert emptied is not None and emptied.text == ""
    c = claim_one(store)
    WorkerCalls(store).fail(c.id, token(c), "x", timedelta(0), traceback="a\x00b\ud800c")
    kept = store.traceback(job.id)
    assert kept is not None and kept.text == "a\\0b\ufffdc"


def test_prune_deletes_a_jobs_traceback_and_past_its_horizon_one_whose_job_is_gone(
    store: JobStore, harness: Harness
) -> None:
    pruned = store.enqueue(new(max_attempts=1))
    c = claim_one(store)
    WorkerCalls(store).fail(c.id, token(c), "boom", timedelta(0), traceback="tb pruned")
    harness.age(pruned.id, timedelta(hours=2))
    assert store.prune(timedelta(hours=1)) == 1
    assert store.traceback(pruned.id) is None
    # a job deleted another way (completed with delete, after a failure) leaves its traceback, which prune
    # deletes once it is past prune's horizon; the beats never read tracebacks
    gone = store.enqueue(new("gone", max_attempts=2))
    kept = store.enqueue(new("kept", max_attempts=1))
    for type_ in ("gone", "kept"):
        c = claim_one(store, type_)
        WorkerCalls(store).fail(c.id, token(c), "boom", timedelta(0), traceback=f"tb {type_}")
    harness.make_runnable(gone.id)
    c = claim_one(store, "gone")
    assert WorkerCalls(store).complete_many([(c.id, token(c))], delete=True) == {c.id: True}
    assert store.get(gone.id) is None and store.traceback(gone.id) is not None
    assert store.prune(timedelta(hours=1)) == 0
    assert store.traceback(gone.id) is not None  # not past the horizon yet
    harness.age_flow(timedelta(hours=2))
    store.worker_beat("w-tracebacks")
    assert store.traceback(gone.id) is not None  # a beat leaves it
    assert store.prune(timedelta(hours=1)) == 0  # no job deleted: the kept one's is more recent
    assert store.traceback(gone.id) is None
    left = store.traceback(kept.id)  # its job (dead, updated within the hour) is still there, and so is it
    assert left is not None and left.text == "tb kept"
