"""``pgjobkit enqueue``, ``jobs`` (a listing, or one job whole), ``stats``, ``cancel``, ``requeue`` and
``prune``: jobs from the command line."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import Any
from uuid import UUID

import click

from pgjobkit.cli.limits import describe_limit
from pgjobkit.cli.params import (
    JSON_OPTION,
    STATUS,
    BadConfig,
    Duration,
    UUIDType,
    exit_codes,
    open_store_for,
    parse_payload,
)
from pgjobkit.core.bounds import DEFAULT_MAX_ATTEMPTS
from pgjobkit.core.models import Job, JobStatus, NewJob
from pgjobkit.errors import JobNotFound
from pgjobkit.ops.admin import DEFAULT_PRUNE_STATUSES
from pgjobkit.version import SCHEMA_VERSION, __version__


def job_json(job: Job) -> dict[str, Any]:
    return job.model_dump(mode="json", exclude={"lease_token"})


@click.command()
@click.argument("type")
@click.option("--payload", default="{}", show_default=True, help="The job's payload, a JSON object.")
@click.option(
    "--key", "idempotency_key", help="Idempotency key: a live job with this key is returned, not duplicated."
)
@click.option("--priority", type=int, default=0, show_default=True, help="Higher runs first.")
@click.option("--delay", type=Duration(), help="Not runnable before this long from now, e.g. 30s.")
@click.option(
    "--max-attempts", type=int, default=DEFAULT_MAX_ATTEMPTS, show_default=True, help="Attempts before dead."
)
@click.option(
    "--user", "user_id", type=UUIDType(), help="Owner (auth.users id); they see it in their listing."
)
@click.option("--json", "as_json", is_flag=True, help="Print the job as JSON.")
@click.pass_context
def enqueue(ctx: click.Context, /, payload: str, as_json: bool, **fields: Any) -> None:
    """Enqueue one job of TYPE."""
    body = parse_payload(payload)
    with exit_codes():
        job = NewJob(payload=body, **fields)
    with open_store_for(ctx) as store:
        result = store.enqueue(job)
        stored = store.get(result.id) if as_json else None  # the whole job (None: gone meanwhile)
    if as_json:
        answer = {"id": str(result.id), "inserted": result.inserted, "status": str(result.status)}
        click.echo(json.dumps(answer | {"job": job_json(stored) if stored else None}))
    else:
        verb = "enqueued" if result.inserted else "already queued (same key), not duplicated:"
        click.echo(f"{verb} {result.id} [{result.status}]")


@click.command()
@click.argument("job_id", required=False, type=UUIDType())
@click.option("--status", type=STATUS, help="Only jobs in this status.")
@click.option("--type", "type_", help="Only jobs of this type.")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines.")
@click.pass_context
def jobs(
    ctx: click.Context, job_id: UUID | None, status: str | None, type_: str | None, limit: int, as_json: bool
) -> None:
    """List jobs, newest first; or show the job JOB_ID whole, with the traceback its latest failed attempt
    left."""
    if job_id is not None:
        if status or type_:
            raise click.UsageError("give a JOB_ID, or --status / --type to list jobs (one of the two)")
        show_job(ctx, job_id, as_json)
        return
    with open_store_for(ctx) as store:
        found = store.list_jobs(status=JobStatus(status) if status else None, type=type_, limit=limit)
    if as_json:
        click.echo(json.dumps([job_json(j) for j in found]))
        return
    click.echo(f"{'ID':36}  {'TYPE':16}  {'STATUS':9}  {'TRIES':5}  {'PRIO':>4}  {'RUN AFTER':19}  ERROR")
    for j in found:
        error = (j.error or "").replace("\n", " ")[:60]
        click.echo(
            f"{j.id!s:36}  {j.type[:16]:16}  {j.status.value:9}  {j.attempts}/{j.max_attempts:<3}  "
            f"{j.priority:>4}  {j.run_after:%Y-%m-%d %H:%M:%S}  {error}"
        )


_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # a terminal's controls, but tab and newline


def printable(text: str) -> str:
    """``text`` safe to write to a terminal: its control characters (an escape sequence in an exception's
    message, say) written as \\xNN."""
    return _UNPRINTABLE.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def show_job(ctx: click.Context, job_id: UUID, as_json: bool) -> None:
    """One job whole, and the traceback its latest failed attempt left (the operator's; its owner reads
    the error)."""
    with open_store_for(ctx) as store:
        job = store.get(job_id)
        traceback = store.traceback(job_id) if job is not None else None
    if job is None:
        click.echo(f"no job {job_id}", err=True)
        raise SystemExit(1)
    shown = None
    if traceback is not None:
        shown = {
            "attempt": traceback.attempt,
            "text": traceback.text,
            "failed_at": traceback.failed_at.isoformat(),
        }
    if as_json:
        click.echo(json.dumps({"job": job_json(job), "traceback": shown}))
        return
    fields = job_json(job)
    for name, value in fields.items():
        if name not in ("error", "payload", "result"):
            click.echo(f"{name.replace('_', ' '):16}  {printable(str(value)) if value is not None else '-'}")
    for name in ("error", "payload", "result"):
        value = fields[name]
        text = value if isinstance(value, str) or value is None else json.dumps(value, indent=2)
        click.echo(f"\n{name}:\n{printable(text) if text is not None else '-'}")
    if traceback is None:
        click.echo("\ntraceback: -")
    else:
        click.echo(f"\ntraceback (attempt {traceback.attempt}, {traceback.failed_at:%Y-%m-%d %H:%M:%S %Z}):")
        click.echo(printable(traceback.text))


@click.command()
@JSON_OPTION
@click.pass_context
def stats(ctx: click.Context, as_json: bool) -> None:
    """Counts by type and status, the oldest runnable job's age, and the dead count."""
    with open_store_for(ctx) as store:
        s = store.stats()
        limits = store.list_limits()
        schema = store.schema_version()
    summary = {
        "version": __version__,
        "schema_version": schema,
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
    click.echo(f"schema {schema or 'older than 0.2.0'} (pgjobkit {__version__} needs {SCHEMA_VERSION})")
    if limits:
        click.echo("limits:")
        for lim in limits:
            click.echo("  " + describe_limit(lim))


@click.command()
@JSON_OPTION
@click.pass_context
def workers(ctx: click.Context, as_json: bool) -> None:
    """The workers that beat: alive or not, since when, their last beat, and the jobs each holds now."""
    with open_store_for(ctx) as store:
        found = store.list_workers()
    if as_json:
        click.echo(json.dumps([w.model_dump(mode="json") for w in found]))
        return
    if not found:
        click.echo("no workers (a worker keeps a row while it runs, from pgjobkit 0.5.0)")
        return
    click.echo(f"{'NAME':40}  {'ALIVE':5}  {'HOLDS':>5}  {'SINCE':19}  {'LAST BEAT':19}  TYPES")
    for w in found:
        click.echo(
            f"{w.name[:40]:40}  {'yes' if w.alive else 'no':5}  {w.holding:>5}  {w.started_at:%Y-%m-%d %H:%M:%S}  "
            f"{w.heartbeat_at:%Y-%m-%d %H:%M:%S}  {','.join(w.types)[:60]}"
        )


@click.command()
@click.argument("ids", nargs=-1, type=UUIDType(), required=True)
@click.option("--reason", help="Kept as the job's error (default: cancelled).")
@click.pass_context
def cancel(ctx: click.Context, ids: tuple[UUID, ...], reason: str | None) -> None:
    """Cancel jobs: queued and retrying ones at once, running ones at their worker's next heartbeat."""
    with open_store_for(ctx) as store:
        results = store.cancel(list(ids), reason)
    for r in results:
        state = "cancelled" if r.cancelled else f"not cancelled: {r.status or 'no such job'}"
        click.echo(f"{r.id} {state}")
    if any(r.status is None for r in results):
        raise SystemExit(1)


@click.command()
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
    with open_store_for(ctx) as store:
        try:
            back = store.requeue(list(ids) if ids else None, type=type_)
        except JobNotFound as exc:
            raise BadConfig(str(exc)) from exc
    click.echo(f"requeued {len(back)} job(s)")
    for job in back:
        click.echo(f"  {job.id} {job.type}")
    if ids and len(back) < len(ids):
        click.echo(f"{len(ids) - len(back)} left as they were (not dead, or their key is live again)")


@click.command()
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
    with open_store_for(ctx) as store:
        while deleted := store.prune(older_than, chosen):
            total += deleted
    click.echo(f"pruned {total} job(s)")
