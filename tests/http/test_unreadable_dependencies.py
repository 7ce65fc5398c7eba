"""A dependency whose result no client can read (JSON Python's decoder refuses, written by the table's owner
around jobkit's bounds) is handed on marked ``unreadable``, never raised: through a user's client (the
Data API), the Supabase store, the direct store and a handler's ``current().dependencies()``. The other
dependencies read as they are."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pgjobkit import AsyncUserJobs, PostgresStore, UserJobs, Worker, current
from pgjobkit.core.pipelines import DependencyResult, Pipeline
from pgjobkit.stores.supabase import SupabaseStore
from pgjobkit.worker.calls import WorkerCalls
from tests.doubles.router import BASE_URL, PUBLISHABLE_KEY, SECRET_KEY, SupabaseRouter, make_jwt
from tests.sql.helpers import make_user

# what the owner writes, past the checks it drops: a number of 4,301 digits, arrays 3,000 deep
BAD = {
    "huge number": ("jobkit_result_numbers_within_double_range", """'{"n": 1e4300}'"""),
    "deep": ("jobkit_result_nests_at_most_100_deep", "repeat('[', 3000) || repeat(']', 3000)"),
}


def _pipeline(pg: psycopg.Connection[Any], db_url: str, bad: str) -> tuple[str, uuid.UUID, uuid.UUID]:
    """A user's pipeline: ``last`` waits for three jobs that succeeded; the owner rewrites the second's
    result as ``bad``. The user's access token, ``last``'s id and the bad dependency's id."""
    pg.execute("insert into public.jobkit_user_types (type) values ('step'), ('last')")
    token = make_jwt("authenticated", sub=make_user(pg))
    me = UserJobs(BASE_URL, PUBLISHABLE_KEY, token)
    p = Pipeline()
    steps = [p.add("step", {"n": n}) for n in range(3)]
    p.add("last", after=steps, ref="last")
    e = me.enqueue_pipeline(p)
    with PostgresStore(db_url, max_size=2) as store:
        calls = WorkerCalls(store)
        for job in calls.claim(["step"], "w", timedelta(seconds=30), 3):
            assert job.lease_token is not None
            assert calls.complete(job.id, job.lease_token, {"n": job.payload["n"]})
    [first, second, _] = (dep.id for dep in me.dependencies(e.ids["last"]))
    constraint, value = BAD[bad]
    pg.execute(f"alter domain public.jobkit_result drop constraint {constraint}")
    pg.execute(f"update public.jobkit_jobs set result = ({value})::jsonb where id = %s", (second,))
    me.close()
    assert first != second
    return token, e.ids["last"], second


def _check(deps: list[DependencyResult], bad: uuid.UUID) -> None:
    assert [d.position for d in deps] == [0, 1, 2]
    [unreadable] = [d for d in deps if d.unreadable is not None]
    assert unreadable.id == bad and unreadable.result is None and unreadable.type == "step"
    assert str(unreadable.unreadable).startswith("result: ")  # names the column, and what was wrong with it
    assert [d.result for d in deps if d.id != bad] == [{"n": 0}, {"n": 2}]


@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_dependency_no_client_can_read_is_marked_not_raised(
    bad: str, pg: psycopg.Connection[Any], db_url: str, router: SupabaseRouter
) -> None:
    token, last, second = _pipeline(pg, db_url, bad)
    me = UserJobs(BASE_URL, PUBLISHABLE_KEY, token)
    _check(me.dependencies(last), second)
    me.close()

    async def asynchronously() -> list[DependencyResult]:
        mine = AsyncUserJobs(BASE_URL, PUBLISHABLE_KEY, token)
        try:
            return await mine.dependencies(last)
        finally:
            await mine.close()

    _check(asyncio.run(asynchronously()), second)
    with SupabaseStore(BASE_URL, SECRET_KEY, realtime=False) as store:
        _check(store.list_dependencies(last), second)
    with PostgresStore(db_url, max_size=2) as direct:
        _check(direct.list_dependencies(last), second)


def test_a_handler_is_handed_the_readable_dependencies_and_the_unreadable_one_marked(
    pg: psycopg.Connection[Any], db_url: str, router: SupabaseRouter
) -> None:
    _, _, second = _pipeline(pg, db_url, "huge number")
    seen: list[list[DependencyResult]] = []
    with PostgresStore(db_url, max_size=4) as store:
        worker = Worker(store, schedules=False, poll_interval=0.05, presence_every=0)
        worker.register("last", lambda payload: seen.append(current().dependencies()))
        assert worker.run(until_empty=True, install_signals=False).succeeded == 1
    [deps] = seen
    _check(deps, second)
