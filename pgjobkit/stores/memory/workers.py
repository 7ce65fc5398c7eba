"""The workers' and the operators' SQL functions in process: jobkit_worker_beat, _worker_stop,
_list_workers, _activity and _queue_depth, with the SQL's argument checks."""

from __future__ import annotations

import math
import re
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from pgjobkit.core.bounds import (
    ACTIVITY_KEPT,
    DEFAULT_STALE_SECONDS,
    MAX_HOST_LENGTH,
    MAX_ROWS,
    MAX_STALE_SECONDS,
    MAX_TYPE_LENGTH,
    MAX_VERSION_LENGTH,
    MAX_WORKER_LENGTH,
    MAX_WORKER_TYPES,
)
from pgjobkit.core.models import FINISHED, JobStatus
from pgjobkit.core.workers import OUTCOMES
from pgjobkit.errors import InvalidArgument
from pgjobkit.stores.memory.state import Row, State, Woken

_NUMBERS = ("jobs", "run_seconds", "run_max", "wait_seconds", "wait_max")
_ISO = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?(Z|[+-]\d{2}(:?\d{2})?)", re.ASCII)


def _minute(value: Any, now: datetime, where: str) -> datetime:
    minute = datetime.fromisoformat(value)
    if not now - ACTIVITY_KEPT <= minute <= now + timedelta(hours=1):
        raise InvalidArgument(f"jobkit: {where} minute must be within the last day")
    return minute.replace(second=0, microsecond=0)


def _check_activity(activity: Any, now: datetime) -> list[tuple[tuple[datetime, str, str], dict[str, Any]]]:
    if activity is None:
        return []
    if not isinstance(activity, list) or len(activity) > MAX_ROWS:
        raise InvalidArgument(f"jobkit: p_activity must be a JSON array of at most {MAX_ROWS} minutes")
    out = []
    for n, e in enumerate(activity):
        where = f"p_activity[{n}]"
        if not isinstance(e, dict):
            raise InvalidArgument(f"jobkit: {where} must be a JSON object")
        if not isinstance(e.get("minute"), str) or not _ISO.fullmatch(e["minute"]):
            raise InvalidArgument(f"jobkit: {where} minute must be an ISO 8601 timestamp with its offset")
        if not isinstance(e.get("type"), str) or not 1 <= len(e["type"]) <= MAX_TYPE_LENGTH:
            raise InvalidArgument(f"jobkit: {where} type must be 1 to {MAX_TYPE_LENGTH} characters")
        if e.get("outcome") not in OUTCOMES:
            raise InvalidArgument(f"jobkit: {where} outcome must be succeeded, retrying, dead or lost")
        for k in _NUMBERS:
            v = e.get(k)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= 1e15 or math.isnan(v):
                raise InvalidArgument(
                    f"jobkit: {where} jobs, run_seconds, run_max, wait_seconds and wait_max must be numbers "
                    "from 0 to 1e15"
                )
        out.append(((_minute(e["minute"], now, where), e["type"], e["outcome"]), e))
    return out


def check_beat(
    worker: str | None, stale_seconds: float | None, activity: Any, now: datetime
) -> list[tuple[tuple[datetime, str, str], dict[str, Any]]]:
    """A beat's arguments checked as jobkit_worker_beat checks them: its activity's rows, keyed by
    (minute, type, outcome). The JetStream store checks its beats with it too, then drops them."""
    if worker is None or not 1 <= len(worker) <= MAX_WORKER_LENGTH:
        raise InvalidArgument(f"jobkit: p_worker must be 1 to {MAX_WORKER_LENGTH} characters")
    if stale_seconds is None or not 1 <= stale_seconds <= MAX_STALE_SECONDS:
        raise InvalidArgument(f"jobkit: p_stale_seconds must be between 1 and {MAX_STALE_SECONDS}")
    return _check_activity(activity, now)


def worker_beat(
    state: State,
    now: datetime,
    woken: Woken,
    p_worker: str,
    p_host: str | None = None,
    p_pid: int | None = None,
    p_version: str | None = None,
    p_types: tuple[str, ...] = (),
    p_concurrency: int | None = None,
    p_stale_seconds: float = DEFAULT_STALE_SECONDS,
    p_activity: Any = None,
) -> int:
    rows = check_beat(p_worker, p_stale_seconds, p_activity, now)
    old = state.workers.get(p_worker)
    state.workers[p_worker] = {
        "name": p_worker,
        "host": None if p_host is None else p_host[:MAX_HOST_LENGTH],
        "pid": p_pid,
        "version": None if p_version is None else p_version[:MAX_VERSION_LENGTH],
        "types": tuple(p_types or ())[:MAX_WORKER_TYPES],
        "concurrency": p_concurrency,
        "started_at": old["started_at"] if old else now,
        "heartbeat_at": now,
        "stale_after": p_stale_seconds,
    }
    for key, e in rows:
        a = state.activity.setdefault(key, dict.fromkeys(_NUMBERS, 0))
        a["jobs"] += int(e["jobs"])
        a["run_seconds"] += float(e["run_seconds"])
        a["run_max"] = max(a["run_max"], float(e["run_max"]))
        a["wait_seconds"] += float(e["wait_seconds"])
        a["wait_max"] = max(a["wait_max"], float(e["wait_max"]))
    gone = [
        name
        for name, w in state.workers.items()
        if name != p_worker and w["heartbeat_at"] < now - timedelta(seconds=w["stale_after"])
    ]
    for name in gone:
        del state.workers[name]
    for key in [k for k in state.activity if k[0] < now - ACTIVITY_KEPT]:
        del state.activity[key]
    for job_id in [i for i, (_, at) in state.traces.items() if at < now - ACTIVITY_KEPT]:
        job = state.jobs.get(job_id)
        if job is None or job.status in FINISHED:
            del state.traces[job_id]
    return len(gone)


def trace_contexts(state: State, now: datetime, woken: Woken, p_ids: list[UUID]) -> list[Row]:
    if len(p_ids) > MAX_ROWS:
        raise InvalidArgument(f"jobkit: p_ids must be an array of at most {MAX_ROWS} ids")
    return [{"id": i, "trace_context": state.traces[i][0]} for i in dict.fromkeys(p_ids) if i in state.traces]


def worker_stop(state: State, now: datetime, woken: Woken, p_worker: str) -> bool:
    return state.workers.pop(p_worker, None) is not None


def list_workers(state: State, now: datetime, woken: Woken) -> list[Row]:
    holding: dict[str | None, int] = {}
    for j in state.jobs.values():
        if j.status == JobStatus.RUNNING:
            holding[j.claimed_by] = holding.get(j.claimed_by, 0) + 1
    rows = [
        {k: v for k, v in w.items() if k != "stale_after"}
        | {
            "alive": w["heartbeat_at"] >= now - timedelta(seconds=w["stale_after"]),
            "holding": holding.get(w["name"], 0),
        }
        for w in sorted(state.workers.values(), key=lambda w: (w["started_at"], w["name"]))
    ]
    return rows[:MAX_ROWS]


def activity(
    state: State,
    now: datetime,
    woken: Woken,
    p_since: datetime,
    p_after_minute: datetime | None = None,
    p_after_type: str | None = None,
    p_after_outcome: str | None = None,
    p_limit: int = MAX_ROWS,
) -> list[Row]:
    after = (
        (p_after_minute, p_after_type or "", p_after_outcome or "") if p_after_minute is not None else None
    )
    rows = [
        {"minute": k[0], "type": k[1], "outcome": k[2], **a}
        for k, a in sorted(state.activity.items())
        if k[0] >= p_since and (after is None or k > after)
    ]
    return rows[: max(1, min(p_limit or MAX_ROWS, MAX_ROWS))]


def queue_depth(
    state: State,
    now: datetime,
    woken: Woken,
    p_after_type: str | None = None,
    p_after_status: str | None = None,
    p_limit: int = MAX_ROWS,
) -> list[Row]:
    groups: dict[tuple[str, str], tuple[int, datetime | None]] = {}
    for j in state.jobs.values():
        if j.status in (JobStatus.QUEUED, JobStatus.RETRYING):
            since = j.run_after if j.run_after <= now else None
        elif j.status == JobStatus.RUNNING:
            since = j.started_at
        elif j.status == JobStatus.WAITING:
            since = j.created_at
        else:
            continue
        n, oldest = groups.get((j.type, str(j.status)), (0, None))
        if since is not None and (oldest is None or since < oldest):
            oldest = since
        groups[(j.type, str(j.status))] = (n + 1, oldest)
    after = (p_after_type, p_after_status or "") if p_after_type is not None else None
    return [
        {
            "type": t,
            "status": s,
            "jobs": n,
            "oldest_seconds": None if oldest is None else (now - oldest).total_seconds(),
        }
        for (t, s), (n, oldest) in sorted(groups.items())
        if after is None or (t, s) > after
    ][: max(1, min(p_limit or MAX_ROWS, MAX_ROWS))]
