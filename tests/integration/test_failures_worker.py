"""The README's failing handler on the real database, on the direct path and on Supabase's: its
max_attempts=5 gives a job enqueued with the default 3 five attempts, and the operator reads, through the
store, the traceback that names the file and line that raised, while the job keeps its one-line error."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from pydantic import BaseModel

from pgjobkit import NewJob, Worker
from pgjobkit.stores.base import JobStore
from tests.integration.stores import open_store


@pytest.fixture(params=["postgres", "supabase"])
def store(request: pytest.FixtureRequest) -> Iterator[JobStore]:
    s = open_store(request.param, request)
    try:
        yield s
    finally:
        s.close()


class Embed(BaseModel):
    doc_id: int


def embed(payload: Embed) -> None:
    {"t": 1}["s"]  # KeyError: 's'


RAISED_AT = f'File "{__file__}", line {embed.__code__.co_firstlineno + 1}, in embed'


def test_the_readmes_handler_gets_its_five_attempts_and_leaves_its_traceback(
    store: JobStore, pg: psycopg.Connection[Any]
) -> None:
    worker = Worker(store, jitter=0.0)
    worker.handler("embed", max_attempts=5, payload=Embed)(embed)
    job = store.enqueue(NewJob(type="embed", payload={"doc_id": 1}))
    outcomes = []
    for _ in range(5):
        outcomes += [r.outcome for r in worker.tick().results]
        pg.execute("update public.jobkit_jobs set run_after = now() where status = 'retrying'")
    worker.close()
    assert outcomes == ["retrying"] * 4 + ["dead"]
    got = store.get(job.id)
    assert got is not None and (got.status, got.attempts, got.max_attempts) == ("dead", 5, 5)
    assert got.error == "KeyError: 's'"
    kept = store.traceback(job.id)
    assert kept is not None and kept.attempt == 5
    assert RAISED_AT in kept.text and kept.text.endswith("KeyError: 's'\n")
