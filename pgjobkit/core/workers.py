"""What an operator reads about the queue and its workers (``QueueDepth``, ``WorkerInfo``, ``ActivityRow``),
and ``Activity``: a worker's attempts tallied by the minute until its next beat writes them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pgjobkit.core.bounds import MAX_ROWS
from pgjobkit.core.models import Answer, JobStatus

OUTCOMES = ("succeeded", "retrying", "dead", "lost")  # how an attempt ended (pgjobkit.worker.results)


class QueueDepth(Answer):
    """Unfinished jobs of one type in one status (queued, retrying, running, waiting), and the age in
    seconds of the oldest: runnable ones by run_after (None when none is runnable yet), running ones by
    when they started, waiting ones by when they were enqueued."""

    type: str
    status: JobStatus
    jobs: int
    oldest_seconds: float | None = None


class WorkerInfo(Answer):
    """A worker as its beats keep it: alive while it beats within ``stale_after`` seconds; ``holding``
    counts its running jobs now."""

    name: str
    host: str | None = None
    pid: int | None = None
    version: str | None = None
    types: tuple[str, ...] = ()
    concurrency: int | None = None
    started_at: datetime
    heartbeat_at: datetime
    alive: bool
    holding: int = 0


class ActivityRow(Answer):
    """Attempts of one type that ended one way within one minute, across every worker: how many, and their
    run times and queue waits (sums and maxima, in seconds)."""

    minute: datetime
    type: str
    outcome: str
    jobs: int
    run_seconds: float
    run_max: float
    wait_seconds: float
    wait_max: float


@dataclass
class _Tally:
    jobs: int = 0
    run_seconds: float = 0.0
    run_max: float = 0.0
    wait_seconds: float = 0.0
    wait_max: float = 0.0


class Activity:
    """A worker's ended attempts by (minute, type, outcome), since the last ``take()``: what its next beat
    adds to jobkit_activity. Bounded: past ``limit`` distinct keys the oldest minute's are dropped
    (a beat carries at most 1000)."""

    def __init__(self, limit: int = MAX_ROWS) -> None:
        self.limit = limit
        self._tallies: dict[tuple[int, str, str], _Tally] = {}  # by (minute since the epoch, type, outcome)

    def add(self, now: float, type: str, outcome: str, run: float, wait: float) -> None:
        """One attempt of ``type`` ended ``outcome`` at ``now`` (seconds since the epoch), after running
        ``run`` seconds and waiting ``wait``."""
        key = (int(now // 60), type, outcome)
        tally = self._tallies.get(key)
        if tally is None:
            if len(self._tallies) >= self.limit:
                del self._tallies[min(self._tallies)]
            tally = self._tallies[key] = _Tally()
        run, wait = max(run, 0.0), max(wait, 0.0)
        tally.jobs += 1
        tally.run_seconds += run
        tally.run_max = max(tally.run_max, run)
        tally.wait_seconds += wait
        tally.wait_max = max(tally.wait_max, wait)

    def __bool__(self) -> bool:
        return bool(self._tallies)

    def take(self) -> list[dict[str, Any]]:
        """The tallies as jobkit_worker_beat's p_activity, oldest first; empties them."""
        taken, self._tallies = self._tallies, {}
        return [
            {
                "minute": datetime.fromtimestamp(minute * 60, UTC).isoformat(),
                "type": type,
                "outcome": outcome,
                "jobs": t.jobs,
                "run_seconds": t.run_seconds,
                "run_max": t.run_max,
                "wait_seconds": t.wait_seconds,
                "wait_max": t.wait_max,
            }
            for (minute, type, outcome), t in sorted(taken.items())
        ]

    def give_back(self, taken: list[dict[str, Any]]) -> None:
        """Tallies a beat could not write, to go with the next one (added to what came meanwhile)."""
        for row in taken:
            minute = int(datetime.fromisoformat(row["minute"]).timestamp() // 60)
            key = (minute, row["type"], row["outcome"])
            tally = self._tallies.setdefault(key, _Tally())
            tally.jobs += row["jobs"]
            tally.run_seconds += row["run_seconds"]
            tally.run_max = max(tally.run_max, row["run_max"])
            tally.wait_seconds += row["wait_seconds"]
            tally.wait_max = max(tally.wait_max, row["wait_max"])
        while len(self._tallies) > self.limit:
            del self._tallies[min(self._tallies)]
