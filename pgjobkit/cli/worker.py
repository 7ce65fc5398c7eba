"""``pgjobkit worker MODULE:OBJ``: run a Worker from the command line, in one process or several."""

from __future__ import annotations

import importlib
import logging
import os
import sys
from datetime import timedelta
from pathlib import Path

import click

from pgjobkit.cli import processes as processes_module
from pgjobkit.cli.params import BadConfig, Duration, Failure, exit_codes
from pgjobkit.settings import Settings
from pgjobkit.worker import Worker


@click.command()
@click.argument("target", metavar="MODULE:OBJ")
@click.option(
    "--types", "types", multiple=True, help="Only these job types (repeatable; default: all handlers)."
)
@click.option("--concurrency", type=click.IntRange(1, 10_000), help="Jobs in flight at once.")
@click.option("--batch", type=click.IntRange(1, 999), help="Jobs claimed per round trip.")
@click.option("--lease", type=Duration(), help="Lease for handlers registered without one, e.g. 30s.")
@click.option("--poll", type=Duration(), help="Poll interval when no wake-up arrives, e.g. 1s.")
@click.option(
    "--until-empty", is_flag=True, help="Work off what is runnable now, then exit (for cron-style runs)."
)
@click.option(
    "--schedules/--no-schedules",
    default=None,
    help="Run a scheduler for the schedules too (default: JOBKIT_SCHEDULES, on).",
)
@click.option(
    "--processes", type=click.IntRange(1, 256), default=1, show_default=True, help="Worker processes to run."
)
@click.option(
    "--delete-succeeded",
    is_flag=True,
    help="Delete succeeded jobs that have no user_id instead of keeping them (faster; no result or key kept).",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Serve Prometheus metrics on this port at /metrics (with --processes N, process i takes port+i).",
)
@click.option(
    "--metrics-host",
    help="The address the metrics listen on (default 127.0.0.1; 0.0.0.0 for a scraper in another container).",
)
@click.option(
    "--tracing/--no-tracing",
    default=None,
    help="Run each job in an OpenTelemetry span (default: when the app has set a tracer provider).",
)
@click.pass_context
def worker(
    ctx: click.Context,
    target: str,
    types: tuple[str, ...],
    concurrency: int | None,
    batch: int | None,
    lease: timedelta | None,
    poll: timedelta | None,
    until_empty: bool,
    schedules: bool | None,
    processes: int,
    delete_succeeded: bool,
    metrics_port: int | None,
    metrics_host: str | None,
    tracing: bool | None,
) -> None:
    """Run the Worker found at MODULE:OBJ until SIGINT/SIGTERM (a second signal gives jobs back), or with
    --until-empty until nothing is runnable."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise BadConfig(f"{target!r}: give the worker as MODULE:OBJ, e.g. myapp.jobs:worker")
    sys.path.insert(0, str(Path.cwd()))
    # The app's module makes its worker as it is imported (Worker.from_settings()): a jobkit error there
    # (settings, a missing extra) is the command's one line, like any other.
    try:
        with exit_codes(f"`pgjobkit worker {target}`"):
            obj = getattr(importlib.import_module(module_name), attr)
            if not isinstance(obj, Worker) and callable(obj):
                obj = obj()
    except (ImportError, AttributeError) as exc:
        raise BadConfig(f"cannot load {target!r}: {exc}") from exc
    if not isinstance(obj, Worker):
        raise BadConfig(f"{target!r} is a {type(obj).__name__}, not a jobkit Worker")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request: per claim, every poll
    with exit_codes():
        given = {
            "types": tuple(types) or None,
            "concurrency": concurrency,
            "batch_size": batch,
            "lease": lease,
            "poll_interval": poll.total_seconds() if poll else None,
            "delete_succeeded": delete_succeeded or None,
            "metrics_port": metrics_port,
            "metrics_host": metrics_host,
            "tracing": tracing,
        }
        obj.configure(
            **{k: v for k, v in given.items() if v is not None},
            schedules=schedules if schedules is not None else Settings.load(ctx.obj["env_file"]).schedules,
        )
        children = [  # each with its own metrics port, when metrics are served
            child
            for n in range(1, processes)
            for child in processes_module.spawn(
                processes_module.child_args(
                    ctx.obj["env_file"],
                    target,
                    {**ctx.params, "metrics_port": None if metrics_port is None else metrics_port + n},
                ),
                1,
            )
        ]
        try:
            summary = obj.run(until_empty=until_empty)
        finally:
            failed = processes_module.stop(children, abandon=obj.abandoned, signal=not until_empty)
    click.echo(
        f"{summary.claimed} claimed: {summary.succeeded} succeeded, {summary.retrying} retrying, "
        f"{summary.dead} dead, {summary.lost} lost, in {summary.seconds:.1f}s"
        + (f" (this process of {processes})" if processes > 1 else ""),
        err=True,
    )
    if failed:
        raise Failure(f"{failed} of {processes - 1} other worker processes failed")
    if obj.abandoned:
        # In-flight jobs were given back, but their handler threads cannot be stopped from outside:
        # leave now rather than wait for them (their results would be dropped anyway).
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
