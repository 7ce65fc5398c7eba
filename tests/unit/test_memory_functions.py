"""The MemoryStore's table of in-process SQL functions against the migration and the operations, and the
pure fairness rules it runs (pgjobkit.core.fairness): turn numbering and the pick under limits."""

from __future__ import annotations

import itertools
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pgjobkit
from pgjobkit.core import fairness
from pgjobkit.core.models import Job, JobStatus
from pgjobkit.stores.memory import MemoryStore
from pgjobkit.stores.memory.functions import FUNCTIONS

PACKAGE = Path(pgjobkit.__file__).parent
MIGRATIONS = PACKAGE / "sql" / "migrations"

# The migrations' functions only the database runs, and why the MemoryStore needs no version of them.
DATABASE_ONLY = {
    "jobkit_touch": "a trigger function (updated_at on every write)",
    "jobkit_check_jobs": "jobkit_enqueue_many's check of its JSON input, called inside the database",
    "jobkit_fair_round": "jobkit_enqueue_many's turn lookup, called inside it; in process: fairness.base_turn",
    "jobkit_enqueue_many_json": "jobkit_enqueue_many as one JSON value, for SQL and HTTP callers of 0.3",
    "jobkit_enqueue_many_ids_json": "jobkit_enqueue_many's ids as one JSON value, sent where answers are JSON",
    "jobkit_user_enqueue": "a signed-in user's call: needs auth.uid(), through PostgREST (pgjobkit.users)",
    "jobkit_user_cancel": "a signed-in user's call: needs auth.uid(), through PostgREST (pgjobkit.users)",
    "jobkit_user_enqueue_pipeline": "a signed-in user's call: needs auth.uid(), through PostgREST",
    "jobkit_user_cancel_pipeline": "a signed-in user's call: needs auth.uid(), through PostgREST",
    "jobkit_project": "the projector's write of a JetStream queue's jobs into a database's jobkit_jobs",
    "jobkit_outbox_enqueue": "an app's enqueue in SQL for a JetStream queue, which the relay moves there",
    "jobkit_outbox_take": "the relay's read of a database's outbox",
    "jobkit_outbox_done": "the relay's removal of what it moved from a database's outbox",
}


def _migration_functions() -> set[str]:
    """The ``public.jobkit_*`` functions a database holds after every migration, in order."""
    held: set[str] = set()
    for path in sorted(MIGRATIONS.glob("*.sql")):
        for verb, name in re.findall(
            r"\b(create|drop)\s+(?:or\s+replace\s+)?function\s+(?:if\s+exists\s+)?public\.(jobkit_\w+)",
            path.read_text(),
            flags=re.IGNORECASE,
        ):
            if verb.lower() == "create":
                held.add(name)
            else:
                held.discard(name)
    return held


def _called_by_jobkit() -> set[str]:
    """Every SQL function jobkit's operations name in a ``Call``."""
    return {
        name
        for path in PACKAGE.rglob("*.py")
        for name in re.findall(r'\bCall\(\s*"(jobkit_\w+)"', path.read_text())
    }


def test_functions_are_the_migrations_minus_the_database_only_ones() -> None:
    migrations = _migration_functions()
    assert "jobkit_claim" in migrations
    assert FUNCTIONS.keys() == migrations - DATABASE_ONLY.keys()


def test_every_function_the_operations_call_is_there() -> None:
    called = _called_by_jobkit()
    assert "jobkit_claim" in called and called <= _migration_functions()
    # jobkit_enqueue_many_ids_json is sent only through a dialect whose answers are JSON (PostgREST's); the users'
    # pipeline calls only by UserJobs, as a signed-in user; jobkit_project only into a database
    assert not MemoryStore.dialect.json_answers
    assert called - FUNCTIONS.keys() == {
        "jobkit_project",
        "jobkit_outbox_enqueue",
        "jobkit_outbox_take",
        "jobkit_outbox_done",
        "jobkit_enqueue_many_ids_json",
        "jobkit_user_enqueue_pipeline",
        "jobkit_user_cancel_pipeline",
    }


# --- fairness ---------------------------------------------------------------------------------------------
T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


_made = itertools.count()


def _job(type_: str = "embed", key: str | None = None, **fields: Any) -> Job:
    """A queued job, created after the one made before it (claims take them in that order)."""
    defaults: dict[str, Any] = {
        "status": JobStatus.QUEUED,
        "payload": {},
        "attempts": 0,
        "max_attempts": 3,
        "priority": 0,
        "run_after": T0,
        "created_at": T0 + timedelta(microseconds=next(_made)),
        "updated_at": T0,
    }
    return Job(id=uuid.uuid4(), type=type_, fair_key=key, **(defaults | fields))


def test_turns_ask_each_group_once_and_number_a_keys_jobs_in_order() -> None:
    user = uuid.uuid4()
    bases = {("embed", 0, "a"): 5, ("embed", 0, "b"): 2, ("embed", 0, None): 7, ("embed", 1, str(user)): 0}
    asked: list[tuple[str, int, str | None]] = []

    def base(type_: str, priority: int, key: str | None) -> int:
        asked.append((type_, priority, key))
        return bases[(type_, priority, key)]

    new: list[dict[str, Any]] = [
        {"type": "embed", "fair_key": "a"},
        {"type": "embed", "fair_key": "b"},
        {"type": "embed", "fair_key": "a"},
        {"type": "embed"},
        {"type": "embed"},
        {"type": "embed", "priority": 1, "user_id": str(user)},
        {"type": "embed", "fair_key": "a"},
    ]
    assert fairness.turns(new, base) == [5, 2, 6, 7, 7, 0, 7]
    assert asked == list(bases)  # once per (type, priority, key), as each first comes


def test_base_turn_is_the_turn_served_or_after_the_keys_last() -> None:
    waiting = [
        _job(key="a", fair_round=3),
        _job(key="b", fair_round=1),
        _job(key="a", fair_round=9, status=JobStatus.RUNNING),  # not waiting
        _job(key="c", fair_round=0, run_after=T0 + timedelta(hours=1)),  # not runnable yet: not served
    ]
    assert fairness.base_turn(waiting, T0, "embed", 0, "a") == 4
    assert fairness.base_turn(waiting, T0, "embed", 0, "new") == 1
    assert fairness.base_turn(waiting, T0, "embed", 0, None) == 1
    assert fairness.base_turn(waiting, T0, "other", 0, "a") == 0


def _limit(**fields: Any) -> dict[str, Any]:
    return {
        "max_running": None,
        "max_starts": None,
        "per_seconds": None,
        "max_running_per_key": None,
    } | fields


def test_pick_under_max_running_takes_the_rest_of_the_type_in_claim_order() -> None:
    old, new, urgent = _job(created_at=T0 - timedelta(1)), _job(), _job(priority=5)
    mail = _job("mail", created_at=T0 + timedelta(seconds=1))
    picked = fairness.pick(
        types=("embed", "mail"),
        limit=10,
        candidates=[new, mail, old, urgent],
        running=[_job(status=JobStatus.RUNNING)],
        limits={"embed": _limit(max_running=3)},
        starts={},
        now=T0,
    )
    assert picked.jobs == [urgent, old, mail] and picked.starts == {}  # embed: 3 running at most


def test_pick_passes_over_a_key_at_its_cap() -> None:
    a1, b1, a2, b2 = _job(key="a"), _job(key="b"), _job(key="a"), _job(key="b")
    picked = fairness.pick(
        types=("embed",),
        limit=10,
        candidates=[a1, b1, a2, b2],
        running=[_job(key="a", status=JobStatus.RUNNING)],
        limits={"embed": _limit(max_running_per_key=1)},
        starts={},
        now=T0,
    )
    assert picked.jobs == [b1]


def test_pick_counts_the_window_and_logs_its_starts_without_changing_its_inputs() -> None:
    before, inside = T0 - timedelta(seconds=90), T0 - timedelta(seconds=30)
    starts = {"embed": [before, inside]}
    limits = {"embed": _limit(max_starts=3, per_seconds=60)}
    jobs = [_job(), _job(), _job()]
    picked = fairness.pick(
        types=("embed",), limit=10, candidates=jobs, running=[], limits=limits, starts=starts, now=T0
    )
    assert picked.jobs == jobs[:2] and picked.rated == {"embed"}
    assert picked.starts == {"embed": [inside, T0, T0]}
    assert starts == {"embed": [before, inside]} and limits == {"embed": _limit(max_starts=3, per_seconds=60)}
