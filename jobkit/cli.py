"""The ``jobkit`` command. Exit codes: 0 success, 2 bad usage or configuration, 1 runtime failure."""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import click
from pydantic import ValidationError

from jobkit import cli_flow
from jobkit import demo as demo_module
from jobkit import migrate as migrate_module
from jobkit import processes as processes_module
from jobkit.cli_common import (
    STATUS,
    BadConfig,
    Duration,
    Failure,
    UUIDType,
    _errors,
    _store,
    parse_payload,
)
from jobkit.embedded import EmbeddedPostgres
from jobkit.errors import JobNotFound
from jobkit.models import Job, JobStatus, NewJob
from jobkit.settings import Settings
from jobkit.stores.base import DEFAULT_PRUNE_STATUSES
from jobkit.worker import Worker


def _job_json(job: Job) -> dict[str, Any]:
    return job.model_dump(mode="json", exclude={"lease_token"})


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--env-file", default=".env", show_default=True, help="Read settings from this file too.")
@click.version_option(package_name="jobkit")
@click.pass_context
def main(ctx: click.Context, env_file: str) -> None:
    """jobkit: a job queue on one Postgres table (Supabase or plain PostgreSQL).

    Configure with SUPABASE_URL + SUPABASE_SECRET_KEY, or JOBKIT_DATABASE_URL (see .env.example).
    """
    ctx.obj = {"env_file": env_file}


@main.command()
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
) -> None:
    """Run the Worker found at MODULE:OBJ until SIGINT/SIGTERM (a second signal gives jobs back), or with
    --until-empty until nothing is runnable."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise BadConfig(f"{target!r}: give the worker as MODULE:OBJ, e.g. myapp.jobs:worker")
    sys.path.insert(0, str(Path.cwd()))
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise BadConfig(f"cannot load {target!r}: {exc}") from exc
    if not isinstance(obj, Worker) and callable(obj):
        obj = obj()
    if not isinstance(obj, Worker):
        raise BadConfig(f"{target!r} is a {type(obj).__name__}, not a jobkit Worker")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with _errors():
        obj.configure(
            types=list(types) or None,
            concurrency=concurrency,
            batch_size=batch,
            lease=lease,
            poll_interval=poll.total_seconds() if poll else None,
        )
        obj.schedules = schedules if schedules is not None else Settings.load(ctx.obj["env_file"]).schedules
        obj.delete_succeeded = obj.delete_succeeded or delete_succeeded
        children = processes_module.spawn(
            processes_module.child_args(ctx.obj["env_file"], target, ctx.params), processes - 1
        )
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


@main.command()
@click.argument("type")
@click.option("--payload", default="{}", show_default=True, help="The job's payload, a JSON object.")
@click.option("--key", help="Idempotency key: a live job with this key is returned, not duplicated.")
@click.option("--priority", type=int, default=0, show_default=True, help="Higher runs first.")
@click.option("--delay", type=Duration(), help="Not runnable before this long from now, e.g. 30s.")
@click.option("--max-attempts", type=int, default=3, show_default=True, help="Attempts before dead.")
@click.option("--user", type=UUIDType(), help="Owner (auth.users id); they see it in their listing.")
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.pass_context
def enqueue(
    ctx: click.Context,
    type: str,
    payload: str,
    key: str | None,
    priority: int,
    delay: timedelta | None,
    max_attempts: int,
    user: UUID | None,
    as_json: bool,
) -> None:
    """Enqueue one job of TYPE."""
    body = parse_payload(payload)
    try:
        job = NewJob(
            type=type,
            payload=body,
            idempotency_key=key,
            priority=priority,
            delay=delay,
            max_attempts=max_attempts,
            user_id=user,
        )
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'job'}: {e['msg']}" for e in exc.errors())
        raise BadConfig(f"invalid job: {problems}") from exc
    with _store(ctx) as store:
        result = store.enqueue(job)
    if as_json:
        click.echo(json.dumps({"inserted": result.inserted, "job": _job_json(result.job)}))
    else:
        verb = "enqueued" if result.inserted else "already queued (same key), not duplicated:"
        click.echo(f"{verb} {result.job.id} {result.job.type} [{result.job.status}]")


@main.command()
@click.option("--status", type=STATUS, help="Only jobs in this status.")
@click.option("--type", "type_", help="Only jobs of this type.")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines.")
@click.pass_context
def jobs(ctx: click.Context, status: str | None, type_: str | None, limit: int, as_json: bool) -> None:
    """List jobs, newest first."""
    with _store(ctx) as store:
        found = store.list(status=JobStatus(status) if status else None, type=type_, limit=limit)
    if as_json:
        click.echo(json.dumps([_job_json(j) for j in found]))
        return
    click.echo(f"{'ID':36}  {'TYPE':16}  {'STATUS':9}  {'TRIES':5}  {'PRIO':>4}  {'RUN AFTER':19}  ERROR")
    for j in found:
        error = (j.error or "").replace("\n", " ")[:60]
        click.echo(
            f"{j.id!s:36}  {j.type[:16]:16}  {j.status.value:9}  {j.attempts}/{j.max_attempts:<3}  "
            f"{j.priority:>4}  {j.run_after:%Y-%m-%d %H:%M:%S}  {error}"
        )


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Counts by type and status, the oldest runnable job's age, and the dead count."""
    with _store(ctx) as store:
        s = store.stats()
        limits = store.limits()
    summary = {
        "rows": [r.model_dump(mode="json") for r in s.rows],
        "total": s.count(),
        "dead": s.count(JobStatus.DEAD),
        "oldest_runnable_seconds": s.oldest_runnable_seconds,
        "limits": [lim.model_dump(mode="json") for lim in limits],
    }
    if as_json:
        click.echo(json.dumps(summary))
        return
    click.echo(f"{'TYPE':24}  {'STATUS':9}  {'COUNT':>8}")
    for r in s.rows:
        click.echo(f"{r.type[:24]:24}  {r.status.value:9}  {r.count:>8}")
    age = s.oldest_runnable_seconds
    click.echo(
        f"total {s.count()}, dead {s.count(JobStatus.DEAD)}, oldest runnable "
        + (f"{age:.1f}s ago" if age is not None else "none")
    )
    if limits:
        click.echo("limits:")
        for lim in limits:
            click.echo("  " + cli_flow.describe_limit(lim))


@main.command()
@click.argument("ids", nargs=-1, type=UUIDType(), required=True)
@click.option("--reason", help="Kept as the job's error (default: cancelled).")
@click.pass_context
def cancel(ctx: click.Context, ids: tuple[UUID, ...], reason: str | None) -> None:
    """Cancel jobs: queued and retrying ones at once, running ones at their worker's next heartbeat."""
    with _store(ctx) as store:
        results = store.cancel(list(ids), reason)
    for r in results:
        state = "cancelled" if r.cancelled else f"not cancelled: {r.status or 'no such job'}"
        click.echo(f"{r.id} {state}")
    if any(r.status is None for r in results):
        raise SystemExit(1)


@main.command()
@click.argument("ids", nargs=-1, type=UUIDType())
@click.option("--all-dead", is_flag=True, help="Every dead job (of --type, if given).")
@click.option("--type", "type_", help="With --all-dead: only this type.")
@click.pass_context
def requeue(ctx: click.Context, ids: tuple[UUID, ...], all_dead: bool, type_: str | None) -> None:
    """Send dead jobs back to the queue: give IDs, or --all-dead."""
    if bool(ids) == all_dead:
        raise click.UsageError("give job IDs or --all-dead (one of the two)")
    if type_ and not all_dead:
        raise click.UsageError("--type goes with --all-dead")
    with _store(ctx) as store:
        try:
            back = store.requeue(list(ids) if ids else None, type=type_)
        except JobNotFound as exc:
            raise BadConfig(str(exc)) from exc
    click.echo(f"requeued {len(back)} job(s)")
    for job in back:
        click.echo(f"  {job.id} {job.type}")
    if ids and len(back) < len(ids):
        click.echo(f"{len(ids) - len(back)} left as they were (not dead, or their key is live again)")


@main.command()
@click.option("--older-than", type=Duration(), required=True, help="Age of the last update, e.g. 7d.")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(["succeeded", "dead", "cancelled"]),
    help="Which finished jobs (repeatable; default all three).",
)
@click.pass_context
def prune(ctx: click.Context, older_than: timedelta, statuses: tuple[str, ...]) -> None:
    """Delete finished jobs last updated longer ago than --older-than, in batches."""
    chosen = [JobStatus(s) for s in statuses] or list(DEFAULT_PRUNE_STATUSES)
    total = 0
    with _store(ctx) as store:
        while deleted := store.prune(older_than, chosen):
            total += deleted
    click.echo(f"pruned {total} job(s)")


@main.command()
@click.argument("target", type=click.Choice(["supabase"]))
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=".",
    show_default=True,
    help="The directory holding the project's supabase/ folder.",
)
def init(target: str, workdir: Path) -> None:
    """Write jobkit's migration into a Supabase project (supabase/migrations/), newer than its own."""
    project = workdir / "supabase"
    if not (project / "config.toml").is_file():
        raise BadConfig(
            f"no Supabase project in {workdir.resolve()} (no supabase/config.toml): run `supabase init` "
            "there first, or pass --workdir"
        )
    with _errors():
        path, written = migrate_module.init_project(project / "migrations")
    if not written:
        click.echo(f"jobkit's migration is already in the project: {path}")
        return
    click.echo(f"wrote {path}")
    click.echo("next: `supabase db push` applies it (`--db-url URL` for a database of your own)")


@main.command()
@click.option("--bootstrap", is_flag=True, help="On plain PostgreSQL: create the roles and auth schema too.")
@click.pass_context
def migrate(ctx: click.Context, bootstrap: bool) -> None:
    """Apply jobkit's migrations to JOBKIT_DATABASE_URL (Supabase projects: `supabase db push`)."""
    with _errors():
        settings = Settings.load(ctx.obj["env_file"])
        settings.require("database_url")
        assert settings.database_url is not None
        applied = migrate_module.apply(settings.database_url.get_secret_value(), bootstrap=bootstrap)
    click.echo(f"applied {', '.join(applied)}" if applied else "database is up to date")


@main.command()
@click.option(
    "--size",
    type=click.IntRange(10, 100_000),
    default=300,
    show_default=True,
    help="Unique jobs in the burst.",
)
@click.option("--concurrency", type=click.IntRange(1, 64), default=8, show_default=True)
@click.option("--seed", type=int, help="Make the burst reproducible.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.pass_context
def demo(ctx: click.Context, size: int, concurrency: int, seed: int | None, as_json: bool) -> None:
    """Run a realistic burst through a real worker: embedded PostgreSQL unless JOBKIT_DATABASE_URL is set."""
    logging.getLogger("jobkit").setLevel(logging.ERROR)  # the progress bar and summary tell the story
    with _errors():
        settings = Settings.load(ctx.obj["env_file"])
        url = settings.database_url.get_secret_value() if settings.database_url else None
        if not as_json:
            click.echo(
                "database: " + ("JOBKIT_DATABASE_URL" if url else "embedded PostgreSQL (first run: ~5 s)")
            )
        with _progress(enabled=not as_json) as report:
            summary = demo_module.run(
                url,
                embedded=EmbeddedPostgres.from_settings(settings),
                size=size,
                concurrency=concurrency,
                seed=seed,
                progress=report,
            )
    if as_json:
        click.echo(json.dumps(summary.as_dict()))
        return
    click.echo(
        f"\n{summary.enqueued} jobs in {summary.seconds:.2f}s ({summary.throughput} jobs/s) on "
        f"database {summary.database!r}"
    )
    click.echo(f"  succeeded     {summary.succeeded} ({summary.retried} after a retry)")
    click.echo(f"  deduplicated  {summary.deduplicated} enqueues returned an existing job")
    click.echo(f"  dead          {summary.dead}")
    for job_id, error in summary.dead_errors.items():
        click.echo(f"    {job_id}  {error}")


@contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[int, int], None]]:
    if not enabled:
        yield lambda done, total: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with Progress("working", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), transient=False) as bar:
        task = bar.add_task("jobs", total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


main.add_command(cli_flow.limit)
main.add_command(cli_flow.schedule_group)
