"""Flow control's limit operations, as values: set, delete and list a type's limits."""

from __future__ import annotations

from datetime import timedelta

from pgjobkit.core.bounds import MAX_RATE_WINDOW, MAX_RUNNING, MAX_STARTS, MAX_TYPE_LENGTH
from pgjobkit.core.limits import Limit
from pgjobkit.errors import InvalidArgument
from pgjobkit.ops import Call, Dialect, Op


def set_limit(
    d: Dialect,
    type: str,
    *,
    max_running: int | None = None,
    max_starts: int | None = None,
    per: timedelta | None = None,
    max_running_per_key: int | None = None,
) -> Op[Limit]:
    if not 1 <= len(type) <= MAX_TYPE_LENGTH:
        raise InvalidArgument(f"jobkit: type must be a job type of 1 to {MAX_TYPE_LENGTH} characters")
    if max_running is not None and not 0 <= max_running <= MAX_RUNNING:
        raise InvalidArgument(f"jobkit: max_running must be between 0 (paused) and {MAX_RUNNING}, or None")
    if (max_starts is None) != (per is None):
        raise InvalidArgument(
            "jobkit: give max_starts and per together (a rate: 3000 per minute), or neither"
        )
    if max_starts is not None and not 1 <= max_starts <= MAX_STARTS:
        raise InvalidArgument(f"jobkit: max_starts must be between 1 and {MAX_STARTS}")
    if per is not None and not timedelta(0) < per <= MAX_RATE_WINDOW:
        raise InvalidArgument("jobkit: per must be longer than 0 and at most one day")
    if max_running_per_key is not None and not 1 <= max_running_per_key <= MAX_RUNNING:
        raise InvalidArgument(f"jobkit: max_running_per_key must be between 1 and {MAX_RUNNING}, or None")
    if max_running is None and max_starts is None and max_running_per_key is None:
        raise InvalidArgument("jobkit: give at least one limit; delete_limit removes a type's limits")
    args = {
        "p_type": ("text", type),
        "p_max_running": ("integer", max_running),
        "p_max_starts": ("integer", max_starts),
        "p_per_seconds": ("double precision", per.total_seconds() if per is not None else None),
        "p_max_running_per_key": ("integer", max_running_per_key),
    }
    [row] = yield Call("jobkit_set_limit", args)
    return Limit.from_row(row)


def delete_limit(d: Dialect, type: str) -> Op[bool]:
    return bool((yield Call("jobkit_delete_limit", {"p_type": ("text", type)}, scalar=True)))


def list_limits(d: Dialect) -> Op[list[Limit]]:
    return [Limit.from_row(r) for r in (yield Call("jobkit_list_limits"))]
