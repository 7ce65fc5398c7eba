"""Flow control's schedule operations, as values: set, delete, list and fire schedules."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from pgjobkit.core.bounds import MAX_FIRE
from pgjobkit.core.schedules import Fired, Schedule
from pgjobkit.errors import InvalidArgument
from pgjobkit.ops import UNREADABLE, Call, Dialect, Op

log = logging.getLogger("pgjobkit.worker.scheduler")


def set_schedule(d: Dialect, s: Schedule) -> Op[Schedule]:
    args = {
        "p_name": ("text", s.name),
        "p_cron": ("text", s.cron),
        "p_type": ("text", s.type),
        "p_payload": ("jsonb", s.payload),
        "p_timezone": ("text", s.timezone),
        "p_priority": ("integer", s.priority),
        "p_max_attempts": ("integer", s.max_attempts),
        "p_misfire": ("text", s.misfire),
        "p_enabled": ("boolean", s.enabled),
    }
    [row] = yield Call("jobkit_set_schedule", args)
    return Schedule.from_row(row)


def delete_schedule(d: Dialect, name: str) -> Op[bool]:
    return bool((yield Call("jobkit_delete_schedule", {"p_name": ("text", name)}, scalar=True)))


def list_schedules(d: Dialect) -> Op[tuple[list[Schedule], datetime | None]]:
    """Every schedule, and the database's clock (None when there are no schedules). A row that cannot be
    read (a time no datetime holds, written around jobkit's functions) is left out, and said in the log."""
    rows = yield Call("jobkit_list_schedules")
    now = d.time(rows[0]["db_now"]) if rows else None
    out: list[Schedule] = []
    for row in rows:
        try:
            if UNREADABLE in row:
                raise ValueError(row[UNREADABLE])
            out.append(Schedule.from_row(row))
        except ValueError as exc:  # pydantic's ValidationError is one
            log.error("schedule %r cannot be read, and is skipped: %s", str(row.get("name"))[:150], exc)
    return out, now


def fire_schedule(d: Dialect, name: str, last_due_at: datetime, due: Sequence[datetime]) -> Op[Fired]:
    if not 1 <= len(due) <= MAX_FIRE:
        raise InvalidArgument(f"jobkit: due must hold 1 to {MAX_FIRE} due times")
    args = {
        "p_name": ("text", name),
        "p_last_due_at": ("timestamptz", last_due_at),
        "p_due": ("timestamptz[]", list(due)),
    }
    [row] = yield Call("jobkit_fire_schedule", args)
    return Fired.model_validate(row)
