"""Upgrading a database in use, from pgjobkit 0.1 (513526e, what 0.1's README installed) and from each release since, to this
version, with a worker of the old version running through it: every job ends as it would have without the
upgrade, and the old worker takes part in a pipeline enqueued after it. Both upgrade paths: `pgjobkit
migrate` on a database URL, and `pgjobkit init supabase` + the real `supabase db push` into a project that
holds the old version's migrations."""

from __future__ import annotations

import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.rows import dict_row

from pgjobkit import NewJob, PostgresStore, Worker, migrate
from pgjobkit.errors import ConfigurationError
from pgjobkit.version import SCHEMA_VERSION
from tests.doubles import pgtemplate
from tests.doubles.long_transaction import reading_jobs
from tests.upgrade.worker_0_1 import Worker01

BASELINE = pgtemplate.MIGRATIONS[0]  # 0.1's file, as 0.1 shipped it
# how many of the migrations each release shipped
RELEASES = {"0.1": 1, "0.2.0": 3, "0.3.0": 4, "0.4.0": 5, "0.5.0": 6, "0.5.1": 7}


@pytest.fixture
def database(templates: pgtemplate.Templates, request: pytest.FixtureRequest) -> Iterator[str]:
    name = (
        f"{templates.prefix}_up_{request.node.name[-12:]}".replace("[", "_")
        .replace("]", "")
        .replace("-", "_")
    )
    pgtemplate.create_database(name)
    pgtemplate.bootstrap(name, "current")
    try:
        yield pgtemplate.db_url(name)
    finally:
        pgtemplate.drop_database(name)


def _project(tmp_path: Path, shipped: int) -> Path:
    """A Supabase project that took jobkit's first ``shipped`` migrations: 0.1's file under the version 0.1's
    `pgjobkit init` gave it, 0.2.0's under their own."""
    root = tmp_path / "app"
    (root / "supabase" / "migrations").mkdir(parents=True)
    (root / "supabase" / "config.toml").write_text('project_id = "app"\n')
    shutil.copy(BASELINE, root / "supabase" / "migrations" / "20261204093000_jobkit.sql")
    for path in pgtemplate.MIGRATIONS[1:shipped]:
        shutil.copy(path, root / "supabase" / "migrations" / path.name)
    return root


def _install_0_1(url: str, via: str, tmp_path: Path, start: str = "0.1") -> Callable[[], None]:
    """Install release ``start`` on the path ``via`` takes; return what upgrades it to this version on the
    same path."""
    shipped = RELEASES[start]
    if via == "migrate":
        folder = tmp_path / "migrations_old"
        folder.mkdir()
        for path in pgtemplate.MIGRATIONS[:shipped]:
            shutil.copy(path, folder / path.name)
        assert migrate.apply(url, directory=folder) == [p.name for p in pgtemplate.MIGRATIONS[:shipped]]
        return lambda: _expect(migrate.apply(url) == [p.name for p in pgtemplate.MIGRATIONS[shipped:]])
    root = _project(tmp_path, shipped)
    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    pushed = pgtemplate.push_migrations(str(name), root)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr

    def upgrade() -> None:
        written = migrate.init_project(root / "supabase" / "migrations")
        _expect(
            [w for _, w in written] == [False] * shipped + [True] * (len(pgtemplate.MIGRATIONS) - shipped)
        )
        result = pgtemplate.push_migrations(str(name), root)
        _expect(result.returncode == 0, result.stdout + result.stderr)

    return upgrade


def _expect(ok: bool, why: str = "") -> None:
    if not ok:
        raise AssertionError(why)


def _fill_0_1(conn: psycopg.Connection[dict[str, Any]], start: str = "0.1") -> dict[str, Any]:
    """Jobs in every state, limits, fairness keys and a schedule, written through release ``start``'s own
    functions (0.2.0 renamed the flow-control ones)."""

    def one(sql: str, *params: Any) -> dict[str, Any]:
        row = conn.execute(sql, params).fetchone()
        assert row is not None
        return row

    limit_set, schedule_set = (
        ("jobkit_limit_set", "jobkit_schedule_set")
        if start == "0.1"
        else ("jobkit_set_limit", "jobkit_set_schedule")
    )
    conn.execute(f"select * from public.{limit_set}('limited', p_max_running => 1)")
    conn.execute(f"select * from public.{schedule_set}('nightly', '0 3 * * *', 'report')")
    user = one("insert into auth.users (id) values (gen_random_uuid()) returning id")["id"]
    embeds = [
        one(
            "select id from public.jobkit_enqueue('embed', jsonb_build_object('doc', %s::int), "
            "p_idempotency_key => %s, p_fair_key => %s, p_user_id => %s)",
            i,
            f"doc-{i}",
            f"tenant-{i % 3}",
            user if i % 5 == 0 else None,
        )["id"]
        for i in range(160)
    ]
    limited = [one("select id from public.jobkit_enqueue('limited')")["id"] for _ in range(4)]
    states = {}
    for name in ("later", "doomed", "unwanted", "done"):
        states[name] = one("select id from public.jobkit_enqueue(%s, p_idempotency_key => %s)", name, name)[
            "id"
        ]
    claimed = {
        r["type"]: r
        for r in conn.execute(
            "select id, type, lease_token from public.jobkit_claim(array['later', 'doomed', 'done'], 'setup', 60, 10)"
        ).fetchall()
    }
    conn.execute(
        "select * from public.jobkit_fail(%s, %s, 'rate limited', 3600)",
        (claimed["later"]["id"], claimed["later"]["lease_token"]),
    )
    conn.execute(
        "select * from public.jobkit_fail(%s, %s, 'bad input', 0, true)",
        (claimed["doomed"]["id"], claimed["doomed"]["lease_token"]),
    )
    conn.execute(
        "select * from public.jobkit_complete(array[%s]::uuid[], array[%s]::uuid[], %s::jsonb)",
        (
            claimed["done"]["id"],
            claimed["done"]["lease_token"],
            f'{{"{claimed["done"]["id"]}": {{"vector": [1, 2]}}}}',
        ),
    )
    conn.execute("select * from public.jobkit_cancel(array[%s]::uuid[])", (states["unwanted"],))
    return {"embeds": embeds, "limited": limited, "user": user, **states}


def _rows(conn: psycopg.Connection[dict[str, Any]]) -> dict[UUID, dict[str, Any]]:
    return {r["id"]: r for r in conn.execute("select * from public.jobkit_jobs").fetchall()}


def _wait(condition: Callable[[], bool], what: str, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.mark.parametrize("start", list(RELEASES))
@pytest.mark.parametrize("via", ["migrate", "supabase"])
def test_upgrade_under_a_running_old_worker(database: str, via: str, start: str, tmp_path: Path) -> None:
    """The old worker is Worker01 for both releases: 0.2.0's PostgresStore renders its claim, heartbeat and
    complete calls as 0.1's did (the same functions, arguments and row types)."""
    upgrade = _install_0_1(database, via, tmp_path, start)
    with psycopg.connect(database, autocommit=True, row_factory=dict_row) as conn:
        made = _fill_0_1(conn, start)
        before = _rows(conn)
        schedule_before = conn.execute("select * from public.jobkit_schedules").fetchall()

        old = Worker01(database, ["embed", "limited"], batch=4, handler_seconds=0.03)
        thread = threading.Thread(target=old.run)
        thread.start()
        try:
            _wait(lambda: len(old.ran) >= 8 and bool(old.holding), "the 0.1 worker to be mid-run")
            upgrade()
            upgraded_at = len(old.ran)
            _wait(lambda: len(old.ran) >= upgraded_at + 8, "the 0.1 worker to go on after the upgrade")
            # A pipeline, its jobs run by the old worker: the database settles what waits on them.
            piped = conn.execute(
                'select public.jobkit_enqueue_pipeline(\'[{"ref": "a", "type": "embed"}, '
                '{"ref": "b", "type": "embed"}, {"type": "embed", "depends_on": ["a", "b"]}]\') as p'
            ).fetchone()
            assert piped is not None
            fan_in = UUID(piped["p"]["jobs"][2]["id"])
            _wait(lambda: fan_in in old.ran, "the old worker to run the job that waited for two of its jobs")
        finally:
            old.stop.set()
            thread.join(30)
        assert not thread.is_alive()
        assert old.errors == [], old.errors  # every call it made, before, during and after, went through

        ran_new: list[UUID] = []
        worker = Worker(PostgresStore(database), schedules=False, poll_interval=0.05)

        @worker.handler("embed")
        def embed(payload: dict[str, Any], job: Any) -> None:
            ran_new.append(job.id)

        @worker.handler("limited")
        def limit_one(payload: dict[str, Any], job: Any) -> None:
            ran_new.append(job.id)

        worker.run(until_empty=True, install_signals=False)
        after = _rows(conn)
        pipeline = {UUID(j["id"]) for j in piped["p"]["jobs"]}
        assert all(after.pop(job_id)["status"] == "succeeded" for job_id in pipeline)
        runs_of_pipeline = [job_id for job_id in old.ran + ran_new if job_id in pipeline]
        assert sorted(runs_of_pipeline) == sorted(pipeline)
        assert old.ran.index(fan_in) > max(old.ran.index(job_id) for job_id in pipeline - {fan_in})

        assert conn.execute("select public.jobkit_schema_version() as v").fetchone() == {"v": SCHEMA_VERSION}
        # None lost, none run twice: each queued job ran once, by one worker or the other.
        assert after.keys() == before.keys()
        runs = Counter(job_id for job_id in old.ran + ran_new if job_id not in pipeline)
        assert set(runs) == set(made["embeds"] + made["limited"]) and set(runs.values()) == {1}, runs
        for job_id in made["embeds"] + made["limited"]:
            assert (after[job_id]["status"], after[job_id]["attempts"]) == ("succeeded", 1), after[job_id]
            for column in ("payload", "idempotency_key", "fair_key", "fair_round", "user_id", "created_at"):
                assert after[job_id][column] == before[job_id][column], column
        # The others as they were: a retry an hour away, the dead, the cancelled, a result.
        for name in ("later", "doomed", "unwanted", "done"):
            assert after[made[name]] == before[made[name]], name
        assert after[made["later"]]["status"] == "retrying"
        assert after[made["done"]]["result"] == {"vector": [1, 2]}
        assert conn.execute("select * from public.jobkit_schedules").fetchall() == schedule_before

    with PostgresStore(database) as store:
        again = store.enqueue(NewJob(type="embed", idempotency_key="doc-3"))
        assert not again.inserted and again.id == made["embeds"][3]
        fresh = store.enqueue(
            NewJob(type="later", idempotency_key="unwanted")
        )  # a cancelled job frees its key
        assert fresh.inserted
        [limit] = store.list_limits()
        assert (limit.type, limit.max_running) == ("limited", 1)
        [schedule] = store.list_schedules()
        assert (schedule.name, schedule.cron, schedule.type) == ("nightly", "0 3 * * *", "report")
        assert schedule.last_due_at == schedule_before[0]["last_due_at"]


def test_a_0_2_worker_refuses_a_0_1_database_and_says_what_to_run(database: str, tmp_path: Path) -> None:
    _install_0_1(database, "migrate", tmp_path)
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("select * from public.jobkit_enqueue('embed')")
    worker = Worker(PostgresStore(database), schedules=False)
    worker.register("embed", lambda payload: None)
    with pytest.raises(ConfigurationError, match="pgjobkit migrate") as refused:
        worker.run(until_empty=True, install_signals=False)
    assert "older than 0.2.0" in str(refused.value)
    with psycopg.connect(database) as conn:  # nothing was claimed
        assert conn.execute("select status from public.jobkit_jobs").fetchall() == [("queued",)]


def test_the_old_worker_would_catch_a_row_type_change(database: str, tmp_path: Path) -> None:
    """Guards the test above: the 0.2.0 candidate that made run_after a domain broke every 0.1 worker's
    prepared claim, and the double shows it (a worker that prepared nothing would have passed)."""
    _install_0_1(database, "migrate", tmp_path)
    with psycopg.connect(database, autocommit=True, row_factory=dict_row) as conn:
        _fill_0_1(conn)
        old = Worker01(database, ["embed"], batch=2, handler_seconds=0.01)
        thread = threading.Thread(target=old.run)
        thread.start()
        try:
            _wait(lambda: len(old.ran) >= 4, "the 0.1 worker to run")
            conn.execute("create domain public.run_after_domain as timestamptz")
            conn.execute("alter table public.jobkit_jobs alter column run_after type public.run_after_domain")
            _wait(lambda: bool(old.errors), "the 0.1 worker to fail")
        finally:
            old.stop.set()
            thread.join(30)
    assert old.errors[0].startswith("DatatypeMismatch"), old.errors


def test_the_old_worker_reproduces_0_1s_statements() -> None:
    """Guards the double: its statements are 0.1's, as 0.1's PostgresStore rendered them."""
    assert Worker01.CLAIM.startswith(b"select * from public.")
    assert b'"p_types" => %s::text[]' in Worker01.CLAIM and b'"p_done_ids" => %s::uuid[]' in Worker01.CLAIM


def test_supabase_db_push_of_the_upgrade_gives_up_behind_a_long_transaction(
    database: str, tmp_path: Path
) -> None:
    """`supabase db push` sets no lock_timeout of its own: the 0.2.0 migration bounds its wait (5 s), so a
    transaction left open on the jobs table makes the push fail with nothing applied, instead of holding
    every worker behind its queued lock."""
    upgrade = _install_0_1(database, "supabase", tmp_path)
    with reading_jobs(database):
        started = time.monotonic()
        with pytest.raises(AssertionError, match="lock timeout"):
            upgrade()
        assert time.monotonic() - started < 30
    with psycopg.connect(database) as conn:
        found = conn.execute("select to_regprocedure('public.jobkit_schema_version()')").fetchone()
        assert found == (None,)  # nothing of 0.2.0 was applied
