"""What a failing handler leaves, driven by tick() on the memory store: the attempts its max_attempts gives
the job's type, the traceback in the worker's log and the operator's view, and the one line the job's owner
reads; and that a hostile exception fails nothing."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import pytest

from pgjobkit import InvalidArgument, JobStatus, MemoryStore, NewJob, Retry, Worker
from pgjobkit.core.failures import CUT, MAX_TRACEBACK_LENGTH, storable_traceback
from pgjobkit.core.models import MAX_ERROR_LENGTH
from pgjobkit.worker.results import format_traceback


def make(**kw: Any) -> tuple[MemoryStore, Worker]:
    store = MemoryStore()
    return store, Worker(store, name="test-worker", jitter=0.0, **kw)


def runnable_now(store: MemoryStore) -> None:
    for job in store.jobs():
        if job.status == JobStatus.RETRYING:
            store._put(job.model_copy(update={"run_after": datetime.now(UTC)}))


def lookup(payload: dict[str, Any]) -> Any:
    return payload["s"]  # KeyError: 's'


RAISED_AT = f'File "{__file__}", line {lookup.__code__.co_firstlineno + 1}, in lookup'


async def lookup_async(payload: dict[str, Any]) -> Any:
    return lookup(payload)


# --- a handler's max_attempts -------------------------------------------------------------------------------
def test_a_handlers_max_attempts_raises_the_jobs_default() -> None:
    """The README's ``max_attempts=5``: a job enqueued with the default 3 gets five attempts."""
    store, worker = make()
    worker.register("embed", lookup, max_attempts=5)
    job = store.enqueue(NewJob(type="embed"))
    outcomes = []
    for _ in range(5):
        outcomes += [r.outcome for r in worker.tick().results]
        runnable_now(store)
    assert outcomes == ["retrying"] * 4 + ["dead"]
    got = store.get(job.id)
    assert got is not None and (got.status, got.attempts, got.max_attempts) == (JobStatus.DEAD, 5, 5)
    worker.close()


def test_a_handlers_max_attempts_lowers_the_jobs_own_and_is_kept_on_it() -> None:
    store, worker = make()
    worker.register("capped", lookup, max_attempts=2)
    job = store.enqueue(NewJob(type="capped", max_attempts=10))
    assert [r.outcome for r in worker.tick().results] == ["retrying"]
    got = store.get(job.id)
    assert got is not None and got.max_attempts == 2  # what a reclaim of a later crash counts against
    runnable_now(store)
    assert [r.outcome for r in worker.tick().results] == ["dead"]
    worker.close()


@pytest.mark.parametrize("bad", [0, 1001, "5", True, 2.0])
def test_a_handlers_max_attempts_is_checked_at_registration(bad: Any) -> None:
    worker = Worker(MemoryStore())
    with pytest.raises(InvalidArgument, match="max_attempts of the handler for 'embed'"):
        worker.register("embed", lookup, max_attempts=bad)
    assert worker.handlers.types == []


# --- tracebacks -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("handler", [lookup, lookup_async], ids=["sync", "async"])
def test_a_failure_logs_the_file_and_line_that_raised_once_per_attempt(
    handler: Any, caplog: pytest.LogCaptureFixture
) -> None:
    store, worker = make()
    worker.register("embed", handler)
    job = store.enqueue(NewJob(type="embed", payload={"secret": "do-not-log"}, max_attempts=2))
    with caplog.at_level(logging.INFO, logger="pgjobkit.worker"):
        worker.tick()
        runnable_now(store)
        worker.tick()
    failures = [r for r in caplog.records if RAISED_AT in r.getMessage()]
    assert [(r.levelno, r.__dict__["attempt"]) for r in failures] == [
        (logging.WARNING, 1),
        (logging.ERROR, 2),
    ]
    first = failures[0].getMessage()
    assert first.startswith(f"job {job.id} type=embed attempt=1 retrying in 1.0s: KeyError: 's'\n")
    assert "Traceback (most recent call last):" in first and first.endswith("KeyError: 's'\n")
    assert "pgjobkit" not in first.partition("\n")[2]  # from the handler's frame: not the worker's calls
    assert failures[1].getMessage().startswith(f"job {job.id} type=embed attempt=2 dead: KeyError: 's'\n")
    assert "do-not-log" not in caplog.text
    worker.close()


def test_the_operator_reads_the_traceback_the_jobs_owner_the_one_line() -> None:
    store, worker = make()
    worker.register("embed", lookup)
    job = store.enqueue(NewJob(type="embed"))
    worker.tick()
    got, kept = store.get(job.id), store.traceback(job.id)
    assert got is not None and got.error == "KeyError: 's'"
    assert kept is not None and kept.attempt == 1
    assert RAISED_AT in kept.text and kept.text.endswith("KeyError: 's'\n")
    worker.close()


def test_a_retry_keeps_no_traceback_and_logs_one_line(caplog: pytest.LogCaptureFixture) -> None:
    """A Retry is the handler's own decision (a rate limit's, often in storms): its message is enough."""
    store, worker = make()

    def limited(payload: dict[str, Any]) -> None:
        raise Retry("rate limited", after=60)

    worker.register("api", limited)
    job = store.enqueue(NewJob(type="api"))
    with caplog.at_level(logging.WARNING, logger="pgjobkit.worker"):
        assert [r.outcome for r in worker.tick().results] == ["retrying"]
    [line] = [r.getMessage() for r in caplog.records if str(job.id) in r.getMessage()]
    assert line.endswith("retrying in 60.0s: Retry: rate limited") and "\n" not in line
    assert store.traceback(job.id) is None
    worker.close()


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


@pytest.mark.parametrize(
    "exc",
    [
        ValueError("nul \x00, lone \ud800 and \udcff, " + "x" * 1_000_000),
        Unprintable(),
        RecursionError("deep"),
    ],
    ids=["megabyte", "unprintable", "recursion"],
)
def test_a_hostile_exception_fails_nothing(exc: BaseException) -> None:
    store, worker = make()

    def hostile(payload: dict[str, Any]) -> None:
        raise exc

    worker.register("h", hostile)
    job = store.enqueue(NewJob(type="h"))
    [result] = worker.tick().results
    assert result.outcome == "retrying"
    got, kept = store.get(job.id), store.traceback(job.id)
    assert got is not None and got.error is not None and len(got.error) <= MAX_ERROR_LENGTH
    assert kept is not None and len(kept.text) <= MAX_TRACEBACK_LENGTH
    assert "\x00" not in kept.text and "\ud800" not in kept.text
    assert "in hostile" in kept.text  # the frame that raised is kept, however long the message
    worker.close()


def test_a_traceback_keeps_its_chain_and_cuts_each_piece() -> None:
    try:
        try:
            lookup({})
        except KeyError as inner:
            raise RuntimeError("m" * 50_000) from inner
    except RuntimeError as outer:
        text = format_traceback(outer)
    assert "KeyError: 's'" in text and "direct cause of the following exception" in text
    assert len(text) <= MAX_TRACEBACK_LENGTH
    line = "RuntimeError: " + "m" * 50_000
    assert text.endswith(line[:MAX_ERROR_LENGTH] + "[cut]\n")  # the error's line, cut


def test_a_traceback_past_its_bound_keeps_its_end_from_a_line() -> None:
    lines = "".join(f"line {n}\n" for n in range(5000))
    kept = storable_traceback(lines)
    assert len(kept) <= MAX_TRACEBACK_LENGTH and kept.startswith(CUT + "line ")
    assert kept.endswith("line 4999\n")
    assert storable_traceback("short\x00\ud800") == "short\\0\ufffd"
