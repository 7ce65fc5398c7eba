"""Every store operation, written once, as values: which SQL function a step calls with which arguments,
and how its rows become the result. No I/O happens here. This module holds what every operation is made
of; ``jobs`` holds the job's own operations (enqueue, claim, complete, fail, heartbeat, progress, release),
``admin`` an operator's (cancel, requeue, prune, reclaim, stats, get, list), ``limits`` and ``schedules``
flow control's.

An operation is a generator: it yields a ``Call`` for each SQL function it needs and is sent that call's
answer (a list of rows, or one value for a scalar function), or has the JobkitError it raised thrown in;
its return value is the operation's result. The store seam (``pgjobkit.stores.base_async.adrive`` and its
generated blocking twin ``drive``) runs them, so the Postgres, Supabase and memory stores, sync and async,
all execute the same descriptions. Operations whose answer could exceed
PostgREST's max-rows are split or paged here (see pgjobkit/sql/schema/00_types.sql for why no call may).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from pgjobkit.core.bounds import MAX_ROWS as MAX_ROWS  # re-exported: written in bounds
from pgjobkit.core.models import Job

T = TypeVar("T")
log = logging.getLogger("pgjobkit.worker")
UNREADABLE = "jobkit:unreadable"  # the key a transport adds to a row whose values it could not all read:
# what was wrong, by column (pgjobkit.stores.unreadable); no column has this name


@dataclass(frozen=True, slots=True)
class Call:
    """One call of a jobkit SQL function: ``args`` maps each named argument to (SQL type, Python value)."""

    fn: str
    args: Mapping[str, tuple[str, Any]] = field(default_factory=dict)
    scalar: bool = False  # the function returns one value, not rows
    columns: tuple[str, ...] | None = None  # the only columns the operation reads (None: all); a hint


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one transport speaks: how its rows read (typed values: psycopg, memory; JSON: PostgREST), the
    most rows one answer may hold, and whether answers pass PostgREST."""

    job: Callable[[Mapping[str, Any]], Job]
    time: Callable[[Any], datetime]
    max_rows: int = MAX_ROWS
    json_answers: bool = False  # answers pass PostgREST: a set-returning call would be cut at max_rows


Op = Generator[Call, Any, T]


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


R = TypeVar("R")


def paged(
    d: Dialect,
    fn: str,
    after: Callable[[R | None], dict[str, tuple[str, Any]]],
    read: Callable[[Mapping[str, Any]], R],
) -> Op[list[R]]:
    """Every row of ``fn``, paged by the last row's key in one call per max_rows: ``after(last)`` gives the
    arguments that start after ``last`` (None: from the start), ``p_limit`` is added, ``read`` parses a row."""
    out: list[R] = []
    while True:
        rows = yield Call(fn, {**after(out[-1] if out else None), "p_limit": ("integer", d.max_rows)})
        out += [read(r) for r in rows]
        if len(rows) < d.max_rows:
            return out


def as_uuid(value: UUID | str) -> UUID:
    """A UUID as a row holds it: typed by the driver, or a string in PostgREST's JSON."""
    return value if isinstance(value, UUID) else UUID(value)


def pairs(done: Sequence[tuple[UUID, UUID]], ids: str, tokens: str) -> dict[str, tuple[str, Any]]:
    """(job id, lease token) pairs as the two uuid[] arguments the SQL takes."""
    return {ids: ("uuid[]", [d[0] for d in done]), tokens: ("uuid[]", [d[1] for d in done])}
