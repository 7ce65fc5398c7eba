"""The MemoryStore's in-process flow control, as the migration defines it: fairness turns
(jobkit_fair_round), the limits a claim obeys (jobkit_claim with jobkit_limits and jobkit_starts), and
schedules (jobkit_schedule_*). A base class of MemoryStore, which holds the state and the lock these run
under; the argument checks are jobkit.flow's, made before any call reaches a store."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any
from uuid import UUID

from jobkit.core import transitions
from jobkit.core.models import RUNNABLE, Job, JobStatus
from jobkit.errors import InvalidArgument, JobNotFound
from jobkit.ops import MAX_ROWS

Row = dict[str, Any]
PASS_BUDGET = 1000  # rows of keys at their cap one claim passes over, as in jobkit_claim


def schedule_key(name: str, due: datetime) -> str:
    """The idempotency key of a schedule's job for one due time (jobkit_fire_schedule's)."""
    return f"jobkit:schedule:{name}:{due.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%S.%fZ')}"


class FlowFunctions:
    """Fair turns, limits, and jobkit_limit_* / jobkit_schedule_*, over ``_jobs``."""

    _jobs: dict[UUID, Job]
    _limits: dict[str, Row]
    _starts: dict[str, list[datetime]]
    _schedules: dict[str, Row]

    def _enqueue_many(self, now: datetime, woken: list[Callable[[], None]], p_jobs: list[Any]) -> list[Row]:
        raise NotImplementedError

    # --- fairness ------------------------------------------------------------------------------------
    def fair_rounds(self, now: datetime, jobs: Iterable[Mapping[str, Any]]) -> list[int]:
        """Each new job's turn, as jobkit_enqueue_many assigns them: looked up once per (type, priority,
        key), then consecutive for a key's jobs in input order."""
        base: dict[tuple[str, int, str | None], int] = {}
        nth: dict[tuple[str, int, str | None], int] = {}
        out = []
        for new in jobs:
            group = (new["type"], new.get("priority") or 0, fair_key(new))
            if group not in base:
                base[group] = self._fair_round(now, *group)
            out.append(base[group] + (nth.get(group, 0) if group[2] is not None else 0))
            nth[group] = nth.get(group, 0) + 1
        return out

    def _fair_round(self, now: datetime, type_: str, priority: int, key: str | None) -> int:
        waiting = [j for j in self._jobs.values() if j.type == type_ and j.status in RUNNABLE]
        serving = min(
            (j.fair_round for j in waiting if j.priority == priority and j.run_after <= now), default=0
        )
        last = max((j.fair_round + 1 for j in waiting if key is not None and j.fair_key == key), default=0)
        return max(serving, last)

    # --- limits in a claim -----------------------------------------------------------------------------
    def _pick(self, now: datetime, types: tuple[str, ...], limit: int) -> tuple[list[Job], set[str]]:
        """The jobs a claim of ``limit`` takes under the limits, and the types whose starts it logs."""
        allowed = set(types)
        left: dict[str, int] = {}
        key_cap: dict[str, int] = {}
        key_count: dict[tuple[str, str], int] = {}
        rated: set[str] = set()
        running = [j for j in self._jobs.values() if j.status == JobStatus.RUNNING]
        for type_ in sorted(allowed & self._limits.keys()):
            lim = self._limits[type_]
            allow = limit
            if lim["max_running"] is not None:
                allow = min(allow, lim["max_running"] - sum(j.type == type_ for j in running))
            if lim["max_starts"] is not None:
                since = now - timedelta(seconds=lim["per_seconds"])
                self._starts[type_] = [s for s in self._starts.get(type_, []) if s > since]
                allow = min(allow, lim["max_starts"] - len(self._starts[type_]))
                rated.add(type_)
            if allow < 1:
                allowed.discard(type_)
                continue
            left[type_] = allow
            if lim["max_running_per_key"] is not None:
                key_cap[type_] = lim["max_running_per_key"]
                for j in running:
                    if j.type == type_ and j.fair_key is not None:
                        key_count[(type_, j.fair_key)] = key_count.get((type_, j.fair_key), 0) + 1
        candidates = sorted(
            (j for j in self._jobs.values() if j.type in allowed and transitions.is_runnable(j, now)),
            key=transitions.claim_order,
        )
        picked: list[Job] = []
        passed = 0
        for job in candidates:
            if len(picked) == limit or passed >= PASS_BUDGET:
                break
            if job.type not in allowed:
                continue
            if job.type in key_cap and job.fair_key is not None:
                held = key_count.get((job.type, job.fair_key), 0)
                if held >= key_cap[job.type]:
                    passed += 1
                    continue
                key_count[(job.type, job.fair_key)] = held + 1
            picked.append(job)
            if job.type in left:
                left[job.type] -= 1
                if left[job.type] == 0:
                    allowed.discard(job.type)
        return picked, rated

    def _log_starts(self, now: datetime, rated: set[str], claimed: list[Job]) -> None:
        for job in claimed:
            if job.type in rated:
                self._starts.setdefault(job.type, []).append(now)

    # --- jobkit_limit_* -----------------------------------------------------------------------------------
    def _set_limit(
        self,
        now: datetime,
        woken: list[Callable[[], None]],
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
        self._limits[p_type] = row
        return [dict(row)]

    def _delete_limit(self, now: datetime, woken: list[Callable[[], None]], p_type: str) -> bool:
        self._starts.pop(p_type, None)
        return self._limits.pop(p_type, None) is not None

    def _list_limits(self, now: datetime, woken: list[Callable[[], None]]) -> list[Row]:
        out = []
        for type_, lim in sorted(self._limits.items()):
            per = lim["per_seconds"]
            since = now - timedelta(seconds=per) if per is not None else None
            out.append(
                lim
                | {
                    "running": sum(
                        j.type == type_ and j.status == JobStatus.RUNNING for j in self._jobs.values()
                    ),
                    "started": sum(s > since for s in self._starts.get(type_, [])) if since else 0,
                }
            )
        return out[:MAX_ROWS]

    # --- jobkit_schedule_* ---------------------------------------------------------------------------------
    def _set_schedule(
        self,
        now: datetime,
        woken: list[Callable[[], None]],
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
        old = self._schedules.get(p_name)
        last = now
        if old is not None:
            restart = (old["cron"], old["timezone"]) != (p_cron, p_timezone) or (
                p_enabled and not old["enabled"]
            )
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
        self._schedules[p_name] = row
        return [dict(row)]

    def _delete_schedule(self, now: datetime, woken: list[Callable[[], None]], p_name: str) -> bool:
        return self._schedules.pop(p_name, None) is not None

    def _list_schedules(self, now: datetime, woken: list[Callable[[], None]]) -> list[Row]:
        return [row | {"db_now": now} for _, row in sorted(self._schedules.items())][:MAX_ROWS]

    def _fire_schedule(
        self,
        now: datetime,
        woken: list[Callable[[], None]],
        p_name: str,
        p_last_due_at: datetime,
        p_due: list[datetime],
    ) -> list[Row]:
        row = self._schedules.get(p_name)
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
                "run_after": due,
                "idempotency_key": schedule_key(p_name, due),
            }
            for due in p_due
        ]
        enqueued = sum(r["inserted"] for r in self._enqueue_many(now, woken, jobs))
        row["last_due_at"] = p_due[-1]
        row["updated_at"] = now
        return [{"fired": True, "enqueued": enqueued, "last_due_at": p_due[-1]}]


def fair_key(new: Mapping[str, Any]) -> str | None:
    """A new job's fairness key: its fair_key, else its user id."""
    key = new.get("fair_key")
    if key is None and new.get("user_id") is not None:
        key = str(new["user_id"])
    return key
