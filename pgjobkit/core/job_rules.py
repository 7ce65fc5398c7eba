"""The rules every job to enqueue must meet, as one table (``RULES``): what ``jobkit_check_jobs``
(``sql/schema/20_enqueue.sql``) checks of each of jobkit_enqueue_many's objects, in its order, with its words
and an object that breaks each rule. The SQL is the rule; this table follows it, for the MemoryStore to check
in process (``job_problem``), and tests/contract/test_job_rules.py sends every bad example to every store."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pgjobkit.core.bounds import (
    MAX_ATTEMPTS_LIMIT,
    MAX_DELAY_SECONDS,
    MAX_KEY_LENGTH,
    MAX_PAYLOAD_BYTES,
    MAX_PRIORITY,
    MAX_TRACE_CONTEXT_BYTES,
    MAX_TYPE_LENGTH,
    RUN_AFTER_RANGE,
)

JOB_KEYS = (
    "type",
    "payload",
    "idempotency_key",
    "priority",
    "max_attempts",
    "user_id",
    "run_after",
    "delay_seconds",
    "fair_key",
    "trace_context",
)
UUID_TEXT = re.compile(r"[0-9a-f]{8}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{4}-?[0-9a-f]{12}", re.IGNORECASE)
_CONTROL = re.compile(r"[\x01-\x1f\x7f-\x9f]")  # the SQL's ranges (C0, DEL, C1); text holds no NUL


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule: ``met`` by an object that keeps it (given every rule before it holds), what the SQL says
    of one that does not (``message``), and objects that break it and keep every rule before it (``bad``)."""

    met: Callable[[Any], bool]
    message: str
    bad: tuple[Any, ...]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _whole(value: float, low: int, high: int) -> bool:
    return low <= value <= high and value == int(value)


def _text(value: Any) -> bool:
    """A string of 1 to MAX_KEY_LENGTH characters."""
    return isinstance(value, str) and 1 <= len(value) <= MAX_KEY_LENGTH


def _json_bytes(value: Any) -> int:
    """The bytes PostgreSQL prints for ``value`` as jsonb (a space after each , and :, text as UTF-8)."""
    return len(json.dumps(value, ensure_ascii=False).encode())


def _instant(value: str) -> datetime | None:
    """An ISO 8601 time with its offset, or None."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def _readable(value: str) -> bool:
    """A time every client can read (the SQL check jobkit_run_after_between_1970_and_9999)."""
    instant = _instant(value)
    return instant is not None and RUN_AFTER_RANGE[0] <= instant < RUN_AFTER_RANGE[1]


def _trace_context(value: Any) -> bool:
    """A JSON object of strings of at most MAX_TRACE_CONTEXT_BYTES (the domain jobkit_trace_context)."""
    return (
        isinstance(value, dict)
        and all(isinstance(v, str) for v in value.values())
        and _json_bytes(value) <= MAX_TRACE_CONTEXT_BYTES
    )


def _field(name: str, test: Callable[[Any], object]) -> Callable[[dict[str, Any]], bool]:
    """A rule on one optional field: met when it is absent or null, or passes ``test``."""
    return lambda e: e.get(name) is None or bool(test(e[name]))


_T = {"type": "embed"}  # what the bad examples add their one broken field to


def _key_rules(name: str) -> tuple[Rule, Rule]:
    """The two rules of an optional key field (``idempotency_key``, ``fair_key``): text, 1 to MAX_KEY_LENGTH."""
    return (
        Rule(
            _field(name, lambda v: isinstance(v, str)), f"{name} must be a string or null", (_T | {name: 5},)
        ),
        Rule(
            _field(name, _text),
            f"{name} must be 1 to {MAX_KEY_LENGTH} characters",
            (_T | {name: ""}, _T | {name: "k" * (MAX_KEY_LENGTH + 1)}),
        ),
    )


_LATER = "2030-01-01T00:00:00+00:00"

# jobkit_check_jobs' rules, in its order (the first broken one is reported).
RULES: tuple[Rule, ...] = (
    Rule(lambda e: isinstance(e, dict), "must be a JSON object", ("embed", ["embed"], None)),
    Rule(
        lambda e: not e.keys() - set(JOB_KEYS),
        "has an unknown key; allowed: " + ", ".join(JOB_KEYS),
        (_T | {"queue": "q"}, _T | {"waiting": True}),
    ),
    Rule(
        lambda e: isinstance(e.get("type"), str),
        "type is required and must be a string",
        ({"payload": {}}, {"type": 7}, {"type": None}),
    ),
    Rule(
        lambda e: 1 <= len(e["type"]) <= MAX_TYPE_LENGTH,
        f"type must be 1 to {MAX_TYPE_LENGTH} characters",
        ({"type": ""}, {"type": "t" * (MAX_TYPE_LENGTH + 1)}),
    ),
    Rule(
        lambda e: not _CONTROL.search(e["type"]),
        "type must not contain control characters",
        ({"type": "a\x01b"}, {"type": "a\x7f"}, {"type": "\x9f"}),
    ),
    Rule(
        _field("payload", lambda v: isinstance(v, dict)),
        "payload must be a JSON object",
        (_T | {"payload": [1]}, _T | {"payload": "x"}),
    ),
    *_key_rules("idempotency_key"),
    Rule(_field("priority", _number), "priority must be an integer", (_T | {"priority": "1"},)),
    Rule(
        _field("priority", lambda v: _whole(v, -MAX_PRIORITY, MAX_PRIORITY)),
        f"priority must be an integer between -{MAX_PRIORITY} and {MAX_PRIORITY}",
        (_T | {"priority": MAX_PRIORITY + 1}, _T | {"priority": -MAX_PRIORITY - 1}, _T | {"priority": 1.5}),
    ),
    Rule(_field("max_attempts", _number), "max_attempts must be an integer", (_T | {"max_attempts": True},)),
    Rule(
        _field("max_attempts", lambda v: _whole(v, 1, MAX_ATTEMPTS_LIMIT)),
        f"max_attempts must be an integer between 1 and {MAX_ATTEMPTS_LIMIT}",
        (_T | {"max_attempts": 0}, _T | {"max_attempts": MAX_ATTEMPTS_LIMIT + 1}, _T | {"max_attempts": 2.5}),
    ),
    Rule(
        _field("user_id", lambda v: isinstance(v, str)),
        "user_id must be a uuid string or null",
        (_T | {"user_id": 5},),
    ),
    Rule(_field("user_id", UUID_TEXT.fullmatch), "user_id must be a uuid", (_T | {"user_id": "nobody"},)),
    Rule(
        _field("run_after", lambda v: isinstance(v, str) and _instant(v)),
        "run_after must be an ISO 8601 timestamp string",
        (_T | {"run_after": 5}, _T | {"run_after": {}}),
    ),
    Rule(
        _field("run_after", _readable),
        "run_after must be from 1970 to the end of 9998 (a time every client can read)",
        (_T | {"run_after": "1969-12-31T23:59:59+00:00"}, _T | {"run_after": "9999-01-01T00:00:00+00:00"}),
    ),
    Rule(_field("delay_seconds", _number), "delay_seconds must be a number", (_T | {"delay_seconds": "5"},)),
    Rule(
        _field("delay_seconds", lambda v: 0 <= v <= MAX_DELAY_SECONDS),
        f"delay_seconds must be between 0 and {MAX_DELAY_SECONDS} (ten years)",
        (_T | {"delay_seconds": -1}, _T | {"delay_seconds": MAX_DELAY_SECONDS + 1}),
    ),
    Rule(
        lambda e: e.get("run_after") is None or e.get("delay_seconds") is None,
        "give run_after or delay_seconds, not both",
        (_T | {"run_after": _LATER, "delay_seconds": 5},),
    ),
    Rule(
        lambda e: _json_bytes(e.get("payload")) <= MAX_PAYLOAD_BYTES,
        "payload must be at most 1 MiB as JSON text",
        (_T | {"payload": {"x": "p" * MAX_PAYLOAD_BYTES}},),
    ),
    *_key_rules("fair_key"),
    Rule(
        _field("trace_context", _trace_context),
        "trace_context must be a JSON object of strings, at most 1 KiB (a W3C traceparent and tracestate)",
        (
            _T | {"trace_context": "00-abc"},
            _T | {"trace_context": [1]},
            _T | {"trace_context": {"traceparent": 5}},
            _T | {"trace_context": {"tracestate": "t" * MAX_TRACE_CONTEXT_BYTES}},
        ),
    ),
)


def job_problem(e: Any) -> str | None:
    """What jobkit_check_jobs finds wrong with one of jobkit_enqueue_many's objects, or None."""
    return next((rule.message for rule in RULES if not rule.met(e)), None)
