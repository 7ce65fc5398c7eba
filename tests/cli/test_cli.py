"""Every command's happy path, --json that parses, and bad input that exits 2 and writes nothing."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.cli.conftest import Run, clean_env, parse
from tests.doubles import pgtemplate


def count(pg: psycopg.Connection[Any]) -> int:
    row = pg.execute("select count(*) as n from public.jobkit_jobs").fetchone()
    assert row is not None
    return int(row["n"])


def test_help_for_every_command(jobkit: Run) -> None:
    for command in (
        "worker",
        "enqueue",
        "jobs",
        "stats",
        "requeue",
        "prune",
        "migrate",
        "demo",
        "limit",
        "schedule",
        "pipeline",
        "dashboard",
        "workers",
    ):
        result = jobkit(command, "--help")
        assert result.returncode == 0 and "Usage:" in result.stdout, command
    assert "demo" in jobkit("--help").stdout


def test_enqueue_and_dedup(jobkit: Run, pg: psycopg.Connection[Any]) -> None:
    first = parse(
        jobkit(
            "enqueue",
            "embed",
            "--payload",
            '{"doc": 1}',
            "--key",
            "doc-1",
            "--priority",
            "5",
            "--max-attempts",
            "4",
            "--delay",
            "1m",
            "--json",
        )
    )
    assert first["inserted"] is True
    job = first["job"]
    assert (job["type"], job["payload"], job["priority"], job["max_attempts"]) == ("embed", {"doc": 1}, 5, 4)
    assert "lease_token" not in job
    again = jobkit("enqueue", "embed", "--key", "doc-1")
    assert again.returncode == 0 and "not duplicated" in again.stdout and job["id"] in again.stdout
    assert count(pg) == 1


def test_enqueue_for_a_user(jobkit: Run, pg: psycopg.Connection[Any]) -> None:
    user = pg.execute("insert into auth.users default values returning id::text as id").fetchone()
    assert user is not None
    out = parse(jobkit("enqueue", "embed", "--user", user["id"], "--json"))
    assert out["job"]["user_id"] == user["id"]
    assert (out["id"], out["inserted"], out["status"]) == (out["job"]["id"], True, "queued")


def test_jobs_and_stats(jobkit: Run) -> None:
    for t in ("embed", "embed", "sync"):
        assert jobkit("enqueue", t).returncode == 0
    listed = parse(jobkit("jobs", "--json"))
    assert [j["type"] for j in listed] == ["sync", "embed", "embed"]
    assert len(parse(jobkit("jobs", "--type", "embed", "--status", "queued", "--json"))) == 2
    table = jobkit("jobs")
    assert table.returncode == 0 and "STATUS" in table.stdout and table.stdout.count("queued") == 3
    stats = parse(jobkit("stats", "--json"))
    assert stats["total"] == 3 and stats["dead"] == 0
    assert {(r["type"], r["status"], r["count"]) for r in stats["rows"]} == {
        ("embed", "queued", 2),
        ("sync", "queued", 1),
    }
    assert stats["oldest_runnable_seconds"] >= 0
    assert "oldest runnable" in jobkit("stats").stdout


def test_workers(jobkit: Run, pg: psycopg.Connection[Any]) -> None:
    assert "no workers" in jobkit("workers").stdout
    pg.execute(
        "select public.jobkit_worker_beat('host-1:42:abc', p_types => array['embed'], p_stale_seconds => 60)"
    )
    pg.execute("select public.jobkit_enqueue('embed')")
    pg.execute("select * from public.jobkit_claim(array['embed'], 'host-1:42:abc', 30, 1)")
    [worker] = parse(jobkit("workers", "--json"))
    assert (worker["name"], worker["alive"], worker["holding"], worker["types"]) == (
        "host-1:42:abc",
        True,
        1,
        ["embed"],
    )
    table = jobkit("workers").stdout
    assert "host-1:42:abc" in table and "yes" in table


def _dead_job(pg: psycopg.Connection[Any], type_: str = "embed") -> str:
    pg.execute("select public.jobkit_enqueue(%s, p_max_attempts => 1)", (type_,))
    claimed = pg.execute("select * from public.jobkit_claim(array[%s], 'w', 30, 1)", (type_,)).fetchone()
    assert claimed is not None
    pg.execute("select public.jobkit_fail(%s, %s, 'boom')", (claimed["id"], claimed["lease_token"]))
    return str(claimed["id"])


def test_requeue_ids_and_all_dead(jobkit: Run, pg: psycopg.Connection[Any]) -> None:
    one = _dead_job(pg)
    result = jobkit("requeue", one)
    assert result.returncode == 0 and "requeued 1" in result.stdout
    _dead_job(pg, "a")
    _dead_job(pg, "b")
    assert "requeued 1" in jobkit("requeue", "--all-dead", "--type", "a").stdout
    assert "requeued 1" in jobkit("requeue", "--all-dead").stdout
    assert parse(jobkit("stats", "--json"))["dead"] == 0


def test_cancel(jobkit: Run, pg: psycopg.Connection[Any]) -> None:
    queued = parse(jobkit("enqueue", "t", "--json"))["job"]["id"]
    dead = _dead_job(pg)
    result = jobkit("cancel", queued, dead, "--reason", "not needed")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"{queued} cancelled", f"{dead} not cancelled: dead"]
    row = pg.execute("select status, error from public.jobkit_jobs where id = %s", (queued,)).fetchone()
    assert row == {"status": "cancelled", "error": "not needed"}
    missing = "00000000-0000-0000-0000-000000000001"
    result = jobkit("cancel", missing)
    assert result.returncode == 1 and f"{missing} not cancelled: no such job" in result.stdout


def test_prune(jobkit: Run, pg: psycopg.Connection[Any]) -> None:
    _dead_job(pg)
    pg.execute("update public.jobkit_jobs set updated_at = now() - interval '8 days'")
    jobkit("enqueue", "live")
    assert "pruned 0" in jobkit("prune", "--older-than", "7d", "--status", "succeeded").stdout
    assert "pruned 1" in jobkit("prune", "--older-than", "7d").stdout
    assert count(pg) == 1


def test_migrate_plain_postgres_then_supabase_agrees(jobkit: Run, tmp_path: Any) -> None:
    name = f"jk_cli_migrate_{tmp_path.name[-12:]}".replace("-", "_")
    pgtemplate.create_database(name)
    try:
        env = clean_env(JOBKIT_DATABASE_URL=pgtemplate.as_uri(pgtemplate.db_url(name)))
        refused = jobkit("migrate", env=env)
        assert refused.returncode == 2 and "--bootstrap" in refused.stderr
        applied = jobkit("migrate", "--bootstrap", env=env)
        assert (
            applied.returncode == 0
            and f"applied {', '.join(m.name for m in pgtemplate.MIGRATIONS)}" in applied.stdout
        ), applied.stderr
        assert "up to date" in jobkit("migrate", env=env).stdout
        pushed = pgtemplate.push_migrations(name)  # the Supabase CLI sees the same history
        assert "Remote database is up to date" in pushed.stdout + pushed.stderr
    finally:
        pgtemplate.drop_database(name)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["enqueue", "embed", "--payload", "{not json"], "not valid JSON"),
        (["enqueue", "embed", "--payload", "[1, 2]"], "payload"),
        (["enqueue", "", "--payload", "{}"], "type"),
        (["enqueue", "embed", "--delay", "soon"], "not a duration"),
        (["enqueue", "embed", "--max-attempts", "0"], "max_attempts"),
        (["enqueue", "embed", "--user", "nobody"], "not a job id"),
        (["jobs", "--status", "finished"], "finished"),
        (["prune", "--older-than", "a week"], "not a duration"),
        (["prune"], "--older-than"),
        (["requeue"], "IDs or --all-dead"),
        (["requeue", "not-a-uuid"], "not a job id"),
        (["requeue", "00000000-0000-0000-0000-000000000000"], "not found"),
        (["worker", "nomodule"], "MODULE:OBJ"),
        (["worker", "no_such_module_x:worker"], "cannot load"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(
    jobkit: Run, pg: psycopg.Connection[Any], args: list[str], message: str
) -> None:
    result = jobkit(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr
    assert count(pg) == 0


def test_missing_configuration_exits_2_naming_variables(jobkit: Run) -> None:
    result = jobkit("stats", env=clean_env())
    assert result.returncode == 2
    for name in ("SUPABASE_URL", "SUPABASE_SECRET_KEY", "JOBKIT_DATABASE_URL"):
        assert name in result.stderr


def test_runtime_failure_exits_1(jobkit: Run) -> None:
    env = clean_env(
        JOBKIT_DATABASE_URL="postgresql://postgres@127.0.0.1:1/nothing", JOBKIT_CONNECT_TIMEOUT="1"
    )
    result = jobkit("stats", env=env)
    assert result.returncode == 1 and "database connection failed" in result.stderr
