"""Flow control's values and operations: per-type limits every claim obeys (``Limit``), and recurring jobs
(``Schedule``). Operations are written once, as values, like those in ``ops``; the stores run them."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from jobkit.cron import Cron
from jobkit.errors import InvalidArgument
from jobkit.models import MAX_ATTEMPTS_LIMIT, MAX_PRIORITY, MAX_TYPE_LENGTH, NewJob
from jobkit.ops import UNREADABLE, Call, Codec, Op

log = logging.getLogger("jobkit.scheduler")
MAX_STARTS = 100_000  # starts per window a rate limit may allow (a claim counts the window's starts)
MAX_FIRE = 1000  # due times one schedule_fire takes


class Limit(BaseModel):
    """Limits on one job type, held by every claim on every worker: at most ``max_running`` running at once
    (0 pauses the type), at most ``max_starts`` starts in any window of ``per``, at most
    ``max_running_per_key`` running per fairness key. None: no limit of that kind. ``running`` and
    ``started`` (within the current window) are read with the limits."""

    model_config = ConfigDict(frozen=True)

    type: str
    max_running: int | None = None
    max_starts: int | None = None
    per: timedelta | None = None
    max_running_per_key: int | None = None
    running: int = 0
    started: int = 0
    updated_at: datetime | None = None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Limit:
        per = row.get("per_seconds")
        fields = {k: v for k, v in row.items() if k in cls.model_fields}
        return cls.model_validate(fields | {"per": timedelta(seconds=per) if per is not None else None})


Misfire = Literal["skip", "catch_up"]


class Schedule(BaseModel):
    """A named recurring job: a job of ``type`` with ``payload`` at each time ``cron`` names (5 fields, or 6
    with seconds first) in ``timezone``. ``misfire`` says what happens to due times missed while no
    scheduler ran: ``"skip"`` enqueues only the latest, ``"catch_up"`` every one. ``last_due_at`` (kept by
    the database) is the last due time enqueued or skipped."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=150, pattern=r"^[^\x00-\x1f\x7f-\x9f]*$")
    cron: str
    type: str = Field(min_length=1, max_length=MAX_TYPE_LENGTH)
    payload: dict[str, Any] = Field(default_factory=dict)
    timezone: str = "UTC"
    priority: int = Field(default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    max_attempts: int = Field(default=3, ge=1, le=MAX_ATTEMPTS_LIMIT)
    misfire: Misfire = "skip"
    enabled: bool = True
    last_due_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @model_validator(mode="after")
    def _parses(self, info: ValidationInfo) -> Schedule:
        if not (info.context or {}).get("stored"):  # a stored cron is parsed where it is used
            Cron.parse(self.cron, timezone=self.timezone)  # raises InvalidArgument naming the field
            NewJob(type=self.type, payload=self.payload)  # the job's own rules
        return self

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Schedule:
        fields = {k: v for k, v in row.items() if k in cls.model_fields}
        return cls.model_validate(fields, context={"stored": True})

    def due(self, now: datetime) -> list[datetime]:
        """The due times to enqueue at ``now`` (after ``last_due_at``), as ``misfire`` says: oldest first, at
        most 1000 per call (catch_up continues on the next call)."""
        after = self.last_due_at if self.last_due_at is not None else now
        cron = _parsed(self.cron, self.timezone)
        if self.misfire == "catch_up":
            return cron.due_between(after, now, limit=MAX_FIRE)
        latest: list[datetime] = []
        while batch := cron.due_between(latest[-1] if latest else after, now, limit=MAX_FIRE):
            latest = batch[-1:]
        return latest

    def next_due(self, now: datetime) -> datetime:
        """The first due time after both ``now`` and ``last_due_at``."""
        return _parsed(self.cron, self.timezone).next_after(max(self.last_due_at or now, now))


@functools.lru_cache(maxsize=256)
def _parsed(expression: str, timezone: str) -> Cron:
    """A schedule's cron, parsed once per expression and zone (schedulers read them every second)."""
    return Cron.parse(expression, timezone=timezone)


class Fired(BaseModel):
    """What schedule_fire did: ``fired`` False when another scheduler fired first (nothing enqueued)."""

    model_config = ConfigDict(frozen=True)

    fired: bool
    enqueued: int
    last_due_at: datetime


def _invalid(exc: ValidationError) -> InvalidArgument:
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "schedule"
    return InvalidArgument(f"jobkit: {field}: {first['msg']}")


def schedule(**fields: Any) -> Schedule:
    """A Schedule from keyword fields, or InvalidArgument naming the bad field."""
    try:
        return Schedule(**fields)
    except ValidationError as exc:
        cause = exc.errors()[0].get("ctx", {}).get("error")
        raise (cause if isinstance(cause, InvalidArgument) else _invalid(exc)) from None


# --- operations ---------------------------------------------------------------------------------------
def limit_set(
    c: Codec,
    type: str,
    *,
    max_running: int | None = None,
    max_starts: int | None = None,
    per: timedelta | None = None,
    max_running_per_key: int | None = None,
) -> Op[Limit]:
    if not 1 <= len(type) <= MAX_TYPE_LENGTH:
        raise InvalidArgument("jobkit: type must be a job type of 1 to 200 characters")
    if max_running is not None and not 0 <= max_running <= 1_000_000:
        raise InvalidArgument("jobkit: max_running must be between 0 (paused) and 1000000, or None")
    if (max_starts is None) != (per is None):
        raise InvalidArgument(
            "jobkit: give max_starts and per together (a rate: 3000 per minute), or neither"
        )
    if max_starts is not None and not 1 <= max_starts <= MAX_STARTS:
        raise InvalidArgument(f"jobkit: max_starts must be between 1 and {MAX_STARTS}")
    if per is not None and not timedelta(0) < per <= timedelta(days=1):
        raise InvalidArgument("jobkit: per must be longer than 0 and at most one day")
    if max_running_per_key is not None and not 1 <= max_running_per_key <= 1_000_000:
        raise InvalidArgument("jobkit: max_running_per_key must be between 1 and 1000000, or None")
    if max_running is None and max_starts is None and max_running_per_key is None:
        raise InvalidArgument("jobkit: give at least one limit; limit_delete removes a type's limits")
    args = {
        "p_type": ("text", type),
        "p_max_running": ("integer", max_running),
        "p_max_starts": ("integer", max_starts),
        "p_per_seconds": ("double precision", per.total_seconds() if per is not None else None),
        "p_max_running_per_key": ("integer", max_running_per_key),
    }
    [row] = yield Call("jobkit_limit_set", args)
    return Limit.from_row(row)


def limit_delete(c: Codec, type: str) -> Op[bool]:
    return bool((yield Call("jobkit_limit_delete", {"p_type": ("text", type)}, scalar=True)))


def limits(c: Codec) -> Op[list[Limit]]:
    return [Limit.from_row(r) for r in (yield Call("jobkit_limit_list"))]


def schedule_set(c: Codec, s: Schedule) -> Op[Schedule]:
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
    [row] = yield Call("jobkit_schedule_set", args)
    return Schedule.from_row(row)


def schedule_delete(c: Codec, name: str) -> Op[bool]:
    return bool((yield Call("jobkit_schedule_delete", {"p_name": ("text", name)}, scalar=True)))


def schedules(c: Codec) -> Op[tuple[list[Schedule], datetime | None]]:
    """Every schedule, and the database's clock (None when there are no schedules). A row that cannot be
    read (a time no datetime holds, written around jobkit's functions) is left out, and said in the log."""
    rows = yield Call("jobkit_schedule_list")
    now = c.time(rows[0]["db_now"]) if rows else None
    out: list[Schedule] = []
    for row in rows:
        try:
            if UNREADABLE in row:
                raise ValueError(row[UNREADABLE])
            out.append(Schedule.from_row(row))
        except ValueError as exc:  # pydantic's ValidationError is one
            log.error("schedule %r cannot be read, and is skipped: %s", str(row.get("name"))[:150], exc)
    return out, now


def schedule_fire(c: Codec, name: str, last_due_at: datetime, due: Sequence[datetime]) -> Op[Fired]:
    if not 1 <= len(due) <= MAX_FIRE:
        raise InvalidArgument(f"jobkit: due must hold 1 to {MAX_FIRE} due times")
    args = {
        "p_name": ("text", name),
        "p_last_due_at": ("timestamptz", last_due_at),
        "p_due": ("timestamptz[]", list(due)),
    }
    [row] = yield Call("jobkit_schedule_fire", args)
    return Fired.model_validate(row)
