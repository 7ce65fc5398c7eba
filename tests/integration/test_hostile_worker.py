"""A worker among hostile rows and hostile handlers: whatever the database holds, and whatever a handler
returns, raises or reports, the job at fault ends alone with a clear error, the rest of its batch runs,
the worker never exits and leaves nothing running. On the direct path and on Supabase's."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest

from pgjobkit import NewJob, Permanent, Retry, Worker, current
from pgjobkit.stores.base import JobStore
from pgjobkit.stores.postgres import PostgresStore
from tests.integration.stores import open_store
from tests.sql.helpers import make_user, user_claims


@pytest.fixture(params=["postgres", "supabase"])
def store(request: pytest.FixtureRequest) -> Iterator[JobStore]:
    s = open_store(request.param, request)
    try:
        yield s
    finally:
        s.close()


def statuses(pg: psycopg.Connection[Any]) -> dict[str, tuple[str, str | None]]:
    rows = pg.execute("select payload ->> 'name' as name, status, error from public.jobkit_jobs").fetchall()
    return {r["name"]: (r["status"], r["error"]) for r in rows}


# Rows written before jobkit's bounds held (their owner drops the domains' checks here to write them):
# JSON Python cannot read, and times no datetime holds.
HOSTILE_ROWS = {
    "huge number": ("""'{"name": "huge number", "n": 1e4300}'""", "default"),
    "deep": ("""('{"name": "deep", "d": ' || repeat('[', 3000) || repeat(']', 3000) || '}')""", "default"),
    "endless": ("""'{"name": "endless"}'""", "'infinity'"),
}


def test_rows_no_client_can_read_fail_alone(store: JobStore, pg: psycopg.Connection[Any]) -> None:
    for constraint in ("jobkit_payload_nests_at_most_100_deep", "jobkit_payload_numbers_within_double_range"):
        pg.execute(f"alter domain public.jobkit_payload drop constraint {constraint}")
    for name in ("one", "two"):
        store.enqueue(NewJob(type="t", payload={"name": name}))
    for payload, created in HOSTILE_ROWS.values():
        pg.execute(
            f"insert into public.jobkit_jobs (type, payload, created_at) values ('t', {payload}::jsonb, {created})"
        )
    store.enqueue(NewJob(type="t", payload={"name": "three"}))
    ran: list[str] = []
    worker = Worker(store, batch_size=10, concurrency=2)  # one claim takes them all
    worker.register("t", lambda p: ran.append(p["name"]))
    summary = worker.run(until_empty=True, install_signals=False)
    assert sorted(ran) == ["one", "three", "two"] and summary.succeeded == 3
    final = statuses(pg)
    assert {name: final[name][0] for name in ("one", "two", "three")} == dict.fromkeys(
        ("one", "two", "three"), "succeeded"
    )
    for name in HOSTILE_ROWS:
        status, error = final[name]
        assert status == "dead" and error is not None, name
        assert error.startswith("jobkit: the worker cannot read this job ("), error
    assert "payload" in final["huge number"][1] and "created_at" in final["endless"][1]  # type: ignore[operator]


def test_hostile_handlers_fail_their_own_jobs_only(store: JobStore, pg: psycopg.Connection[Any]) -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    def handler(payload: dict[str, Any]) -> Any:
        case = payload["name"]
        if case == "progress":
            current().progress(0.5, "half \ud800 way \x00")
            return {"ok": True}
        if case == "retry back in time" and current().job.attempts == 1:
            raise Retry("again", after=-5)
        results: dict[str, Any] = {
            "huge result": 10**400,
            "deep result": json.loads("[" * 150 + "]" * 150),
            "surrogate result": {"s": "\ud800"},
            "nan result": float("nan"),
        }
        if case in results:
            return results[case]
        raises: dict[str, BaseException] = {
            "huge error": ValueError("e" * 1_000_000),
            "surrogate error": ValueError("bad \ud800 \x00 text"),
            "unprintable error": Unprintable(),
            "retry in a billion seconds": Retry("later", after=1e9),
        }
        if case in raises:
            raise raises[case]
        return None

    names = [
        "fine",
        "progress",
        "retry back in time",
        "huge result",
        "deep result",
        "surrogate result",
        "nan result",
        "huge error",
        "surrogate error",
        "unprintable error",
        "retry in a billion seconds",
    ]
    store.enqueue_many(
        [NewJob(type="h", payload={"name": n}, max_attempts=1 if "error" in n else 2) for n in names]
    )
    worker = Worker(store, batch_size=4, concurrency=3, backoff_base=0.01)
    worker.register("h", handler)
    worker.run(until_empty=True, install_signals=False)
    final = statuses(pg)
    assert {n: final[n][0] for n in names} == {
        "fine": "succeeded",
        "progress": "succeeded",
        "retry back in time": "succeeded",  # its delay was held to 0, not refused
        "huge result": "dead",
        "deep result": "dead",
        "surrogate result": "dead",
        "nan result": "dead",
        "huge error": "dead",
        "surrogate error": "dead",
        "unprintable error": "dead",
        "retry in a billion seconds": "retrying",  # held to the longest delay there is: a year
    }
    assert "beyond a double's range" in str(final["huge result"][1])
    assert "deeper than 100" in str(final["deep result"][1])
    assert "lone surrogates" in str(final["surrogate result"][1])
    assert len(str(final["huge error"][1])) == 4000
    assert final["surrogate error"][1] == "ValueError: bad \ufffd \\0 text"
    assert final["unprintable error"][1] == "Unprintable"
    late = pg.execute(
        "select run_after from public.jobkit_jobs where payload ->> 'name' = 'retry in a billion seconds'"
    )
    row = late.fetchone()
    assert row is not None and row["run_after"] > datetime.now(UTC) + timedelta(days=300)


def test_a_row_a_user_holds_locked_does_not_stall_the_batch(db_url: str, pg: psycopg.Connection[Any]) -> None:
    """A user cancels their running job inside a transaction held open on a direct SQL session: the worker
    completes the rest of the batch at once, and counts the held job lost."""
    user = make_user(pg)
    store = PostgresStore(db_url, max_size=4)
    mine = store.enqueue(NewJob(type="t", payload={"name": "mine"}, user_id=UUID(user)))
    store.enqueue_many([NewJob(type="t", payload={"name": f"other {i}"}) for i in range(3)])
    started, release = threading.Event(), threading.Event()

    def handler(payload: dict[str, Any]) -> None:
        if payload["name"] == "mine":
            started.set()
            release.wait(10)

    worker = Worker(store, batch_size=4, concurrency=4)
    worker.register("t", handler)
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(worker.tick()))
    with psycopg.connect(db_url) as holder:
        thread.start()
        assert started.wait(10)
        holder.execute("set role authenticated")
        holder.execute("select set_config('request.jwt.claims', %s, true)", (json.dumps(user_claims(user)),))
        holder.execute("select * from public.jobkit_user_cancel(%s)", (mine.id,)).fetchall()
        began = time.monotonic()
        release.set()
        thread.join(20)
        waited = time.monotonic() - began
        assert not thread.is_alive(), "the worker waited on the user's lock"
        holder.commit()
    worker.close()
    store.close()
    [tick] = result
    assert waited < 10
    assert tick.count("succeeded") == 3 and tick.count("lost") == 1
    final = statuses(pg)
    assert final["mine"][0] == "cancelled"
    assert all(final[f"other {i}"][0] == "succeeded" for i in range(3))


def test_a_job_the_worker_cannot_run_is_never_left_running(
    store: JobStore, pg: psycopg.Connection[Any]
) -> None:
    """A payload its handler's model refuses, and a handler that raises Permanent: each ends dead at once,
    beside a job that runs."""
    from pydantic import BaseModel

    class Doc(BaseModel):
        document_id: int

    store.enqueue_many(
        [
            NewJob(type="model", payload={"name": "refused", "document_id": "nope"}),
            NewJob(type="model", payload={"name": "kept", "document_id": 7}),
            NewJob(type="perm", payload={"name": "permanent"}),
        ]
    )
    worker = Worker(store, batch_size=5)
    worker.register("model", lambda p: None, payload=Doc)

    def perm(payload: dict[str, Any]) -> None:
        raise Permanent("no")

    worker.register("perm", perm)
    worker.run(until_empty=True, install_signals=False)
    final = statuses(pg)
    assert {k: v[0] for k, v in final.items()} == {
        "refused": "dead",
        "kept": "succeeded",
        "permanent": "dead",
    }
    assert "payload rejected by Doc" in str(final["refused"][1])
