"""Fair turns and the pick under limits, as pure functions: the rules the schema's jobkit_fair_round,
jobkit_enqueue_many (its turn numbering) and jobkit_claim (its pick under jobkit_limits and jobkit_starts)
define, for the MemoryStore to run in process. ``now`` is always a parameter; nothing passed in is changed in
place, and tests/contract/ proves the two agree.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pgjobkit.core.bounds import PASS_BUDGET
from pgjobkit.core.models import RUNNABLE, Job
from pgjobkit.core.transitions import claim_order

Group = tuple[str, int, str | None]  # (type, priority, fairness key): the jobs that share turns


def fair_key(new: Mapping[str, Any]) -> str | None:
    """A new job's fairness key: its fair_key, else its user id."""
    key = new.get("fair_key")
    if key is None and new.get("user_id") is not None:
        key = str(new["user_id"])
    return key


def group(new: Mapping[str, Any]) -> Group:
    """The jobs a new job shares turns with: its type, priority and fairness key."""
    return (new["type"], new.get("priority") or 0, fair_key(new))


# --- turns ----------------------------------------------------------------------------------------------
def base_turn(jobs: Iterable[Job], now: datetime, type_: str, priority: int, key: str | None) -> int:
    """The turn a new job of (``type_``, ``priority``, ``key``) takes, as jobkit_fair_round gives it among
    ``jobs`` (those not waiting are passed over): the turn being served (the lowest among runnable jobs of
    the type and priority), or the turn after its key's last waiting job when that is later."""
    waiting = [j for j in jobs if j.type == type_ and j.status in RUNNABLE]
    serving = min((j.fair_round for j in waiting if j.priority == priority and j.run_after <= now), default=0)
    last = max((j.fair_round + 1 for j in waiting if key is not None and j.fair_key == key), default=0)
    return max(serving, last)


def turns(jobs: Iterable[Mapping[str, Any]], base: Callable[[str, int, str | None], int]) -> list[int]:
    """Each new job's turn, as jobkit_enqueue_many numbers them: ``base`` (a group's base turn, e.g.
    ``base_turn`` over the jobs held) is asked once per (type, priority, key), then a key's jobs take
    consecutive turns in input order; jobs without a key all take the base turn."""
    bases: dict[Group, int] = {}
    nth: dict[Group, int] = {}
    out = []
    for new in jobs:
        shared = group(new)
        if shared not in bases:
            bases[shared] = base(*shared)
        out.append(bases[shared] + (nth.get(shared, 0) if shared[2] is not None else 0))
        nth[shared] = nth.get(shared, 0) + 1
    return out


# --- the pick under limits ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Picked:
    """What a claim takes: ``jobs`` in claim order, and ``starts``, the start log of each rate-limited type
    it asked for after the claim (the starts still in the window, then one ``now`` per job picked), to
    replace the store's."""

    jobs: list[Job]
    starts: dict[str, list[datetime]]

    @property
    def rated(self) -> frozenset[str]:
        """The types whose starts are logged."""
        return frozenset(self.starts)


@dataclass
class _Allowance:
    """What the limits let one claim take, per type: built by ``_allow``, used up by ``pick``."""

    open: set[str]  # the types the claim may still take
    left: dict[str, int]  # how many more a limited type may start
    key_cap: dict[str, int]  # max_running_per_key, by type
    key_count: dict[tuple[str, str], int]  # running jobs by (type, key), of a type with a key cap
    window: dict[str, list[datetime]]  # the starts within each rated type's window


def _allow(
    types: Collection[str],
    limit: int,
    running: Sequence[Job],
    limits: Mapping[str, Mapping[str, Any]],
    starts: Mapping[str, Sequence[datetime]],
    now: datetime,
) -> _Allowance:
    allowance = _Allowance(set(types), {}, {}, {}, {})
    for type_ in sorted(allowance.open & limits.keys()):
        lim = limits[type_]
        allow = limit
        if lim["max_running"] is not None:
            allow = min(allow, lim["max_running"] - sum(j.type == type_ for j in running))
        if lim["max_starts"] is not None:
            since = now - timedelta(seconds=lim["per_seconds"])
            allowance.window[type_] = [s for s in starts.get(type_, ()) if s > since]
            allow = min(allow, lim["max_starts"] - len(allowance.window[type_]))
        if allow < 1:
            allowance.open.discard(type_)
            continue
        allowance.left[type_] = allow
        if lim["max_running_per_key"] is not None:
            allowance.key_cap[type_] = lim["max_running_per_key"]
            for j in running:
                if j.type == type_ and j.fair_key is not None:
                    count = allowance.key_count.get((type_, j.fair_key), 0)
                    allowance.key_count[(type_, j.fair_key)] = count + 1
    return allowance


def pick(
    *,
    types: Collection[str],
    limit: int,
    candidates: Iterable[Job],
    running: Iterable[Job],
    limits: Mapping[str, Mapping[str, Any]],
    starts: Mapping[str, Sequence[datetime]],
    now: datetime,
    after: Job | None = None,
) -> Picked:
    """The jobs a claim of ``limit`` of ``types`` takes from the runnable ``candidates`` (any order, any
    type), as jobkit_claim picks them: in claim order, each type within its limits row (max_running against
    the ``running`` jobs, max_starts against its ``starts`` since ``now - per_seconds``), a key at its
    max_running_per_key passed over, at most PASS_BUDGET of those. With ``after`` (the caller's last claimed
    job) and no limited type open, the jobs from its place on within its priority come first (jobkit_claim's
    p_after)."""
    allowance = _allow(types, limit, list(running), limits, starts, now)
    open_, left, key_cap, key_count = allowance.open, allowance.left, allowance.key_cap, allowance.key_count
    picked: list[Job] = []
    passed = 0
    order = sorted((j for j in candidates if j.type in open_), key=claim_order)
    if after is not None and not left:
        mark = claim_order(after)
        band = [j for j in order if j.priority == after.priority and claim_order(j) >= mark]
        banded = {j.id for j in band}
        order = band + [j for j in order if j.id not in banded]
    for job in order:
        if len(picked) == limit or passed >= PASS_BUDGET:
            break
        if job.type not in open_:
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
                open_.discard(job.type)
    for job in picked:
        if job.type in allowance.window:
            allowance.window[job.type].append(now)
    return Picked(sorted(picked, key=claim_order), allowance.window)
