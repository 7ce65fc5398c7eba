"""jobkit on a replicated NATS JetStream cluster (``pip install 'pgjobkit[nats]'``; issue 44's foundation).

**Record first.** Every job's state is a record, the one message of subject ``<p>.job.<id>`` in a stream
with ``max_msgs_per_subject: 1``, changed only by compare-and-set on that subject's last sequence
(``Nats-Expected-Last-Subject-Sequence``), with the new state decided by ``pgjobkit.core.transitions``
(claim, complete, fail with backoff or ``Permanent``, heartbeat, progress, release, cancel, reclaim,
requeue): nothing here re-derives a rule. JetStream only delivers and times: a *dispatch* on
``<p>.run.<type>.<id>`` says "look at this job now"; the job's one *schedule* ``<p>.sched.<id>``
(``Nats-Schedule: @at ...``) fires a dispatch at its run_after, its retry's backoff, or its lease's end.
A dispatch is acked only after the record's write won, or was found not needed. The subjects and the
stream's configuration: ``layout``.

**Arming.** Each won write is followed by the dispatch or schedule the new state needs, published on
condition that the record is still at the revision just written
(``Nats-Expected-Last-Subject-Sequence-Subject``): a slower writer never replaces a newer arming. Every
dispatch is checked against the record when it arrives, so a lost arming (a crash between the two writes)
only delays a job: a claimed job's schedule or the unacked dispatch (redelivered after ``ack_wait``, 30 s)
looks again. Enqueue writes key, record and dispatch in one atomic batch, so a job never exists unarmed.

**Fencing.** A lease is the record's ``lease_token``; complete, fail, heartbeat, progress and release
decide with ``core`` from the record and write by compare-and-set: a stale worker's call finds another
token (or loses the race) and changes nothing, answering ``ok=False`` / ``held=False`` as on PostgreSQL.
It sends no ack, nak or ``+WPI`` at all: JetStream's acks match by stream sequence only, so a stale one
would act on the new holder's delivery (``reference/jetstream-2.15.md``, "Acks, naks, leases").

**Expired leases.** A claim arms a schedule at the lease's end. When it fires (at most ~265 ms late) the
dispatch goes to a waiting claim of that type, which reclaims the job through ``core.reclaim`` and claims it
(or writes it dead when its attempts are used up): recovery takes the lease plus the schedule's lateness
(<= ~265 ms) plus the claim loop's poll; measured 11-32 ms after the lease's end on the 3-node loopback
cluster with a claim every 20 ms. With no worker of that type left the dispatch waits in the stream for the
next one. (``reclaim_expired`` also finds them, by a scan.) A heartbeat extends
the record only; the schedule, when it fires before the new end, is armed again for it.

**Durability.** The stream is file-backed, replicated 3 ways on a cluster
(``replicas`` / JOBKIT_NATS_REPLICAS overrides), Limits retention (acks never delete a record), no
``persist_mode: async`` (it refuses atomic batches). Run the servers with ``jetstream { sync_interval:
always }`` (``pgjobkit nats up`` does): the default fsyncs every 2 minutes, so a write acknowledged by a
quorum could be lost if the nodes lose power together; measured cost on R3 ~15%.

**What works** (through the ``AsyncJobStore`` methods and ``pgjobkit.worker.calls_async``, whose
``pgjobkit.ops`` operations this store executes: ``functions.Functions.table``): enqueue, enqueue_many
(atomic up to 333 jobs: one batch of <= 1,000 messages, 3 per job; more are refused, split them), the
idempotency key's live window (held until the job is dead, cancelled or gone), claim (in batches, a fresh
token per claim), complete and complete_and_claim (keeping results), fail (retry after the given delay via
a schedule, dead at max_attempts or permanent), heartbeat, progress, release, cancel, requeue, get, stats,
reclaim_expired (a scan; the schedules make it unneeded), list_limits (none: none can be set), schema_version (the schema version this package needs
while the stream has the layout it writes, else that layout's name), complete with ``delete=True``
(``delete_succeeded``: a job with no user is removed, its record written empty by the completion's
compare-and-set, which every read takes for no job and which frees its key; a user's job is kept), prune
(by a scan, each pruned job removed so).
``Worker(store)`` runs jobs on it.

**Refused at once** (``NotAvailable``, a ConfigurationError naming the call and this store): priority other
than 0 and fair_key at enqueue (JetStream delivers in stream order), pipelines, setting limits, cron schedules, list_jobs, traceback, the worker registry and activity
(list_workers, activity, queue_depth), trace contexts. Not kept (accepted, dropped): an enqueue's
trace_context, a failure's traceback (``traceback()`` is refused; the one-line error is kept), a worker's
beats (checked as on every store) and stop (so ``pgjobkit.worker.Worker`` runs on this store as it is, without a warning per beat).

**Blocking and from settings.** ``JetStreamStore`` (``blocking``) runs this store on a loop thread of its
own, for the CLI and blocking apps; ``open_store`` gives it when JOBKIT_NATS_URL is set, and
``Worker.from_settings()`` runs on its ``as_async()``. docs/operations/jetstream.md is the user's page.

**The users' view.** ``projector`` writes each job's newest record into a database's jobkit_jobs
(``pgjobkit nats project``), for a signed-in user's listing, ``UserJobs``, stats and Realtime.

**Partitions** (``partitions``): a queue over P streams, each with its own leader; P = 1 is the queue
described above, unchanged.

**The outbox.** ``relay`` moves the jobs an app enqueued in its own SQL transaction
(``jobkit_outbox_enqueue``) into the queue, exactly once per key. ``pgjobkit demo --nats`` runs the demo's
burst here; ``python -m bench --only nats`` measures it beside PostgresStore.
"""

from __future__ import annotations

from pgjobkit.errors import NotAvailable
from pgjobkit.stores.jetstream.blocking import JetStreamStore
from pgjobkit.stores.jetstream.layout import MAX_ATOMIC_JOBS, Layout
from pgjobkit.stores.jetstream.store import AsyncJetStreamStore, migrate, parse_urls

__all__ = [
    "MAX_ATOMIC_JOBS",
    "AsyncJetStreamStore",
    "JetStreamStore",
    "Layout",
    "NotAvailable",
    "migrate",
    "parse_urls",
]
