"""Trace contexts, the JobStore contract: every way a job is added keeps the W3C context it carries (read back
with ``trace_contexts``), on every store: one enqueue, a batch, a pipeline whose jobs carry contexts or take
the enqueuer's, and the jobs a handler adds under tracing, which take its attempt's context."""

from __future__ import annotations

from datetime import timedelta

from pgjobkit.core.models import NewJob
from pgjobkit.core.pipelines import Pipeline
from pgjobkit.ops import pipelines as pipeline_ops
from pgjobkit.stores.base import JobStore
from pgjobkit.worker.calls import WorkerCalls

LEASE = timedelta(seconds=30)


def context(n: int) -> dict[str, str]:
    """A W3C trace context (traceparent and tracestate), the ``n``-th of the test."""
    return {"traceparent": f"00-{n:032x}-{n:016x}-01", "tracestate": f"jobkit=t{n}"}


def test_an_enqueued_jobs_trace_context_is_kept(store: JobStore) -> None:
    one = store.enqueue(NewJob(type="embed", trace_context=context(1)))
    many = store.enqueue_many(
        [
            NewJob(type="embed", trace_context=context(2)),
            NewJob(type="embed"),
            NewJob(type="b", trace_context={}),
        ]
    )
    ids = [one.id, *(e.id for e in many)]
    assert store.trace_contexts(ids) == {ids[0]: context(1), ids[1]: context(2), ids[3]: {}}


def test_a_traced_pipeline_keeps_each_jobs_context(store: JobStore) -> None:
    p = Pipeline()
    a = p.add(NewJob(type="embed", trace_context=context(1)))
    p.add(NewJob(type="reindex", trace_context=context(2)), after=a, ref="r")
    e = store.enqueue_pipeline(p)
    assert store.trace_contexts(list(e.ids.values())) == {e.ids[a]: context(1), e.ids["r"]: context(2)}
    # an enqueue inside a span: the jobs that bring no context take the enqueuer's (pgjobkit.exporters.otel)
    q = Pipeline()
    own, plain = q.add(NewJob(type="embed", trace_context=context(3))), q.add("embed")
    sent = store.run(pipeline_ops.enqueue_pipeline(store.dialect, q, context(4)))
    assert store.trace_contexts(list(sent.ids.values())) == {
        sent.ids[own]: context(3),
        sent.ids[plain]: context(4),
    }


def test_jobs_a_handler_adds_under_tracing_keep_the_attempts_context(store: JobStore) -> None:
    store.enqueue(NewJob(type="split"))
    calls = WorkerCalls(store)
    [job] = calls.claim(["split"], "w1", LEASE, 1)
    assert job.lease_token is not None
    added = Pipeline()  # what current().add builds in the handler
    a = added.add("embed", {"n": 1})
    added.add(NewJob(type="embed", trace_context=context(6)), after=a, ref="own")
    # what the worker sends on completion: the attempt's span's context for the jobs that bring none
    ok, enqueued = calls.complete_adding(job.id, job.lease_token, None, added, context(5))
    assert ok
    assert store.trace_contexts(list(enqueued.ids.values())) == {
        enqueued.ids[a]: context(5),
        enqueued.ids["own"]: context(6),
    }
