"""Between the store and the pages, both ways: what a page shows, shaped from what a store answers, and
what a form sends, read into a store's arguments (InvalidArgument naming the field, as the store does).
Pure functions of their arguments (the time included), no I/O."""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast, get_args
from urllib.parse import parse_qsl
from uuid import UUID

from pgjobkit.core.bounds import DEFAULT_MAX_ATTEMPTS
from pgjobkit.core.models import Job, JobStatus, Stats
from pgjobkit.core.pipelines import PipelineJob
from pgjobkit.core.schedules import Misfire, Schedule
from pgjobkit.core.workers import OUTCOMES, ActivityRow, QueueDepth
from pgjobkit.errors import InvalidArgument

# the order a job moves through, for the columns of the overview
STATUS_ORDER = (
    JobStatus.WAITING,
    JobStatus.QUEUED,
    JobStatus.RUNNING,
    JobStatus.RETRYING,
    JobStatus.SUCCEEDED,
    JobStatus.DEAD,
    JobStatus.CANCELLED,
)
ERROR_KEY_LENGTH = 200
MAX_NESTING = 24  # a pipeline tree's deeper jobs are drawn at this depth, with their own depth said


HIDDEN_JOB_FIELDS = frozenset({"lease_token"})  # never shown: it fences a worker's claim
OWN_SECTION_FIELDS = ("error", "payload", "result")  # shown under their own headings


def job_fields(job: Job) -> list[tuple[str, object]]:
    """The job's fields for its page, in the model's order: all but ``lease_token`` and those with a
    section of their own."""
    skip = HIDDEN_JOB_FIELDS | set(OWN_SECTION_FIELDS)
    return [(name, getattr(job, name)) for name in type(job).model_fields if name not in skip]


# --- the overview ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Cell:
    """Jobs of one type in one status, and the age in seconds of the oldest (unfinished ones only)."""

    status: JobStatus
    count: int
    oldest_seconds: float | None = None


@dataclass(frozen=True)
class TypeRow:
    """One type's jobs, a cell per status in ``STATUS_ORDER``."""

    type: str
    cells: tuple[Cell, ...]

    @property
    def total(self) -> int:
        return sum(c.count for c in self.cells)


def count_table(stats: Stats, depth: Sequence[QueueDepth]) -> list[TypeRow]:
    """Jobs by type (sorted) and status, from ``stats`` (every status), with the oldest's age from
    ``depth`` (unfinished statuses)."""
    counts = {(r.type, r.status): r.count for r in stats.rows}
    ages = {(d.type, d.status): d.oldest_seconds for d in depth}
    types = sorted({t for t, _ in counts})
    return [
        TypeRow(t, tuple(Cell(s, counts.get((t, s), 0), ages.get((t, s))) for s in STATUS_ORDER))
        for t in types
    ]


@dataclass(frozen=True)
class Minute:
    """What ended within one minute, across types: attempts by outcome, and their queue waits and run
    times (mean and max, in seconds; None when none ended)."""

    start: datetime
    ended: dict[str, int]
    wait_mean: float | None = None
    wait_max: float | None = None
    run_mean: float | None = None
    run_max: float | None = None

    @property
    def jobs(self) -> int:
        return sum(self.ended.values())


def minutes(rows: Iterable[ActivityRow], now: datetime, count: int = 60) -> list[Minute]:
    """The last ``count`` minutes up to ``now``'s (oldest first), each with what ``rows`` say of it; rows
    outside them are left out."""
    last = now.astimezone(UTC).replace(second=0, microsecond=0)
    first = last - timedelta(minutes=count - 1)
    ended: dict[datetime, dict[str, int]] = defaultdict(lambda: dict.fromkeys(OUTCOMES, 0))
    sums: dict[datetime, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])  # wait sum/max, run sum/max
    for r in rows:
        minute = r.minute.astimezone(UTC).replace(second=0, microsecond=0)
        if not first <= minute <= last or r.jobs <= 0:
            continue
        ended[minute][r.outcome] = ended[minute].get(r.outcome, 0) + r.jobs
        s = sums[minute]
        s[0] += r.wait_seconds
        s[1] = max(s[1], r.wait_max)
        s[2] += r.run_seconds
        s[3] = max(s[3], r.run_max)
    out = []
    for i in range(count):
        start = first + timedelta(minutes=i)
        if start not in ended:
            out.append(Minute(start, dict.fromkeys(OUTCOMES, 0)))
            continue
        n = sum(ended[start].values())
        s = sums[start]
        out.append(Minute(start, ended[start], s[0] / n, s[1], s[2] / n, s[3]))
    return out


# --- failing jobs ------------------------------------------------------------------------------------------
def error_key(error: str | None) -> str:
    """What groups failing jobs: the error's first line, trimmed, at most 200 characters."""
    first = (error or "").strip().split("\n", 1)[0].strip()
    return first[:ERROR_KEY_LENGTH] or "(no message)"


@dataclass(frozen=True)
class ErrorGroup:
    """Failing jobs that share an error's first line, newest first."""

    key: str
    jobs: tuple[Job, ...]

    @property
    def types(self) -> list[str]:
        return sorted({j.type for j in self.jobs})

    @property
    def newest(self) -> datetime:
        return self.jobs[0].updated_at

    @property
    def oldest(self) -> datetime:
        return self.jobs[-1].updated_at

    @property
    def dead_ids(self) -> list[UUID]:
        return [j.id for j in self.jobs if j.status == JobStatus.DEAD]

    @property
    def retrying_ids(self) -> list[UUID]:
        return [j.id for j in self.jobs if j.status == JobStatus.RETRYING]


def group_by_error(jobs: Iterable[Job]) -> list[ErrorGroup]:
    """``jobs`` grouped by ``error_key``: the largest group first, then the most recent."""
    by_key: dict[str, list[Job]] = defaultdict(list)
    for job in jobs:
        by_key[error_key(job.error)].append(job)
    groups = [
        ErrorGroup(key, tuple(sorted(js, key=lambda j: (j.updated_at, str(j.id)), reverse=True)))
        for key, js in by_key.items()
    ]
    return sorted(groups, key=lambda g: (-len(g.jobs), -g.newest.timestamp(), g.key))


# --- pipelines ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TreeRow:
    """One job of a pipeline tree, in the order the tree is read: how deep it is, how deep it is drawn
    (at most ``MAX_NESTING``), whether it opens a list under the row before, and how many lists close
    before it."""

    job: PipelineJob
    depth: int
    level: int
    opens: bool = False
    closes: int = 0
    children: int = field(default=0, compare=False)


def pipeline_tree(jobs: Sequence[PipelineJob]) -> tuple[list[TreeRow], int]:
    """The pipeline's jobs as a tree, read top to bottom: a job sits under the job that added it, else
    under the first job it waits for, else at the top (in the order they were added). Also the number
    of lists left open after the last row. No recursion: any depth is drawn."""
    ids = {j.id for j in jobs}
    under: dict[UUID | None, list[PipelineJob]] = defaultdict(list)
    for j in sorted(jobs, key=lambda j: j.seq):
        above = j.parent_id if j.parent_id in ids else next((d for d in j.depends_on if d in ids), None)
        under[above if above != j.id else None].append(j)
    rows: list[TreeRow] = []
    seen: set[UUID] = set()
    # then any job not reached from the top (only a cycle would hide one), so that every job is shown
    tops = under[None] + sorted(jobs, key=lambda j: j.seq)
    for top in tops:
        stack: list[tuple[PipelineJob, int]] = [(top, 0)]
        while stack:
            job, depth = stack.pop()
            if job.id in seen:
                continue
            seen.add(job.id)
            level = min(depth, MAX_NESTING)
            before = rows[-1].level if rows else 0
            opens = bool(rows) and level > before
            rows.append(TreeRow(job, depth, level, opens, 0 if opens else before - level, len(under[job.id])))
            stack.extend((child, depth + 1) for child in reversed(under[job.id]))
    return rows, (rows[-1].level if rows else 0)


# --- forms ---------------------------------------------------------------------------------------------------
MAX_NUMBER_TEXT = 24  # characters of a number field
MAX_FIELDS = 5000  # fields of one form: a group's ids, at most 1000 of each kind listed, and a few more
# where an action may send the browser back to: the dashboard's own pages, nothing else
_BACK = re.compile(r"/(?:failing|running|limits|schedules|workers|(?:jobs|pipelines)/[0-9a-fA-F-]{36})?")


class Form(Mapping[str, str]):
    """A submitted form (``application/x-www-form-urlencoded``): each field's first value by name, and
    ``getlist`` for a field sent many times."""

    def __init__(self, pairs: Sequence[tuple[str, str]]) -> None:
        self._pairs = tuple(pairs)
        self._first: dict[str, str] = {}
        for name, value in self._pairs:
            self._first.setdefault(name, value)

    @classmethod
    def parse(cls, body: bytes) -> Form:
        """The form a request's body holds (bad UTF-8 replaced); InvalidArgument past MAX_FIELDS fields."""
        try:
            pairs = parse_qsl(
                body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=MAX_FIELDS
            )
        except ValueError:
            raise InvalidArgument(f"jobkit: a form of more than {MAX_FIELDS} fields") from None
        return cls(pairs)

    def __getitem__(self, name: str) -> str:
        return self._first[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._first)

    def __len__(self) -> int:
        return len(self._first)

    def getlist(self, name: str) -> list[str]:
        """Every value sent for ``name``, in order."""
        return [value for key, value in self._pairs if key == name]


def job_ids(values: Iterable[str]) -> list[UUID]:
    """Job ids from a form, each once, in order."""
    out: dict[UUID, None] = {}
    for value in values:
        try:
            out[UUID(value)] = None
        except ValueError:
            raise InvalidArgument(f"jobkit: {value[:60]!r} is not a job id") from None
    return list(out)


def back_to(value: str | None, default: str = "/") -> str:
    """A form's page to return to, when it is one of the dashboard's own; else ``default``."""
    return value if value is not None and _BACK.fullmatch(value) else default


def _number(form: Mapping[str, str], name: str, *, whole: bool = True) -> Any:
    text = (form.get(name) or "").strip()
    if not text:
        return None
    kind = "a whole number" if whole else "a number"
    try:
        if len(text) > MAX_NUMBER_TEXT:
            raise ValueError
        value = int(text) if whole else float(text)
    except ValueError:
        raise InvalidArgument(f"jobkit: {name} must be {kind} (got {text[:40]!r})") from None
    if not whole and not math.isfinite(value):
        raise InvalidArgument(f"jobkit: {name} must be a finite number (got {text!r})")
    return value


def limit_arguments(form: Mapping[str, str]) -> tuple[str, dict[str, Any]]:
    """The type and ``set_limit``'s keyword arguments from the limits form (an empty field: no limit of
    that kind)."""
    type_ = form.get("type") or ""
    if not type_.strip():
        raise InvalidArgument("jobkit: type: give the job type to limit")
    per_seconds = _number(form, "per_seconds", whole=False)
    try:
        per = timedelta(seconds=per_seconds) if per_seconds is not None else None
    except OverflowError:
        raise InvalidArgument(f"jobkit: per_seconds is out of range (got {per_seconds})") from None
    return type_, {
        "max_running": _number(form, "max_running"),
        "max_starts": _number(form, "max_starts"),
        "per": per,
        "max_running_per_key": _number(form, "max_running_per_key"),
    }


def schedule_from(form: Mapping[str, str]) -> Schedule:
    """The schedule the schedules form describes (``payload``: a JSON object)."""
    text = form.get("payload") or "{}"
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InvalidArgument(f"jobkit: payload is not valid JSON ({str(exc)[:120]})") from None
    if not isinstance(payload, dict):
        raise InvalidArgument('jobkit: payload must be a JSON object, e.g. {} or {"report": "daily"}')
    misfire = form.get("misfire") or "skip"
    if misfire not in get_args(Misfire):
        raise InvalidArgument(f"jobkit: misfire must be one of {', '.join(get_args(Misfire))}")
    priority = _number(form, "priority")
    max_attempts = _number(form, "max_attempts")
    return Schedule(
        name=form.get("name") or "",
        cron=(form.get("cron") or "").strip(),
        type=form.get("type") or "",
        payload=payload,
        timezone=(form.get("timezone") or "").strip() or "UTC",
        priority=0 if priority is None else priority,
        max_attempts=DEFAULT_MAX_ATTEMPTS if max_attempts is None else max_attempts,
        misfire=cast(Misfire, misfire),
        enabled=form.get("enabled") is not None,
    )
