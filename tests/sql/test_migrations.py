"""The migrations, applied with the real Supabase CLI: clean, repeatable, lint-free, on the right index."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from typing import Any

import psycopg
import pytest

from tests.doubles import pgtemplate
from tests.doubles.postgrest import Postgrest
from tests.sql.helpers import SERVICE


def test_push_applied_the_migration(templates: pgtemplate.Templates) -> None:
    for output in templates.push_output.values():
        for migration in pgtemplate.MIGRATIONS:
            assert f"Applying migration {migration.name}" in output
        assert "Finished supabase db push" in output


def test_second_push_is_a_no_op(db_name: str, pg: psycopg.Connection[Any]) -> None:
    before = pg.execute("select count(*) as n from supabase_migrations.schema_migrations").fetchone()
    result = pgtemplate.push_migrations(db_name)
    assert result.returncode == 0, result.stderr
    assert "Remote database is up to date" in result.stdout + result.stderr
    after = pg.execute("select count(*) as n from supabase_migrations.schema_migrations").fetchone()
    files = list((pgtemplate.ROOT / "supabase" / "migrations").glob("*.sql"))
    assert before == after == {"n": len(files)}


def _plpgsql_check_available(pg: psycopg.Connection[Any]) -> bool:
    row = pg.execute("select count(*) as n from pg_available_extensions where name = 'plpgsql_check'")
    return row.fetchone() == {"n": 1}


def _lint(db_name: str) -> subprocess.CompletedProcess[str]:
    url = pgtemplate.as_uri(pgtemplate.db_url(db_name))
    return pgtemplate.supabase("db", "lint", "--db-url", url, "--schema", "public", "--level", "warning")


def test_db_lint_reports_nothing(db_name: str, pg: psycopg.Connection[Any]) -> None:
    if not _plpgsql_check_available(pg):
        pytest.skip(
            "supabase db lint needs the plpgsql_check server extension, which this PostgreSQL "
            "lacks (apt-get install postgresql-15-plpgsql-check; the embedded wheel has none)"
        )
    result = _lint(db_name)
    assert result.returncode == 0, result.stderr
    assert "No schema errors found" in result.stdout + result.stderr, result.stdout


def test_lint_would_catch_a_broken_function(db_name: str, pg: psycopg.Connection[Any]) -> None:
    """Guards the test above: lint really checks function bodies here."""
    if not _plpgsql_check_available(pg):
        pytest.skip("needs the plpgsql_check server extension (see test_db_lint_reports_nothing)")
    pg.execute(
        "create function public.broken() returns int language plpgsql as "
        "$$ begin return (select nope from public.jobkit_jobs limit 1); end $$"
    )
    result = _lint(db_name)
    assert 'column \\"nope\\" does not exist' in result.stdout or '"nope"' in result.stdout


def test_claim_uses_the_claim_index_with_many_finished_rows(
    rest: Postgrest, pg: psycopg.Connection[Any]
) -> None:
    pg.execute("""
        insert into public.jobkit_jobs (type, status, attempts, claimed_by, created_at, updated_at)
        select 'embed', 'succeeded', 1, 'w', now() - interval '1 day', now() - interval '1 day'
        from generate_series(1, 100000)""")
    rest.rpc("jobkit_enqueue_many", {"p_jobs": [{"type": "embed"}] * 50}, SERVICE)
    pg.execute("analyze public.jobkit_jobs")
    plan = pg.execute(
        """explain (format json)
           select j.id from public.jobkit_jobs j
           where j.status in ('queued', 'retrying') and j.run_after <= now() and j.type = any(%s)
           order by j.priority desc, j.fair_round, j.run_after, j.created_at
           limit 10 for update skip locked""",
        (["embed"],),
    ).fetchone()
    assert plan is not None
    text = json.dumps(plan["QUERY PLAN"])
    assert '"Index Name": "jobkit_jobs_claim"' in text, text
    assert "Seq Scan" not in text and '"Sort"' not in text, text


def test_cli_is_pinned() -> None:
    assert shutil.which("node") is not None
    package = json.loads((pgtemplate.ROOT / "package.json").read_text())
    lock = json.loads((pgtemplate.ROOT / "package-lock.json").read_text())
    assert package["devDependencies"]["supabase"] == lock["packages"]["node_modules/supabase"]["version"]


@pytest.mark.parametrize("analyze", [False, True], ids=["plans-cached-while-empty", "fresh-statistics"])
def test_hot_path_reads_by_key_not_by_scan(pg: psycopg.Connection[Any], analyze: bool) -> None:
    """The plans jobkit_enqueue, jobkit_claim and jobkit_complete actually run in a session that cached them
    while the queue was empty, once the table has grown to 10k rows: with no ANALYZE in between (the plans
    stay cached: a seq scan here made each enqueue O(table)), and after one (the size where the planner once
    joined a batch back to the table by hashing a sequential scan of all of it)."""
    try:
        pg.execute("load 'auto_explain'")
    except psycopg.Error as exc:
        pytest.skip(f"auto_explain is not in this PostgreSQL build ({exc.diag.message_primary})")

    def claim(done: list[dict[str, Any]] = (), after: Any = None) -> list[dict[str, Any]]:  # type: ignore[assignment]
        return pg.execute(
            "select id, lease_token, status from public.jobkit_claim(array['t'], 'w', 30, 50, %s, %s, "
            "p_after => %s)",
            ([r["id"] for r in done] or None, [r["lease_token"] for r in done] or None, after),
        ).fetchall()

    def complete(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return pg.execute(
            "select id, ok from public.jobkit_complete(%s::uuid[], %s::uuid[])",
            ([r["id"] for r in jobs], [r["lease_token"] for r in jobs]),
        ).fetchall()

    for _ in range(6):  # PL/pgSQL keeps a generic plan after five custom ones
        pg.execute("select * from public.jobkit_enqueue('t', p_fair_key => 'k')")
        pg.execute("select * from public.jobkit_enqueue('t')")
        complete(claim(claim()))
        mark = pg.execute("select id from public.jobkit_enqueue('t')").fetchone()
        complete(claim(after=mark["id"]))  # type: ignore[index]
    pg.execute(
        "select count(*) from public.jobkit_enqueue_many(%s::jsonb)",
        (json.dumps([{"type": "t"}] * 9_990 + [{"type": "t", "fair_key": "k"}] * 10),),
    )
    if analyze:
        pg.execute("analyze public.jobkit_jobs")
    first, second = claim(), claim()
    plans: list[str] = []
    pg.add_notice_handler(lambda diag: plans.append(diag.message_primary or ""))
    for setting in ("log_min_duration = 0", "log_nested_statements = on", "log_format = json"):
        pg.execute(f"set auto_explain.{setting}")
    pg.execute("set client_min_messages = log")
    pg.execute("select * from public.jobkit_enqueue('t', p_fair_key => 'k')")
    done = claim(first, after=second[-1]["id"])  # the worker's usual call: it starts after its last job
    completed = complete(second)
    pg.execute("set client_min_messages = notice")
    assert sum(r["status"] == "succeeded" for r in done) == 50 and all(r["ok"] for r in completed)
    on_jobs = [p for p in plans if '"Relation Name": "jobkit_jobs"' in p]
    assert on_jobs and not [p for p in on_jobs if "Seq Scan" in p or "Bitmap" in p], plans
    updates = [p for p in plans if '"Operation": "Update"' in p]
    assert len(updates) >= 3, plans  # the claim's completion and claim, and jobkit_complete's
    for plan in updates:
        assert '"Index Name": "jobkit_jobs_pkey"' in plan, plan
    # the claim after a job: a range of the claim index from that job on, not a walk from its start
    [after] = [p for p in plans if "j.priority = v_at.priority" in p]
    assert '"Index Name": "jobkit_jobs_claim"' in after, after
    assert "ROW((fair_round)::integer, run_after, created_at) >= ROW(" in after.split('"Index Cond"')[1], (
        after
    )
    # jobkit_enqueue's insert, which looks up the job's turn
    [insert] = [p for p in plans if '"Query Text": "insert into public.jobkit_jobs' in p]
    assert '"Index Name": "jobkit_jobs_claim"' in insert, insert  # the turn being served
    assert '"Index Name": "jobkit_jobs_fair"' in insert, insert  # the key's last turn


def _advisors(db_name: str) -> subprocess.CompletedProcess[str]:
    url = pgtemplate.as_uri(pgtemplate.db_url(db_name))
    return pgtemplate.supabase(
        "db",
        "advisors",
        "--db-url",
        url,
        "--type",
        "all",
        "--level",
        "info",
        "--fail-on",
        "warn",
        "--output-format",
        "json",
    )


def _warnings(db_name: str, pg: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    # Lints that look only at the schemas the Data API exposes read pgrst.db_schemas, as on a project.
    pg.execute(f"alter database {db_name} set pgrst.db_schemas = 'public, graphql_public'")
    result = _advisors(db_name)
    found = json.loads(result.stdout)["results"] if result.stdout.strip() else []
    serious = [r for r in found if r["level"] in ("WARN", "ERROR")]
    assert (result.returncode != 0) == bool(serious), result.stdout + result.stderr
    return serious


@pytest.mark.parametrize("db_name", ["current", "legacy"], indirect=True)
def test_security_advisor_is_clean(db_name: str, pg: psycopg.Connection[Any]) -> None:
    assert _warnings(db_name, pg) == []


def test_security_advisor_would_catch_a_mutable_search_path(
    db_name: str, pg: psycopg.Connection[Any]
) -> None:
    """Guards the test above: the advisor really runs its lints here."""
    pg.execute("create function public.jobkit_oops() returns int language sql as 'select 1'")
    assert [w["name"] for w in _warnings(db_name, pg)] == ["function_search_path_mutable"]


def test_every_function_is_defined_once() -> None:
    text = "\n".join(path.read_text().lower() for path in pgtemplate.SCHEMA_SOURCES)
    names = re.findall(r"create (?:or replace )?function public\.(\w+)", text)
    assert len(names) == len(set(names)) and "or replace" not in text, names


def test_config_matches_the_cli_today() -> None:
    config = tomllib.loads((pgtemplate.ROOT / "supabase" / "config.toml").read_text())
    assert config["db"]["major_version"] == 17
    assert config["api"]["max_rows"] == 1000
