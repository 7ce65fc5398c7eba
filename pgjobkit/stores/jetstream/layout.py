"""Where a JetStream store keeps what (no I/O): the stream, its subjects and their headers, the consumers'
names, the stream's configuration. One stream holds every subject, so that one atomic batch can write a
job's key, record and dispatch together (a batch cannot span streams).

| subject | holds | written |
|---|---|---|
| ``<p>.job.<id>`` | the job's record: ``Job`` as JSON | only by compare-and-set on its last sequence |
| ``<p>.key.<sha256(key)>`` | which job holds an idempotency key | compare-and-set, in the enqueue's batch |
| ``<p>.run.<type>.<id>`` | a dispatch: "look at this job now" | after a won write, conditional on its sequence |
| ``<p>.sched.<id>`` | the job's one schedule (``@at`` run_after or lease_until) firing a dispatch | same |
| ``<p>.wake.run.<type>.<id>`` | (not stored) the stream's headers-only republish of each dispatch | by the server |

``max_msgs_per_subject: 1`` makes each subject a register: its last sequence is its revision. Types and
keys become subject tokens (base64url for a type, a SHA-256 for a key: a key of 200 characters fits, and
the key record keeps the key itself).
"""

from __future__ import annotations

import base64
import hashlib
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from pgjobkit.core.models import FINISHED, Job, JobStatus

LAYOUT_VERSION = "jetstream-1"  # the stream's metadata names the layout it was created for
MAX_BATCH_MESSAGES = 1000  # JetStream's atomic batch limit (10199)
MESSAGES_PER_JOB = 3  # key, record, dispatch or schedule
MAX_ATOMIC_JOBS = MAX_BATCH_MESSAGES // MESSAGES_PER_JOB  # jobs one enqueue_many writes atomically: 333

EXPECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
EXPECT_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
WRONG_LAST_SEQUENCE = 10071  # a compare-and-set lost: the subject moved on
BATCH_WRONG_LAST_SEQUENCE = 10164  # a batch's compare-and-set lost (or two on one subject in one batch)
# a compare-and-set lost: 10071, or 10164, which 2.15.1 answers for a batch a concurrent batch moved, and
# (seen in the leader-kill chaos test) for a single conditional publish answered across a leader change
LOST_RACE = frozenset({WRONG_LAST_SEQUENCE, BATCH_WRONG_LAST_SEQUENCE})
BATCH_INCOMPLETE = 10176  # the batch was lost (a leader change while it was open)


def token(text: str) -> str:
    """``text`` as one subject token: base64url without padding (letters, digits, - and _)."""
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def at(when: datetime) -> str:
    """A ``Nats-Schedule`` value for ``when``, rounded up to the millisecond (a schedule never fires early,
    and the dispatch it fires must find the job due)."""
    ms = math.ceil(when.timestamp() * 1000)
    moment = datetime.fromtimestamp(ms / 1000, UTC)
    return f"@at {moment.strftime('%Y-%m-%dT%H:%M:%S')}.{ms % 1000:03d}Z"


@dataclass(frozen=True)
class Layout:
    """The names of one jobkit queue on JetStream: ``prefix`` for its subjects, ``stream`` for its stream."""

    prefix: str = "jobkit"
    stream: str = "JOBKIT"
    partitions: int = 1  # the queue's partitions (``partitions``), this layout one of them

    def partition(self, k: int) -> Layout:
        """Partition ``k``'s layout: partition 0 is the queue's own names (a queue of one partition is the
        unpartitioned queue), partition k > 0 ``<prefix>-<k>`` and ``<stream>_<k>``."""
        if k == 0:
            return self
        return Layout(f"{self.prefix}-{k}", f"{self.stream}_{k}", self.partitions)

    def record(self, job_id: UUID) -> str:
        return f"{self.prefix}.job.{job_id}"

    @property
    def records(self) -> str:
        """Every job's record subject (a filter)."""
        return f"{self.prefix}.job.*"

    def key(self, key: str) -> str:
        digest = base64.urlsafe_b64encode(hashlib.sha256(key.encode()).digest()).decode().rstrip("=")
        return f"{self.prefix}.key.{digest}"

    def dispatch(self, type: str, job_id: UUID) -> str:
        return f"{self.prefix}.run.{token(type)}.{job_id}"

    def dispatches(self, type: str) -> str:
        return f"{self.prefix}.run.{token(type)}.>"

    def schedule(self, job_id: UUID) -> str:
        return f"{self.prefix}.sched.{job_id}"

    @property
    def wakeups(self) -> str:
        return f"{self.prefix}.wake.>"

    def consumer(self, type: str) -> str:
        """The durable consumer every worker of ``type`` pulls from (one per type: a dispatch goes to one)."""
        return f"{self.stream}_{hashlib.sha256(type.encode()).hexdigest()[:24]}"

    def stream_config(self, replicas: int) -> dict[str, Any]:
        """The stream: Limits retention (acks move consumer state, never delete: a record outlives its
        dispatches), one message per subject, file storage, ``replicas`` copies, schedules and atomic batches
        allowed, each dispatch republished (headers only) as a wake-up. No ``persist_mode: async``: it
        refuses atomic batches."""
        return {
            "name": self.stream,
            "subjects": [
                f"{self.prefix}.job.>",
                f"{self.prefix}.key.>",
                f"{self.prefix}.run.>",
                f"{self.prefix}.sched.>",
            ],
            "retention": "limits",
            "storage": "file",
            "max_msgs_per_subject": 1,
            "num_replicas": replicas,
            "discard": "old",
            "duplicate_window": 120 * 1_000_000_000,
            "allow_msg_schedules": True,
            "allow_atomic": True,
            "allow_direct": False,  # reads go to the leader: a record read is never behind a won write
            "republish": {
                "src": f"{self.prefix}.run.>",
                "dest": f"{self.prefix}.wake.run.>",
                "headers_only": True,
            },
            "metadata": {"jobkit_layout": LAYOUT_VERSION, "jobkit_partitions": str(self.partitions)},
        }


def record_data(job: Job) -> bytes:
    return job.model_dump_json().encode()


def purge_schedule_headers(layout: Layout, job: Job) -> dict[str, str]:
    """A finished job's record write also removes its schedule (``Nats-Schedule-Next: purge``), atomically:
    no lease check or retry fires for it afterwards."""
    if job.status in FINISHED:
        return {"Nats-Schedule-Next": "purge", "Nats-Scheduler": layout.schedule(job.id)}
    return {}


def wake_at(job: Job) -> datetime | None:
    """When the job next needs a look: its run_after when runnable, its lease's end when running; None when
    finished (nothing fires for it)."""
    if job.status in (JobStatus.QUEUED, JobStatus.RETRYING):
        return job.run_after
    if job.status == JobStatus.RUNNING:
        return job.lease_until
    return None
