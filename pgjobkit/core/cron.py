"""Cron schedules: parse a 5-field (or 6-field, seconds first) expression and compute its due times.

Due times are wall-clock times in the schedule's IANA time zone, returned as aware UTC datetimes. Around a
daylight-saving change a wall time that does not exist (the spring-forward gap) is skipped, and one that
occurs twice (the fall-back hour) is due once, at its first occurrence; so an every-minute schedule is not
due during the repeated hour's second pass. No dependencies beyond the standard library.
"""

from __future__ import annotations

import calendar
from bisect import bisect_left
from dataclasses import dataclass, field
from datetime import MAXYEAR, UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pgjobkit.core.bounds import MAX_FIRE
from pgjobkit.errors import InvalidArgument

_SECOND = timedelta(seconds=1)
_MONTHS = {
    m: i
    for i, m in enumerate(
        ("JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"), 1
    )
}
_DAYS = {d: i for i, d in enumerate(("SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"))}
_MONTH_DAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # the most each month can have
# name, lowest, highest, names accepted; in the order of a 6-field expression
_SPECS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("second", 0, 59, {}),
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day-of-month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day-of-week", 0, 7, _DAYS),
)
_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_LOWS = (0, 1, 1, 0, 0, 0)  # year, month, day, hour, minute, second: where each restarts after a carry


@dataclass(frozen=True, slots=True)
class Cron:
    """A parsed cron schedule in a time zone. Build it with ``Cron.parse``."""

    expression: str
    timezone: str
    _zone: ZoneInfo = field(repr=False, compare=False)
    _units: tuple[tuple[int, ...], ...] = field(repr=False, compare=False)  # month, day, hour, minute, second
    _weekdays: frozenset[int] = field(repr=False, compare=False)  # 0 is Sunday
    _day_or: bool = field(repr=False, compare=False)  # both day fields restricted: either may match

    @classmethod
    def parse(cls, expression: str, *, timezone: str = "UTC") -> Cron:
        """Parse ``expression`` (5 fields, 6 with seconds first, or a macro such as ``@daily``)."""
        text = " ".join(expression.split())
        if text.startswith("@"):
            if text.lower() not in _MACROS:
                raise InvalidArgument(f"cron: unknown macro {text!r}; use one of {', '.join(_MACROS)}")
            text_fields = _MACROS[text.lower()].split()
        else:
            text_fields = text.split()
        if len(text_fields) == 5:
            text_fields.insert(0, "0")
        elif len(text_fields) != 6:
            raise InvalidArgument(
                "cron: expected 5 fields (minute hour day-of-month month day-of-week) or 6 (with seconds "
                f"first), got {len(text_fields)}"
            )
        sec, minute, hour, day, month, weekday = (
            _parse_field(f, *spec) for f, spec in zip(text_fields, _SPECS, strict=True)
        )
        day_or = not text_fields[3].startswith("*") and not text_fields[5].startswith("*")
        if not day_or and not any(d <= _MONTH_DAYS[m] for m in month for d in day):
            raise InvalidArgument(
                f"cron: the day-of-month field {text_fields[3]!r} never occurs in the month field "
                f"{text_fields[4]!r}, so the schedule would never be due; fix the day or the month"
            )
        try:
            zone = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            raise InvalidArgument(
                f"timezone: unknown time zone {timezone!r}; use an IANA name such as 'Europe/Berlin' or 'UTC'"
            ) from None
        weekdays = frozenset(d % 7 for d in weekday)
        return cls(text, timezone, zone, (month, day, hour, minute, sec), weekdays, day_or)

    def next_after(self, dt: datetime) -> datetime:
        """The first due time strictly after ``dt`` (timezone-aware), in UTC."""
        after = _aware(dt, "dt").astimezone(UTC)
        wall = after.astimezone(self._zone).replace(tzinfo=None, microsecond=0) + _SECOND
        while True:
            found = self._first_match(wall)
            early, late = _offset(found, self._zone, 0), _offset(found, self._zone, 1)
            due = (found - early).replace(tzinfo=UTC)
            if early == late or (early > late and due > after):  # regular, or a first occurrence after dt
                return due
            wall = self._regular_from(found, abs(early - late))  # skip the gap, or the repeated hour

    def due_between(self, after: datetime, until: datetime, limit: int = MAX_FIRE) -> list[datetime]:
        """The due times ``t`` with ``after < t <= until`` (both timezone-aware), oldest first, at most
        ``limit`` of them, in UTC."""
        t, end = _aware(after, "after"), _aware(until, "until")
        if limit < 0:
            raise InvalidArgument(f"cron: limit must be 0 or more, got {limit}")
        due: list[datetime] = []
        while len(due) < limit and (t := self.next_after(t)) <= end:
            due.append(t)
        return due

    def _first_match(self, start: datetime) -> datetime:
        """The first wall time at or after ``start`` (naive, whole seconds) that every field matches, found
        unit by unit: a unit with no match left carries into the one above and restarts those below."""
        t = [start.year, start.month, start.day, start.hour, start.minute, start.second]
        i = 1
        while i < 6:
            if t[0] > MAXYEAR:
                raise InvalidArgument(
                    f"cron: {self.expression!r} is not due after {start} (wall time) up to the year {MAXYEAR}"
                )
            found = self._first_day(t[0], t[1], t[2]) if i == 2 else _first(self._units[i - 1], t[i])
            if found is None:
                t[i - 1] += 1
                t[i:] = _LOWS[i:]
                i = max(i - 1, 1)
            else:
                if found != t[i]:
                    t[i], t[i + 1 :] = found, _LOWS[i + 1 :]
                i += 1
        return datetime(t[0], t[1], t[2], t[3], t[4], t[5])

    def _first_day(self, year: int, month: int, day: int) -> int | None:
        first_weekday, last = calendar.monthrange(year, month)  # Monday is 0 here, Sunday in cron
        days = self._units[1]
        for d in range(day, last + 1):
            in_month, in_week = d in days, (first_weekday + d) % 7 in self._weekdays
            if (in_month or in_week) if self._day_or else (in_month and in_week):
                return d
        return None

    def _regular_from(self, wall: datetime, span: timedelta) -> datetime:
        """The first wall time after ``wall`` (in a gap or a repeated hour) that occurs exactly once."""
        lo, hi = wall, wall + span
        while _offset(hi, self._zone, 0) != _offset(hi, self._zone, 1):
            hi += span
        while hi - lo > _SECOND:
            mid = lo + (hi - lo) // _SECOND // 2 * _SECOND
            if _offset(mid, self._zone, 0) == _offset(mid, self._zone, 1):
                hi = mid
            else:
                lo = mid
        return hi


def _parse_field(text: str, name: str, lo: int, hi: int, names: dict[str, int]) -> tuple[int, ...]:
    values: set[int] = set()
    for part in text.split(","):
        span, slash, step_text = part.partition("/")
        step = _number(step_text, name, part, 1, None, {}) if slash else 1
        if span == "*":
            first, last = lo, hi
        elif "-" in span:
            first_text, _, last_text = span.partition("-")
            first = _number(first_text, name, part, lo, hi, names)
            last = _number(last_text, name, part, lo, hi, names)
            if first > last:
                raise InvalidArgument(
                    f"cron: the {name} field {part!r} is a reversed range; write the smaller value first"
                )
        else:
            first = _number(span, name, part, lo, hi, names)
            last = hi if slash else first
        values.update(range(first, last + 1, step))
    return tuple(sorted(values))


def _number(text: str, name: str, part: str, lo: int, hi: int | None, names: dict[str, int]) -> int:
    if text.upper() in names:
        return names[text.upper()]
    if not (text.isascii() and text.isdigit()):
        first, *_, last = names or ("", "")
        spelled = f" or a name ({first}-{last})" if names else ""
        raise InvalidArgument(
            f"cron: the {name} field {part!r} is not valid; use *, a number{spelled}, a range a-b, "
            "a step */n or a-b/n, or a list a,b"
        )
    value = int(text)
    if hi is None and value < lo:
        raise InvalidArgument(f"cron: the {name} field {part!r} has step {value}; use a step of 1 or more")
    if hi is not None and not lo <= value <= hi:
        raise InvalidArgument(f"cron: the {name} field {part!r} is out of range {lo}-{hi}")
    return value


def _first(values: tuple[int, ...], at_least: int) -> int | None:
    i = bisect_left(values, at_least)
    return values[i] if i < len(values) else None


def _offset(wall: datetime, zone: ZoneInfo, fold: int) -> timedelta:
    offset = wall.replace(tzinfo=zone, fold=fold).utcoffset()
    assert offset is not None
    return offset


def _aware(dt: datetime, name: str) -> datetime:
    if not isinstance(dt, datetime) or dt.utcoffset() is None:
        raise InvalidArgument(
            f"cron: {name} must be a timezone-aware datetime, got {dt!r}; e.g. datetime.now(UTC)"
        )
    return dt
