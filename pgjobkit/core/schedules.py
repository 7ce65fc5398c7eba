"""Recurring jobs, as values: ``Schedule`` (and when it is due), and what firing one did (``Fired``)."""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from pgjobkit.core.bounds import DEFAULT_MAX_ATTEMPTS, MAX_ATTEMPTS_LIMIT, MAX_PRIORITY, MAX_TYPE_LENGTH
from pgjobkit.core.bounds import MAX_FIRE as MAX_FIRE  # re-exported: written in bounds
from pgjobkit.core.cron import Cron
from pgjobkit.core.models import Answer, NewJob, refused_as_invalid

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
    max_attempts: int = Field(default=DEFAULT_MAX_ATTEMPTS, ge=1, le=MAX_ATTEMPTS_LIMIT)
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

    _refused = refused_as_invalid("schedule")

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


def job_key(name: str, due: datetime) -> str:
    """The idempotency key of schedule ``name``'s job for one due time, as jobkit_fire_schedule writes it:
    two schedulers that fire the same due time enqueue one job."""
    return f"jobkit:schedule:{name}:{due.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%S.%fZ')}"


@functools.lru_cache(maxsize=256)
def _parsed(expression: str, timezone: str) -> Cron:
    """A schedule's cron, parsed once per expression and zone (schedulers read them every second)."""
    return Cron.parse(expression, timezone=timezone)


class Fired(Answer):
    """What fire_schedule did: ``fired`` False when another scheduler fired first (nothing enqueued)."""

    fired: bool
    enqueued: int
    last_due_at: datetime
