"""One contract suite, every store: the same scenarios and assertions for memory, Postgres (and Supabase).

``Harness`` gives each store the two things a test cannot do through the JobStore API without waiting
in real time: expire a lease, and let a backoff or an age pass. For SQL stores it edits the row; for the
memory store it edits the job. Nothing else differs between stores.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from uuid import UUID, uuid4

import psycopg
import pytest

from pgjobkit.core.models import JobStatus
from pgjobkit.errors import InvalidArgument, NotAvailable
from pgjobkit.stores.base import JobStore
from pgjobkit.stores.jetstream import JetStreamStore
from pgjobkit.stores.jetstream.partitions import id_partition
from pgjobkit.stores.memory import MemoryStore
from pgjobkit.stores.postgres import PostgresStore
from pgjobkit.stores.supabase import SupabaseStore
from tests.contract import jetstream_differences
from tests.doubles.aio import Blocking
from tests.doubles.router import BASE_URL


class Harness:
    def __init__(
        self,
        store: JobStore,
        edit: Callable[[Sequence[UUID], dict[str, Any]], None],
        kind: str,
        running: Callable[[], int],
        age_flow: Callable[[timedelta], None],
        new_user: Callable[[], UUID],
    ) -> None:
        self.store = store
        self._edit = edit
        # move every rate-limit start, schedule's last_due_at, worker's last beat and traceback back in time
        self.age_flow = age_flow
        self.kind = kind
        self.running = running  # how many jobs the store holds running, counted apart from the API
        self.new_user = new_user  # a user a job may belong to (SQL stores: a row in auth.users)

    def expire_lease(self, *job_ids: UUID) -> None:
        self._edit(job_ids, {"lease_until": timedelta(seconds=-1)})

    def make_runnable(self, job_id: UUID) -> None:
        self._edit([job_id], {"run_after": timedelta(0)})

    def age(self, job_id: UUID, by: timedelta) -> None:
        self._edit([job_id], {"updated_at": -by})


def _memory_edit(store: MemoryStore) -> Callable[[Sequence[UUID], dict[str, Any]], None]:
    def edit(job_ids: Sequence[UUID], changes: dict[str, Any]) -> None:
        now = datetime.now(UTC)
        for job_id in job_ids:
            job = store.get(job_id)
            assert job is not None
            store._put(job.model_copy(update={k: now + v for k, v in changes.items()}))

    return edit


def _memory_age_flow(store: MemoryStore) -> Callable[[timedelta], None]:
    def age(by: timedelta) -> None:
        for type_, starts in store._starts.items():
            store._starts[type_] = [s - by for s in starts]
        for row in store._schedules.values():
            row["last_due_at"] -= by
        for row in store._state.workers.values():
            row["heartbeat_at"] -= by
        for row in store._state.tracebacks.values():
            row["failed_at"] -= by

    return age


def _sql_age_flow(db_url: str) -> Callable[[timedelta], None]:
    def age(by: timedelta) -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("update public.jobkit_starts set started_at = started_at - %s", (by,))
            conn.execute("update public.jobkit_schedules set last_due_at = last_due_at - %s", (by,))
            conn.execute("update public.jobkit_workers set heartbeat_at = heartbeat_at - %s", (by,))
            conn.execute("update public.jobkit_tracebacks set failed_at = failed_at - %s", (by,))

    return age


def _memory_running(store: MemoryStore) -> Callable[[], int]:
    return lambda: sum(j.status == "running" for j in store.jobs())


def _sql_running(db_url: str) -> Callable[[], int]:
    def count() -> int:
        with psycopg.connect(db_url, autocommit=True) as conn:
            row = conn.execute("select count(*) from public.jobkit_jobs where status = 'running'").fetchone()
        assert row is not None
        return int(row[0])

    return count


def _sql_user(db_url: str) -> Callable[[], UUID]:
    def new_user() -> UUID:
        user_id = uuid4()
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(
                "insert into auth.users (id, email) values (%s, %s)", (user_id, f"{user_id}@example.test")
            )
        return user_id

    return new_user


def _sql_edit(db_url: str) -> Callable[[Sequence[UUID], dict[str, Any]], None]:
    def edit(job_ids: Sequence[UUID], changes: dict[str, Any]) -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            for column, delta in changes.items():
                assert column in ("lease_until", "run_after", "updated_at")
                conn.execute(
                    f"update public.jobkit_jobs set {column} = now() + %s"
                    + (", updated_at = now()" if column != "updated_at" else "")
                    + " where id = any(%s)",
                    (delta, list(job_ids)),
                )

    return edit


LIVE_ENV = ("JOBKIT_SUPABASE_URL", "JOBKIT_SUPABASE_SERVICE_KEY", "JOBKIT_SUPABASE_DB_URL")
LIVE_MISSING = [name for name in LIVE_ENV if not os.environ.get(name)]
STORES: list[Any] = [
    "memory",
    "postgres",
    "supabase",
    "memory-async",
    "postgres-async",
    "supabase-async",
    "postgres-prepared",  # PostgresStore(prepare=True): server-side prepared statements
    "jetstream",  # JetStreamStore on the session's 3-node cluster: the async store, on its loop thread
    "jetstream-p3",  # the same, a queue of 3 partitions (3 streams, pgjobkit.stores.jetstream.partitions)
]
if not LIVE_MISSING:  # opt-in: the same contract against a real Supabase stack
    STORES.append(pytest.param("supabase-live", marks=pytest.mark.supabase))


def _live(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """The contract against a real Supabase stack (opt-in). It empties jobkit_jobs: use a dev stack."""
    db_url = os.environ["JOBKIT_SUPABASE_DB_URL"]
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("delete from public.jobkit_jobs")
        conn.execute("delete from public.jobkit_limits; delete from public.jobkit_starts")
        conn.execute("delete from public.jobkit_schedules")
    store = SupabaseStore(os.environ["JOBKIT_SUPABASE_URL"], os.environ["JOBKIT_SUPABASE_SERVICE_KEY"])
    try:
        yield Harness(
            store,
            _sql_edit(db_url),
            "supabase-live",
            _sql_running(db_url),
            _sql_age_flow(db_url),
            _sql_user(db_url),
        )
    finally:
        store.close()


def _jetstream(request: pytest.FixtureRequest, partitions: int) -> Iterator[Harness]:
    """A stream of the test's own on the session cluster (``partitions`` streams). The harness's edits are the store's own
    compare-and-set writes, re-armed as any write is (an expired lease's schedule fires within ~50 ms);
    a contract test this store does not pass is marked with the difference it stands for
    (``tests/contract/jetstream_differences.py``)."""
    difference = jetstream_differences.why(request.node)
    if difference is not None:
        refused = (NotAvailable, InvalidArgument)  # failing any other way is a failure, not the difference
        request.node.add_marker(pytest.mark.xfail(reason=difference, strict=True, raises=refused))
    cluster = request.getfixturevalue("cluster")
    name = uuid4().hex[:12]
    store = JetStreamStore(
        cluster.url, prefix=f"c{name}", stream=f"C{name}", claim_wait=0.3, partitions=partitions
    )
    store.migrate()

    def edit(job_ids: Sequence[UUID], changes: dict[str, Any]) -> None:
        def decide(job: Any, now: datetime) -> Any:
            assert job is not None
            fields = {k: now + v for k, v in changes.items()}
            return job.model_copy(update={"updated_at": now} | fields)

        for job_id in job_ids:
            part = store._async._parts[id_partition(job_id, partitions)]
            store._submit(part.change(job_id, decide))

    def running() -> int:
        return store.stats().count(JobStatus.RUNNING)

    try:
        yield Harness(store, edit, "jetstream", running, lambda _: None, uuid4)
    finally:
        store.close()


@pytest.fixture(params=STORES)
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """The store of the given kind; ``-async``: its async twin (``as_async()``) driven through Blocking."""
    kind: str = request.param
    if kind == "supabase-live":
        yield from _live(request)
        return
    backend = kind.removesuffix("-async")
    store: JobStore
    if backend.startswith("jetstream"):
        yield from _jetstream(request, 3 if backend == "jetstream-p3" else 1)
        return
    if backend == "memory":
        memory = MemoryStore()
        store, edit, running = memory, _memory_edit(memory), _memory_running(memory)
        age_flow, new_user = _memory_age_flow(memory), uuid4
    else:
        db_url: str = request.getfixturevalue("db_url")
        edit, running, age_flow = _sql_edit(db_url), _sql_running(db_url), _sql_age_flow(db_url)
        new_user = _sql_user(db_url)
        if backend == "postgres":
            store = PostgresStore(db_url, max_size=4)
        elif backend == "postgres-prepared":
            store = PostgresStore(db_url, max_size=4, prepare=True)
        else:  # through the test router: supabase-py's real requests, run by the database as PostgREST would
            request.getfixturevalue("router")
            store = SupabaseStore(BASE_URL, request.getfixturevalue("service_key"))
    used: Any = Blocking(store.as_async()) if kind.endswith("-async") else store
    try:
        yield Harness(cast(JobStore, used), edit, kind, running, age_flow, new_user)
    finally:
        used.close()
        store.close()


@pytest.fixture
def store(harness: Harness) -> JobStore:
    return harness.store
