"""``jobkit limit`` and ``jobkit schedule``: flow control from the command line (added to ``jobkit.cli``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import click

from jobkit.cli_common import BadConfig, _store, parse_duration, parse_payload
from jobkit.errors import InvalidArgument
from jobkit.flow import Limit, Schedule, schedule


def _rate(text: str | None) -> tuple[int | None, timedelta | None]:
    """'3000/1m' -> (3000, one minute)."""
    if text is None:
        return None, None
    count, _, per = text.partition("/")
    try:
        return int(count), parse_duration(per or "")
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: give starts per period, e.g. 3000/1m or 60/10s", param_hint="--rate"
        ) from None


def describe_limit(lim: Limit) -> str:
    """One line: the limits and where the type stands against them."""
    parts = []
    if lim.max_running is not None:
        parts.append(
            f"running {lim.running}/{lim.max_running}" + (" (paused)" if lim.max_running == 0 else "")
        )
    if lim.max_starts is not None and lim.per is not None:
        parts.append(f"started {lim.started}/{lim.max_starts} per {lim.per.total_seconds():g}s")
    if lim.max_running_per_key is not None:
        parts.append(f"at most {lim.max_running_per_key} running per key")
    return f"{lim.type[:24]:24}  " + ", ".join(parts)


@click.group()
def limit() -> None:
    """Per-type limits every worker's claims obey: running at once, starts per period, running per key."""


@limit.command("set")
@click.argument("type")
@click.option(
    "--max-running", type=click.IntRange(0, 1_000_000), help="At most this many running (0 pauses)."
)
@click.option("--rate", help="At most this many starts per period, e.g. 3000/1m.")
@click.option("--per-key", type=click.IntRange(1, 1_000_000), help="At most this many running per user/key.")
@click.pass_context
def limit_set(
    ctx: click.Context, type: str, max_running: int | None, rate: str | None, per_key: int | None
) -> None:
    """Set TYPE's limits (all at once: an option left out removes that limit)."""
    max_starts, per = _rate(rate)
    with _store(ctx) as store:
        lim = store.set_limit(
            type, max_running=max_running, max_starts=max_starts, per=per, max_running_per_key=per_key
        )
        click.echo(describe_limit(lim))


@limit.command("delete")
@click.argument("type")
@click.pass_context
def limit_delete(ctx: click.Context, type: str) -> None:
    """Remove TYPE's limits."""
    with _store(ctx) as store:
        click.echo(f"removed the limits on {type}" if store.delete_limit(type) else f"{type} had no limits")


@limit.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def limit_list(ctx: click.Context, as_json: bool) -> None:
    """Every limit, with running jobs and starts in the current window."""
    with _store(ctx) as store:
        if as_json:
            click.echo(json.dumps([lim.model_dump(mode="json") for lim in store.limits()]))
            return
        for lim in store.limits():
            click.echo(describe_limit(lim))


@click.group("schedule")
def schedule_group() -> None:
    """Recurring jobs, enqueued once per due time by the workers' schedulers."""


@schedule_group.command("set")
@click.argument("name")
@click.option("--cron", "cron", required=True, help="5 fields (m h dom mon dow), or 6 with seconds first.")
@click.option("--type", "type_", required=True, help="The job type to enqueue.")
@click.option("--payload", default="{}", show_default=True, help="The jobs' payload, a JSON object.")
@click.option("--timezone", default="UTC", show_default=True, help="IANA time zone the cron is read in.")
@click.option("--priority", type=int, default=0, show_default=True)
@click.option("--max-attempts", type=int, default=3, show_default=True)
@click.option(
    "--misfire",
    type=click.Choice(["skip", "catch_up"]),
    default="skip",
    show_default=True,
    help="Due times missed while no scheduler ran: enqueue only the latest (skip), or each (catch_up).",
)
@click.option("--disabled", is_flag=True, help="Store it, but enqueue nothing until set again without this.")
@click.pass_context
def schedule_set(
    ctx: click.Context,
    name: str,
    cron: str,
    type_: str,
    payload: str,
    timezone: str,
    priority: int,
    max_attempts: int,
    misfire: str,
    disabled: bool,
) -> None:
    """Create or replace the schedule NAME."""
    body = parse_payload(payload)
    try:
        wanted = schedule(
            name=name,
            cron=cron,
            type=type_,
            payload=body,
            timezone=timezone,
            priority=priority,
            max_attempts=max_attempts,
            misfire=misfire,
            enabled=not disabled,
        )
    except InvalidArgument as exc:
        raise BadConfig(str(exc)) from exc
    with _store(ctx) as store:
        stored = store.set_schedule(wanted)
    click.echo(
        f"schedule {stored.name}: {stored.type} at '{stored.cron}' ({stored.timezone}), next {_next(stored)}"
    )


@schedule_group.command("delete")
@click.argument("name")
@click.pass_context
def schedule_delete(ctx: click.Context, name: str) -> None:
    """Remove the schedule NAME (jobs it enqueued stay)."""
    with _store(ctx) as store:
        click.echo(f"removed schedule {name}" if store.delete_schedule(name) else f"no schedule named {name}")


@schedule_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@click.pass_context
def schedule_list(ctx: click.Context, as_json: bool) -> None:
    """Every schedule, with its next due time."""
    with _store(ctx) as store:
        found = store.schedules()
    if as_json:
        click.echo(json.dumps([s.model_dump(mode="json") | {"next_due_at": _next(s)} for s in found]))
        return
    click.echo(f"{'NAME':24}  {'TYPE':16}  {'CRON':20}  {'TIMEZONE':16}  NEXT")
    for s in found:
        click.echo(f"{s.name[:24]:24}  {s.type[:16]:16}  {s.cron[:20]:20}  {s.timezone[:16]:16}  {_next(s)}")


def _next(s: Schedule) -> str | None:
    """The schedule's next due time (ISO 8601, UTC), or None when disabled or its cron does not parse."""
    if not s.enabled:
        return None
    try:
        return s.next_due(datetime.now(UTC)).isoformat()
    except InvalidArgument:
        return None
