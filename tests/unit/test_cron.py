"""Cron parses standard expressions and finds due times exactly, across daylight-saving changes."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from pgjobkit.core.cron import Cron
from pgjobkit.errors import InvalidArgument

T0 = datetime(2026, 1, 1, tzinfo=UTC)  # a Thursday
BERLIN = ZoneInfo("Europe/Berlin")


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


def due(expression: str, after: datetime, until: datetime, timezone: str = "UTC") -> list[datetime]:
    return Cron.parse(expression, timezone=timezone).due_between(after, until)


def test_parse_keeps_expression_and_zone() -> None:
    c = Cron.parse("  */15  *\t* * * ", timezone="Europe/Berlin")
    assert (c.expression, c.timezone) == ("*/15 * * * *", "Europe/Berlin")
    assert c == Cron.parse("*/15 * * * *", timezone="Europe/Berlin")
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.timezone = "UTC"  # type: ignore[misc]


def test_every_second_with_six_fields() -> None:
    times = due("* * * * * *", T0, T0 + timedelta(minutes=5))
    assert times == [T0 + timedelta(seconds=s) for s in range(1, 301)]
    assert all(t.tzinfo is UTC for t in times)
    assert Cron.parse("* * * * * *").next_after(T0 + timedelta(microseconds=1)) == T0 + timedelta(seconds=1)


@pytest.mark.parametrize(
    ("after", "expected"),
    [
        (utc(2026, 1, 1, 0, 0), utc(2026, 1, 1, 0, 15)),
        (utc(2026, 1, 1, 0, 14, 59, 999999), utc(2026, 1, 1, 0, 15)),
        (utc(2026, 1, 1, 0, 15), utc(2026, 1, 1, 0, 30)),
        (utc(2026, 12, 31, 23, 50), utc(2027, 1, 1, 0, 0)),
        (datetime(2026, 1, 1, 1, 50, tzinfo=BERLIN), utc(2026, 1, 1, 1, 0)),  # any aware input
    ],
)
def test_every_fifteen_minutes(after: datetime, expected: datetime) -> None:
    assert Cron.parse("*/15 * * * *").next_after(after) == expected


def test_daily_in_berlin_skips_the_spring_forward_gap() -> None:
    times = due("30 2 * * *", utc(2026, 3, 27), utc(2026, 3, 31, 12), "Europe/Berlin")
    # 29 Mar 2026: 02:00 CET jumps to 03:00 CEST, so 02:30 does not exist that day.
    assert times == [
        utc(2026, 3, 27, 1, 30),
        utc(2026, 3, 28, 1, 30),
        utc(2026, 3, 30, 0, 30),
        utc(2026, 3, 31, 0, 30),
    ]


def test_daily_in_berlin_fires_once_in_the_fall_back_hour() -> None:
    c = Cron.parse("30 2 * * *", timezone="Europe/Berlin")
    # 25 Oct 2026: 03:00 CEST goes back to 02:00 CET; 02:30 is due at its first occurrence only.
    times = c.due_between(utc(2026, 10, 24), utc(2026, 10, 26, 12))
    assert times == [utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]
    assert c.next_after(utc(2026, 10, 25, 0, 10)) == utc(2026, 10, 25, 0, 30)  # 02:10 CEST
    assert c.next_after(utc(2026, 10, 25, 1, 10)) == utc(2026, 10, 26, 1, 30)  # 02:10 CET, the second pass
    assert c.next_after(utc(2026, 10, 25, 0, 30)) == utc(2026, 10, 26, 1, 30)


def test_every_minute_across_both_changes() -> None:
    minutely = Cron.parse("* * * * *", timezone="Europe/Berlin")
    assert minutely.next_after(utc(2026, 3, 29, 0, 59)) == utc(2026, 3, 29, 1, 0)  # 01:59 CET -> 03:00 CEST
    assert minutely.next_after(utc(2026, 10, 25, 0, 59)) == utc(2026, 10, 25, 2, 0)  # repeated hour not due
    assert minutely.next_after(utc(2026, 10, 25, 1, 30)) == utc(2026, 10, 25, 2, 0)


ORACLE_WINDOWS = [
    ("Europe/Berlin", utc(2026, 3, 28, 12)),
    ("Europe/Berlin", utc(2026, 10, 24, 12)),
    ("America/New_York", utc(2026, 3, 7, 12)),
    ("America/New_York", utc(2026, 10, 31, 12)),
    ("Australia/Lord_Howe", utc(2026, 4, 4)),  # a 30-minute shift
    ("Australia/Lord_Howe", utc(2026, 10, 3)),
]
ORACLE_EXPRESSIONS: list[tuple[str, Callable[[datetime], bool]]] = [
    ("*/15 * * * *", lambda w: w.minute % 15 == 0),
    ("30 2 * * *", lambda w: (w.hour, w.minute) == (2, 30)),
    ("* 1-2 * * *", lambda w: w.hour in (1, 2)),
    ("45 1,2,3 * * *", lambda w: w.minute == 45 and 1 <= w.hour <= 3),
    ("0 0 * * *", lambda w: (w.hour, w.minute) == (0, 0)),
]


@pytest.mark.parametrize(("zone", "start"), ORACLE_WINDOWS, ids=[f"{z}-{s:%b}" for z, s in ORACLE_WINDOWS])
@pytest.mark.parametrize(
    ("expression", "matches"), ORACLE_EXPRESSIONS, ids=[e for e, _ in ORACLE_EXPRESSIONS]
)
def test_agrees_with_a_minute_by_minute_oracle(
    zone: str, start: datetime, expression: str, matches: Callable[[datetime], bool]
) -> None:
    minutes = [start + timedelta(minutes=m) for m in range(1, 48 * 60 + 1)]
    walls = [(u, u.astimezone(ZoneInfo(zone))) for u in minutes]
    expected = [u for u, w in walls if w.fold == 0 and matches(w)]  # the first occurrence of each wall time
    assert due(expression, start, minutes[-1], zone) == expected


@pytest.mark.parametrize(
    ("expression", "equivalent"),
    [
        ("0 9 * jan,Mar mon-FRI", "0 9 * 1,3 1-5"),
        ("0 0 * * 0", "0 0 * * 7"),
        ("0 0 * * SUN", "0 0 * * 7"),
        ("0 0 * * 5-7", "0 0 * * 0,5,6"),
        ("0 0 * * */2", "0 0 * * 0,2,4,6"),
        ("@daily", "0 0 * * *"),
        ("@HOURLY", "0 * * * *"),
        ("@weekly", "0 0 * * sun"),
        ("@monthly", "0 0 1 * *"),
        ("@annually", "0 0 1 jan *"),
        ("0 * * * *", "0 0 * * * *"),
    ],
)
def test_equivalent_spellings(expression: str, equivalent: str) -> None:
    until = T0 + timedelta(days=800)
    assert due(expression, T0, until) == due(equivalent, T0, until)


@pytest.mark.parametrize(
    ("minute_field", "minutes"),
    [
        ("*/20", [0, 20, 40]),
        ("10-30/10", [10, 20, 30]),
        ("5/20", [5, 25, 45]),
        ("1-3", [1, 2, 3]),
        ("58,1-2,59/5", [1, 2, 58, 59]),
        ("*/45", [0, 45]),
    ],
)
def test_steps_ranges_and_lists(minute_field: str, minutes: list[int]) -> None:
    times = due(f"{minute_field} * * * *", T0 - timedelta(seconds=1), T0 + timedelta(minutes=59))
    assert [t.minute for t in times] == minutes


@pytest.mark.parametrize(
    ("expression", "month", "days"),
    [
        ("0 0 13 * fri", 1, [2, 9, 13, 16, 23, 30]),  # both restricted: the 13th OR a Friday
        ("0 0 13 * */5", 1, []),  # day-of-week starts with *: the 13th AND a Sunday or Friday
        ("0 0 13 * */5", 2, [13]),
        ("0 0 * * 5", 1, [2, 9, 16, 23, 30]),
        ("0 0 1-3 * *", 1, [1, 2, 3]),
        ("0 0 31 2 mon", 2, [2, 9, 16, 23]),  # never the 31st of February, but every Monday of it
    ],
)
def test_day_of_month_and_day_of_week(expression: str, month: int, days: list[int]) -> None:
    times = due(
        expression, utc(2026, month, 1) - timedelta(seconds=1), utc(2026, month + 1, 1) - timedelta(seconds=1)
    )
    assert [t.day for t in times] == days


def test_rare_dates_are_found() -> None:
    assert Cron.parse("0 0 29 2 *").next_after(utc(2097, 3, 1)) == utc(2104, 2, 29)  # 2100 is no leap year
    assert Cron.parse("0 0 13 * */5").next_after(T0) == utc(2026, 2, 13)  # a Friday the 13th
    with pytest.raises(
        InvalidArgument, match="is not due after 9997-01-01 00:00:01 \\(wall time\\) up to the year 9999"
    ):
        Cron.parse("0 0 29 2 *").next_after(utc(9997, 1, 1))


def test_due_between_bounds_and_limit() -> None:
    minutely = Cron.parse("* * * * *")
    after, until = utc(2026, 1, 1, 0, 0), utc(2026, 1, 1, 0, 5)
    assert minutely.due_between(after, until) == [after + timedelta(minutes=m) for m in range(1, 6)]
    assert minutely.due_between(after, until, limit=2) == [utc(2026, 1, 1, 0, 1), utc(2026, 1, 1, 0, 2)]
    assert minutely.due_between(after, until, limit=0) == []
    assert minutely.due_between(until, after) == []
    assert minutely.due_between(after, after) == []
    assert len(Cron.parse("* * * * * *").due_between(T0, T0 + timedelta(days=1))) == 1000


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.next_after(datetime(2026, 1, 1)),
        lambda c: c.due_between(datetime(2026, 1, 1), T0),
        lambda c: c.due_between(T0, datetime(2026, 1, 2)),
        lambda c: c.due_between(T0, T0, limit=-1),
    ],
)
def test_bad_arguments(call: Callable[[Cron], object]) -> None:
    with pytest.raises(InvalidArgument, match=r"timezone-aware|limit must be 0 or more"):
        call(Cron.parse("* * * * *"))


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("* * *", "expected 5 fields .* got 3"),
        ("* * * * * * *", "expected 5 fields .* got 7"),
        ("", "expected 5 fields .* got 0"),
        ("60 * * * * *", "the second field '60' is out of range 0-59"),
        ("61 * * * *", "the minute field '61' is out of range 0-59"),
        ("0 25 * * *", "the hour field '25' is out of range 0-23"),
        ("0 0 0 * *", "the day-of-month field '0' is out of range 1-31"),
        ("0 0 * 1,13 *", "the month field '13' is out of range 1-12"),
        ("0 0 * * 8", "the day-of-week field '8' is out of range 0-7"),
        ("0 0 * FOO *", r"the month field 'FOO' is not valid; use \*, a number or a name \(JAN-DEC\)"),
        ("0 0 * * MONDAY", r"the day-of-week field 'MONDAY' .* name \(SUN-SAT\)"),
        ("x * * * *", "the minute field 'x' is not valid"),
        ("1,,2 * * * *", "the minute field '' is not valid"),
        ("-1 * * * *", "the minute field '-1' is not valid"),
        ("1-2-3 * * * *", "the minute field '1-2-3' is not valid"),
        ("*/0 * * * *", "the minute field '\\*/0' has step 0; use a step of 1 or more"),
        ("*/ * * * *", "the minute field '\\*/' is not valid"),
        ("5-2 * * * *", "the minute field '5-2' is a reversed range"),
        (
            "0 0 31 2 *",
            "the day-of-month field '31' never occurs in the month field '2', so the schedule would never be due",
        ),
        ("0 0 30,31 feb *", "the day-of-month field '30,31' never occurs in the month field 'feb'"),
        ("0 0 31 4,6,9,11 *", "the day-of-month field '31' never occurs"),
        ("0 0 31 2 */2", "the day-of-month field '31' never occurs"),
        ("@reboot", "unknown macro '@reboot'; use one of @yearly"),
    ],
)
def test_bad_expressions_name_the_field(expression: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=f"^cron: {message}"):
        Cron.parse(expression)


@pytest.mark.parametrize("zone", ["Mars/Base", "", "../etc/passwd", "Europe"])
def test_unknown_time_zone(zone: str) -> None:
    expected = f"timezone: unknown time zone {zone!r}; use an IANA name such as 'Europe/Berlin' or 'UTC'"
    with pytest.raises(InvalidArgument) as raised:
        Cron.parse("* * * * *", timezone=zone)
    assert str(raised.value) == expected
