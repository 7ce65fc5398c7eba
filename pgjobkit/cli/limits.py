"""``pgjobkit limit set|delete|list``: per-type limits from the command line."""

from __future__ import annotations

from datetime import timedelta

import click

from pgjobkit.cli.params import JSON_OPTION, open_store_for, parse_duration, print_rows, say_removed
from pgjobkit.core.limits import Limit


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
def set_limit(
    ctx: click.Context, type: str, max_running: int | None, rate: str | None, per_key: int | None
) -> None:
    """Set TYPE's limits (all at once: an option left out removes that limit)."""
    max_starts, per = _rate(rate)
    with open_store_for(ctx) as store:
        lim = store.set_limit(
            type, max_running=max_running, max_starts=max_starts, per=per, max_running_per_key=per_key
        )
        click.echo(describe_limit(lim))


@limit.command("delete")
@click.argument("type")
@click.pass_context
def delete_limit(ctx: click.Context, type: str) -> None:
    """Remove TYPE's limits."""
    with open_store_for(ctx) as store:
        say_removed(store.delete_limit(type), f"limits on {type}")


@limit.command("list")
@JSON_OPTION
@click.pass_context
def list_limits(ctx: click.Context, as_json: bool) -> None:
    """Every limit, with running jobs and starts in the current window."""
    with open_store_for(ctx) as store:
        print_rows(store.list_limits(), as_json, lambda lim: lim.model_dump(mode="json"), describe_limit)
