"""`pgjobkit worker` under real signals, and `pgjobkit demo` end to end (its summary checked against SQL)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from tests.cli.conftest import JOBKIT, Run, clean_env, parse
from tests.doubles import pgtemplate

APP = """
import time
from pgjobkit import Worker

worker = Worker.from_settings(poll_interval=0.05)


@worker.handler("embed")
def embed(payload):
    time.sleep(payload.get("sleep", 0))
"""


def statuses(pg: psycopg.Connection[Any]) -> dict[str, int]:
    rows = pg.execute("select status, count(*) as n from public.jobkit_jobs group by status").fetchall()
    return {r["status"]: r["n"] for r in rows}


def wait_for(check: Any, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.fixture
def app(tmp_path: Path, db_url: str) -> Iterator[subprocess.Popen[str]]:
    (tmp_path / "jobs_app.py").write_text(APP)
    proc = subprocess.Popen(
        [str(JOBKIT), "worker", "jobs_app:worker", "--concurrency", "2", "--batch", "2", "--lease", "10s"],
        cwd=tmp_path,
        env=clean_env(JOBKIT_DATABASE_URL=db_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def test_worker_runs_jobs_and_drains_on_sigterm(
    app: subprocess.Popen[str], pg: psycopg.Connection[Any]
) -> None:
    pg.execute("select public.jobkit_enqueue('embed', '{\"sleep\": 1.5}')")
    ids = [
        str(pg.execute("select id from public.jobkit_enqueue('embed')").fetchone()["id"])  # type: ignore[index]
        for _ in range(4)
    ]
    wait_for(lambda: statuses(pg).get("succeeded", 0) == 4 and statuses(pg).get("running") == 1)
    app.send_signal(signal.SIGTERM)
    _, stderr = app.communicate(timeout=20)
    assert app.returncode == 0, stderr
    assert statuses(pg) == {"succeeded": 5}  # the in-flight job finished before exit
    for job_id in ids:
        assert f"job {job_id} type=embed attempt=1 succeeded" in stderr
    assert "SIGTERM: finishing in-flight jobs" in stderr


def test_second_signal_gives_jobs_back(app: subprocess.Popen[str], pg: psycopg.Connection[Any]) -> None:
    pg.execute("select public.jobkit_enqueue('embed', '{\"sleep\": 30}')")
    wait_for(lambda: statuses(pg).get("running") == 1)
    app.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    app.send_signal(signal.SIGTERM)
    _, stderr = app.communicate(timeout=20)
    assert app.returncode == 1 and "given back" in stderr
    job = pg.execute("select status, attempts, lease_token from public.jobkit_jobs").fetchone()
    assert job == {"status": "queued", "attempts": 0, "lease_token": None}


def work_off(cwd: Path, db_url: str, *options: str) -> subprocess.CompletedProcess[str]:
    """``pgjobkit worker jobs_app:worker --until-empty`` with ``options``, run to its end."""
    return subprocess.run(
        [str(JOBKIT), "worker", "jobs_app:worker", "--until-empty", *options],
        cwd=cwd,
        env=clean_env(JOBKIT_DATABASE_URL=db_url),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_until_empty_works_off_the_queue_then_exits(
    tmp_path: Path, db_url: str, pg: psycopg.Connection[Any]
) -> None:
    (tmp_path / "jobs_app.py").write_text(APP)
    for _ in range(25):
        pg.execute("select public.jobkit_enqueue('embed')")
    pg.execute(
        "select public.jobkit_enqueue('embed', p_run_after => now() + interval '1 hour')"
    )  # not runnable
    done = work_off(tmp_path, db_url, "--batch", "10")
    assert done.returncode == 0, done.stderr
    assert "25 claimed: 25 succeeded, 0 retrying, 0 dead, 0 lost" in done.stderr
    assert statuses(pg) == {"succeeded": 25, "queued": 1}


def test_delete_succeeded_reaches_every_process(
    tmp_path: Path, db_url: str, pg: psycopg.Connection[Any]
) -> None:
    (tmp_path / "jobs_app.py").write_text(APP)
    for _ in range(40):
        pg.execute("select public.jobkit_enqueue('embed', '{\"sleep\": 0.02}')")
    done = work_off(tmp_path, db_url, "--processes", "2", "--delete-succeeded")
    assert done.returncode == 0, done.stderr
    assert statuses(pg) == {}  # every job succeeded, none kept
    assert "(this process of 2)" in done.stderr


def test_processes_share_the_queue_and_stop_together(
    tmp_path: Path, db_url: str, pg: psycopg.Connection[Any]
) -> None:
    (tmp_path / "jobs_app.py").write_text(APP)
    for _ in range(60):
        pg.execute("select public.jobkit_enqueue('embed', '{\"sleep\": 0.05}')")
    proc = subprocess.Popen(
        [str(JOBKIT), "worker", "jobs_app:worker", "--processes", "3", "--concurrency", "2", "--batch", "2"],
        cwd=tmp_path,
        env=clean_env(JOBKIT_DATABASE_URL=db_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: statuses(pg) == {"succeeded": 60})
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    workers = pg.execute("select count(distinct claimed_by) as n from public.jobkit_jobs").fetchone()
    assert workers is not None and workers["n"] == 3  # three processes claimed
    assert "(this process of 3)" in stderr
    assert "exited with" not in stderr  # every child stopped cleanly on the parent's signal


def _check_summary(summary: dict[str, Any], url: str, size: int) -> None:
    with psycopg.connect(url, row_factory=dict_row) as conn:
        rows = conn.execute(
            "select status, attempts, error, id::text as id from public.jobkit_jobs j "
            "where not exists (select from public.jobkit_pipeline_jobs p where p.job_id = j.id)"
        ).fetchall()
        piped = conn.execute(
            "select j.type, j.status, j.result from public.jobkit_jobs j "
            "join public.jobkit_pipeline_jobs p on p.job_id = j.id"
        ).fetchall()
    # the pipeline: 20 s of audio per burst job, two words a second, one embed per 200 words
    embeds = -(-(2 * 20 * size) // 200)
    assert summary["pipeline"]["jobs"] == len(piped) == 3 + embeds + 1
    assert summary["pipeline"]["succeeded"] == len(piped) and {r["status"] for r in piped} == {"succeeded"}
    assert summary["pipeline"]["embeds"] == embeds == summary["pipeline"]["reindexed"]
    assert [r["result"] for r in piped if r["type"] == "reindex"] == [{"chunks_indexed": embeds}]
    assert summary["enqueued"] == len(rows) == size + 5
    assert summary["jobs"] == len(rows) + len(piped)  # every job: the burst's and the pipeline's
    assert summary["deduplicated"] == size // 8
    assert summary["succeeded"] == sum(1 for r in rows if r["status"] == "succeeded")
    assert summary["retried"] == sum(1 for r in rows if r["status"] == "succeeded" and r["attempts"] > 1) > 0
    dead = {r["id"]: r["error"] for r in rows if r["status"] == "dead"}
    assert summary["dead"] == len(dead) == 5 and summary["dead_errors"] == dead
    assert sum(1 for e in dead.values() if e.startswith("Permanent:")) == 1
    assert summary["succeeded"] + summary["dead"] == len(rows)  # nothing left behind
    assert summary["throughput"] > 0


def _counted(stdout: str) -> tuple[str, str]:
    """What the progress bar ended on (``done/total``), and the jobs the summary's first line counts."""
    [bar] = [line for line in stdout.splitlines() if line.startswith("jobs ")]
    [counted] = re.findall(r"^(\d+) jobs \(", stdout, flags=re.MULTILINE)
    return bar.split()[-2], counted


def test_demo_on_a_configured_database(jobkit: Run, db_url: str) -> None:
    summary = parse(
        jobkit("demo", "--size", "60", "--seed", "7", "--json", "--use-database-url", timeout=120)
    )
    _check_summary(summary, db_url, 60)
    # what it prints of the database: where it is, never the password
    database = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    secret = f"postgresql://postgres:s3cret-pw@127.0.0.1:5432/{database}"  # trust auth: any password goes
    human = jobkit("demo", "--size", "10", "--use-database-url", env=clean_env(JOBKIT_DATABASE_URL=secret))
    assert human.returncode == 0, human.stderr
    assert f"database: postgres@127.0.0.1:5432/{database} (JOBKIT_DATABASE_URL" in human.stdout
    assert f"on database {database!r}" in human.stdout
    assert "s3cret" not in human.stdout + human.stderr
    bar, counted = _counted(human.stdout)
    assert bar == f"{counted}/{counted}"


def test_demo_without_a_database_url_to_use_says_so(jobkit: Run) -> None:
    refused = jobkit("demo", "--use-database-url", env=clean_env())
    assert refused.returncode == 2 and "--use-database-url needs JOBKIT_DATABASE_URL" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_demo_on_the_embedded_database(tmp_path: Path, db_url: str, pg: psycopg.Connection[Any]) -> None:
    """The README's demo path: no configuration at all, an embedded PostgreSQL from the wheel. A database
    URL the user has set is left alone; the command it prints runs as printed, from a shell whose PATH does
    not hold the venv."""
    home = pgtemplate.embedded_home(tmp_path)
    env = clean_env(
        JOBKIT_EMBEDDED_DIR=str(home),
        JOBKIT_EMBEDDED_PORT=str(pgtemplate.free_port()),
        JOBKIT_DATABASE_URL=db_url,  # the user's own database: never the demo's unless asked
        PATH="/usr/bin:/bin",
    )
    assert shutil.which("pgjobkit", path=env["PATH"]) is None

    def demo(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(JOBKIT), "demo", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )

    def untouched() -> None:
        row = pg.execute(
            "select (select count(*) from public.jobkit_jobs) as jobs, "
            "(select count(*) from public.jobkit_pipeline_jobs) as piped"
        ).fetchone()
        assert row == {"jobs": 0, "piped": 0}

    try:
        result = demo("--size", "40", "--json")
        summary = json.loads(result.stdout) if result.returncode == 0 else pytest.fail(result.stderr)
        assert summary["database"] == "jobkit_demo"
        url = f"postgresql://postgres@127.0.0.1:{env['JOBKIT_EMBEDDED_PORT']}/jobkit_demo"
        _check_summary(summary, url, 40)
        untouched()
        human = demo("--size", "20")
        assert human.returncode == 0, human.stderr
        untouched()
        assert "database: embedded PostgreSQL" in human.stdout
        assert "JOBKIT_DATABASE_URL (from the environment) is left alone: --use-database-url" in human.stdout
        assert "succeeded" in human.stdout and "deduplicated" in human.stdout and "dead" in human.stdout
        assert "-> reindex: " in human.stdout
        bar, counted = _counted(human.stdout)
        assert bar == f"{counted}/{counted}" and int(counted) == 25 + 8  # the burst's and the pipeline's
        [hint] = [line for line in human.stdout.splitlines() if "see it: " in line]
        command = hint.split("see it: ", 1)[1]
        assert command.startswith(f"JOBKIT_DATABASE_URL={url} {JOBKIT} pipeline show ")
        shown = subprocess.run(  # as the user would: pasted into their shell
            ["/bin/sh", "-c", command],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert shown.returncode == 0 and ": 8 of 8 succeeded" in shown.stdout, shown.stderr  # 4 embeds
    finally:
        subprocess.run(
            [sys.executable, "-m", "pgjobkit.embedded", "stop"], env=env, check=False, capture_output=True
        )
        shutil.rmtree(home, ignore_errors=True)
