"""``pgjobkit schedule set|delete|list``: recurring jobs from the command line."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import click

from pgjobkit.cli.params import (
    JSON_OPTION,
    exit_codes,
    open_store_for,
    parse_payload,
    print_rows,
    say_removed,
)
from pgjobkit.core.bounds import DEFAULT_MAX_ATTEMPTS
from pgjobkit.core.schedules import Schedule
from pgjobkit.errors import InvalidArgument


@click.group("schedule")
def schedule_group() -> None:
    """Recurring jobs, enqueued once per due time by the workers' schedulers."""


@schedule_group.command("set")
@click.argument("name")
@click.option("--cron", "cron", required=True, help="5 fields (m h dom mon dow), or 6 with seconds first.")
@click.option("--type", "type", required=True, help="The job type to enqueue.")
@click.option("--payload", default="{}", show_default=True, help="The jobs' payload, a JSON object.")
@click.option("--timezone", default="UTC", show_default=True, help="IANA time zone the cron is read in.")
@click.option("--priority", type=int, default=0, show_default=True)
@click.option("--max-attempts", type=int, default=DEFAULT_MAX_ATTEMPTS, show_default=True)
@click.option(
    "--misfire",
    type=click.Choice(["skip", "catch_up"]),
    default="skip",
    show_default=True,
    help="Due times missed while no scheduler ran: enqueue only the latest (skip), or each (catch_up).",
)
@click.option(
    "--enabled/--disabled",
    default=True,
    show_default=True,
    help="--disabled stores it, but enqueues nothing until it is set again without this.",
)
@click.pass_context
def set_schedule(ctx: click.Context, /, payload: str, **fields: Any) -> None:
    """Create or replace the schedule NAME."""
    body = parse_payload(payload)
    with exit_codes():
        wanted = Schedule(payload=body, **fields)
    with open_store_for(ctx) as store:
        stored = store.set_schedule(wanted)
    click.echo(
        f"schedule {stored.name}: {stored.type} at '{stored.cron}' ({stored.timezone}), next {_next(stored)}"
    )


@schedule_group.command("delete")
@click.argument("name")
@click.pass_context
def delete_schedule(ctx: click.Context, name: str) -> None:
    """Remove the schedule NAME (jobs it enqueued stay)."""
    with open_store_for(ctx) as store:
        say_removed(store.delete_schedule(name), f"schedule {name}")


@schedule_group.command("list")
@JSON_OPTION
@click.pass_context
def list_schedules(ctx: click.Context, as_json: bool) -> None:
    """Every schedule, with its next due time."""
    with open_store_for(ctx) as store:
        found = store.list_schedules()
    print_rows(
        found,
        as_json,
        lambda s: s.model_dump(mode="json") | {"next_due_at": _next(s)},
        lambda s: f"{s.name[:24]:24}  {s.type[:16]:16}  {s.cron[:20]:20}  {s.timezone[:16]:16}  {_next(s)}",
        header=f"{'NAME':24}  {'TYPE':16}  {'CRON':20}  {'TIMEZONE':16}  NEXT",
    )


def _next(s: Schedule) -> str | None:
    """The schedule's next due time (ISO 8601, UTC), or None when disabled or its cron does not parse."""
    if not s.enabled:
        return None
    try:
        return s.next_due(datetime.now(UTC)).isoformat()
    except InvalidArgument:
        return None
