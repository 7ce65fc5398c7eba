"""Build the test databases: a Supabase-like bootstrap, then the real `supabase db push`, once per session.

Two templates are built, one per Supabase default-privilege mode (``current``: new objects in public are
granted to no API role; ``legacy``: granted to all of them). Each test gets its own clone of one
(``CREATE DATABASE ... TEMPLATE``), dropped afterwards, so no test sees another's rows.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent.parent
BOOTSTRAP = Path(__file__).resolve().parent / "supabase_bootstrap.sql"
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
MODES = ("current", "legacy")
MIGRATIONS = sorted((ROOT / "supabase" / "migrations").glob("*.sql"))  # append-only, in version order
SCHEMA_SOURCES = sorted((ROOT / "pgjobkit" / "sql" / "schema").glob("*.sql"))  # the schema as it is now


def copy_tracked(tree: Path) -> Path:
    """What a clone of this repository holds: the files git tracks, as they are in the work tree (a build
    from a copy, since setuptools reuses a checkout's build/ folder, where a removed file would still ship)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True)
    for name in filter(None, listed.stdout.decode().split("\0")):
        if (ROOT / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    return tree


def admin_url() -> str:
    """The maintenance database URL of the test server (``JOBKIT_TEST_DATABASE_URL`` or local 5432)."""
    return os.environ.get("JOBKIT_TEST_DATABASE_URL", DEFAULT_ADMIN_URL)


def db_url(name: str, base: str | None = None) -> str:
    """``base`` (default: the admin URL) pointed at database ``name``."""
    info = psycopg.conninfo.conninfo_to_dict(base or admin_url())
    info["dbname"] = name
    return psycopg.conninfo.make_conninfo("", **{k: v for k, v in info.items() if v is not None})


def as_uri(conninfo: str) -> str:
    """A ``postgresql://`` URI for tools that take no key=value strings (the Supabase CLI)."""
    info = psycopg.conninfo.conninfo_to_dict(conninfo)
    user = info.get("user", "postgres")
    password = f":{info['password']}" if info.get("password") else ""
    host = info.get("host", "127.0.0.1")
    if str(host).startswith("/"):
        raise RuntimeError("the Supabase CLI needs a TCP database URL, not a Unix socket")
    return f"postgresql://{user}{password}@{host}:{info.get('port', 5432)}/{info['dbname']}?sslmode=disable"


def check_server() -> None:
    """Fail with a message that says what to do when no test PostgreSQL answers."""
    try:
        with psycopg.connect(admin_url(), connect_timeout=5) as conn:
            conn.execute("select 1")
    except psycopg.OperationalError as exc:
        raise RuntimeError(
            f"jobkit's tests need PostgreSQL at {admin_url()!r} and could not connect ({exc}).\n"
            "Run the README's test command (`make test`), which starts an embedded PostgreSQL when none "
            "answers, or set JOBKIT_TEST_DATABASE_URL to a superuser URL of a server you run."
        ) from exc


def supabase_cli() -> Path:
    """The pinned Supabase CLI from node_modules (installed by `npm ci`)."""
    cli = ROOT / "node_modules" / ".bin" / "supabase"
    if not cli.exists():
        raise RuntimeError("node_modules/.bin/supabase is missing: run `npm ci` (the test command does)")
    return cli


def create_database(name: str, template: str | None = None) -> None:
    with psycopg.connect(admin_url(), autocommit=True) as conn:
        conn.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))
        if template is None:
            conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
        else:
            conn.execute(
                sql.SQL("create database {} template {}").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )


def drop_database(name: str) -> None:
    with psycopg.connect(admin_url(), autocommit=True) as conn:
        conn.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))


def bootstrap(name: str, mode: str) -> None:
    """Load the Supabase bootstrap into database ``name`` under default-privilege ``mode``."""
    options = "-c bootstrap.auto_expose=on" if mode == "legacy" else ""
    with psycopg.connect(db_url(name), autocommit=True, options=options) as conn:
        conn.execute(BOOTSTRAP.read_text().encode())  # a trusted file of our own


def supabase(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """The pinned Supabase CLI with ``args``, in the project at ``cwd``."""
    return subprocess.run(
        [str(supabase_cli()), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "SUPABASE_TELEMETRY_DISABLED": "1", "DO_NOT_TRACK": "1"},
    )


def push_migrations(name: str, project: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Apply the project's supabase/migrations/ (jobkit's own by default) to database ``name``."""
    return supabase("db", "push", "--yes", "--db-url", as_uri(db_url(name)), cwd=project)


class Templates:
    """The per-session template databases, one per default-privilege mode."""

    def __init__(self) -> None:
        self.prefix = f"jk_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.names = {mode: f"{self.prefix}_tpl_{mode}" for mode in MODES}
        self.push_output: dict[str, str] = {}
        self._count = 0

    def build(self) -> None:
        for mode, name in self.names.items():
            create_database(name)
            bootstrap(name, mode)
            result = push_migrations(name)
            if result.returncode != 0:
                raise RuntimeError(f"supabase db push failed:\n{result.stdout}\n{result.stderr}")
            self.push_output[mode] = result.stdout + result.stderr

    def clone(self, mode: str = "current") -> str:
        self._count += 1
        name = f"{self.prefix}_t{self._count}"
        create_database(name, template=self.names[mode])
        return name

    def drop_all(self) -> None:
        with psycopg.connect(admin_url(), autocommit=True) as conn:
            rows = conn.execute(
                "select datname from pg_database where datname like %s", (self.prefix + "%",)
            ).fetchall()
            for (name,) in rows:
                conn.execute(sql.SQL("drop database if exists {} with (force)").format(sql.Identifier(name)))


def has_npx() -> bool:
    return shutil.which("npx") is not None


def free_port() -> int:
    """A TCP port nothing listens on now (for a private embedded server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def embedded_home(tmp_path: Path) -> Path:
    """Where a test's private embedded server lives: as root it runs as nobody, who cannot enter the
    root-only pytest tmp dir, so it goes under /var/tmp (the test removes it)."""
    if os.geteuid() == 0:
        return Path("/var/tmp") / f"jobkit-test-{uuid.uuid4().hex[:8]}"
    return tmp_path / "pg"
