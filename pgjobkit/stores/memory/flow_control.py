"""Flow control's SQL functions in process: limits (jobkit_set_limit, _delete_limit, _list_limits; a claim
obeys them through pgjobkit.core.fairness) and schedules (jobkit_set_schedule, _delete_schedule,
_list_schedules, _fire_schedule). Their arguments are checked before any call reaches a store (by
pgjobkit.ops.limits, and by pgjobkit.core.schedules' Schedule)."""

from __future__ import annotations

import copy
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

from pgjobkit.core.bounds import MAX_ROWS
from pgjobkit.core.models import JobStatus
from pgjobkit.core.schedules import job_key
from pgjobkit.errors import InvalidArgument, JobNotFound
from pgjobkit.stores.memory.jobs import enqueue_many
from pgjobkit.stores.memory.state import Row, State, Woken


# --- limits ----------------------------------------------------------------------------------------------
def set_limit(
    state: State,
    now: datetime,
    woken: Woken,
    p_type: str,
    p_max_running: int | None,
    p_max_starts: int | None,
    p_per_seconds: float | None,
    p_max_running_per_key: int | None,
) -> list[Row]:
    row = {
        "type": p_type,
        "max_running": p_max_running,
        "max_starts": p_max_starts,
        "per_seconds": p_per_seconds,
        "max_running_per_key": p_max_running_per_key,
        "updated_at": now,
    }
    state.limits[p_type] = row
    return [dict(row)]


def delete_limit(state: State, now: datetime, woken: Woken, p_type: str) -> bool:
    state.starts.pop(p_type, None)
    return state.limits.pop(p_type, None) is not None


def list_limits(state: State, now: datetime, woken: Woken) -> list[Row]:
    out = []
    for type_, lim in sorted(state.limits.items()):
        per = lim["per_seconds"]
        since = now - timedelta(seconds=per) if per is not None else None
        running = sum(j.type == type_ and j.status == JobStatus.RUNNING for j in state.jobs.values())
        started = sum(s > since for s in state.starts.get(type_, [])) if since else 0
        out.append(lim | {"running": running, "started": started})
    return out[:MAX_ROWS]


# --- schedules -------------------------------------------------------------------------------------------
def set_schedule(
    state: State,
    now: datetime,
    woken: Woken,
    p_name: str,
    p_cron: str,
    p_type: str,
    p_payload: dict[str, Any],
    p_timezone: str,
    p_priority: int,
    p_max_attempts: int,
    p_misfire: str,
    p_enabled: bool,
) -> list[Row]:
    old = state.schedules.get(p_name)
    last = now
    if old is not None:
        restart = (old["cron"], old["timezone"]) != (p_cron, p_timezone) or (p_enabled and not old["enabled"])
        last = max(old["last_due_at"], now) if restart else old["last_due_at"]
    row = {
        "name": p_name,
        "cron": p_cron,
        "timezone": p_timezone,
        "type": p_type,
        "payload": p_payload,
        "priority": p_priority,
        "max_attempts": p_max_attempts,
        "misfire": p_misfire,
        "enabled": p_enabled,
        "last_due_at": last,
        "created_at": old["created_at"] if old else now,
        "updated_at": now,
    }
    state.schedules[p_name] = row
    return [dict(row)]


def delete_schedule(state: State, now: datetime, woken: Woken, p_name: str) -> bool:
    return state.schedules.pop(p_name, None) is not None


def list_schedules(state: State, now: datetime, woken: Woken) -> list[Row]:
    return [row | {"db_now": now} for _, row in sorted(state.schedules.items())][:MAX_ROWS]


def fire_schedule(
    state: State, now: datetime, woken: Woken, p_name: str, p_last_due_at: datetime, p_due: list[datetime]
) -> list[Row]:
    row = state.schedules.get(p_name)
    if row is None:
        raise JobNotFound(f"jobkit: no schedule named {p_name!r}")
    if row["last_due_at"] != p_last_due_at or not row["enabled"]:
        return [{"fired": False, "enqueued": 0, "last_due_at": row["last_due_at"]}]
    if p_due[0] <= row["last_due_at"] or p_due[-1] > now or any(b <= a for a, b in pairwise(p_due)):
        raise InvalidArgument(
            "jobkit: p_due must be ascending, after the schedule's last_due_at and not after now()"
        )
    jobs = [
        {
            "type": row["type"],
            "payload": copy.deepcopy(row["payload"]),
            "priority": row["priority"],
            "max_attempts": row["max_attempts"],
            "run_after": due.isoformat(),
            "idempotency_key": job_key(p_name, due),
        }
        for due in p_due
    ]
    enqueued = sum(r["inserted"] for r in enqueue_many(state, now, woken, jobs))
    row["last_due_at"] = p_due[-1]
    row["updated_at"] = now
    return [{"fired": True, "enqueued": enqueued, "last_due_at": p_due[-1]}]
