"""What the ``jobkit`` command's modules share: exit-code exceptions, option types, and the store of a
command's settings."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, TypeVar
from uuid import UUID

import click

from pgjobkit.core.models import JobStatus
from pgjobkit.errors import ConfigurationError, InvalidArgument, JobkitError, PermissionDenied
from pgjobkit.extras import missing
from pgjobkit.settings import Settings
from pgjobkit.stores import open_store
from pgjobkit.stores.base import JobStore

T = TypeVar("T")
JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="Print JSON.")

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")


class Failure(click.ClickException):
    """A runtime failure: exit 1 with the message."""

    exit_code = 1


class BadConfig(click.ClickException):
    """Bad usage or configuration: exit 2 with the message."""

    exit_code = 2


def parse_duration(text: str) -> timedelta:
    """'30s', '5m', '7d', '250ms', '1.5h' or plain seconds."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration: use a number with ms, s, m, h, d or w (e.g. 30s, 7d)")
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2) or "s"])


class Duration(click.ParamType[timedelta, Any]):
    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> timedelta:
        if isinstance(value, timedelta):
            return value
        try:
            return parse_duration(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class UUIDType(click.ParamType[UUID, Any]):
    name = "uuid"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> UUID:
        try:
            return value if isinstance(value, UUID) else UUID(str(value))
        except ValueError:
            self.fail(f"{value!r} is not a job id (a UUID)", param, ctx)


STATUS = click.Choice([s.value for s in JobStatus])


@contextmanager
def exit_codes(what: str | None = None) -> Iterator[None]:
    """jobkit errors to exit codes: configuration, a refused key and bad input 2, everything else 1; a
    missing extra is the line that installs it, for ``what`` (default: the running command), exit 2."""
    try:
        yield
    except (ConfigurationError, InvalidArgument, PermissionDenied) as exc:
        raise BadConfig(str(exc)) from exc
    except JobkitError as exc:
        raise Failure(str(exc)) from exc
    except ModuleNotFoundError as exc:
        hint = missing(exc, what or _command())
        if hint is None:
            raise
        raise BadConfig(hint) from exc


def _command() -> str:
    ctx = click.get_current_context(silent=True)
    return f"`{ctx.command_path}`" if ctx is not None else "this command"


@contextmanager
def open_store_for(ctx: click.Context) -> Iterator[JobStore]:
    """The store of the command's settings, closed after; while it is open, the retries of a fault are not
    logged to the terminal (unless logging is configured): the command's one line says how it ended."""
    with exit_codes(), errors_only():
        store = open_store(Settings.load(ctx.obj["env_file"]))
        try:
            yield store
        finally:
            store.close()


@contextmanager
def errors_only() -> Iterator[None]:
    """When nothing configured logging, jobkit's and psycopg's warnings (a retry, a wait) go nowhere and
    their errors to stderr, instead of Python's last-resort printing of both."""
    if logging.getLogger().handlers:
        yield
        return
    handler = logging.StreamHandler()
    handler.setLevel(logging.ERROR)
    loggers = [logging.getLogger(name) for name in ("pgjobkit", "psycopg")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeHandler(handler)


def parse_payload(text: str) -> Any:
    """The --payload option's JSON, or a usage error saying where it is not JSON."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(
            f"not valid JSON ({exc.msg} at char {exc.pos})", param_hint="--payload"
        ) from exc


def print_rows(
    rows: Sequence[T], as_json: bool, to_json: Callable[[T], Any], line: Callable[[T], str], header: str = ""
) -> None:
    """A list command's output: one JSON array (--json), else the header and a line per row."""
    if as_json:
        click.echo(json.dumps([to_json(row) for row in rows]))
        return
    if header:
        click.echo(header)
    for row in rows:
        click.echo(line(row))


def say_removed(removed: bool, what: str) -> None:
    """A delete command's output: ``removed <what>``, or ``no <what>`` when there was none."""
    click.echo(f"removed {what}" if removed else f"no {what}")
