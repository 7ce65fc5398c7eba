"""Tracing on the MemoryStore, as a user's tests run it: a pipeline enqueued inside a span, and the jobs its
handlers add with ``current().add``, keep their trace contexts and run in the enqueuer's trace (the SQL
stores' run is tests/integration/test_tracing.py; 0.5.1's MemoryStore refused both, over the
trace_context key its copy of jobkit_check_jobs lacked)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from pgjobkit import MemoryStore, Pipeline, Worker, current


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    """An SDK tracer provider, global for the test only (OpenTelemetry lets one be set once per process)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    saved = trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE
    trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = None, Once()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = saved


def test_a_traced_pipeline_and_the_jobs_its_handler_adds_keep_their_trace(
    exporter: InMemorySpanExporter,
) -> None:
    store = MemoryStore()
    worker = Worker(store, schedules=False, poll_interval=0.05, presence_every=0)

    @worker.handler("crawl")
    def crawl(payload: dict[str, Any]) -> None:
        current().add("fetch", {"url": "https://example.test"})

    worker.register("fetch", lambda payload: None)
    pipeline = Pipeline()
    pipeline.add("crawl", after=[pipeline.add("crawl")])
    with trace.get_tracer("the-app").start_as_current_span("the app's request"):
        enqueued = store.enqueue_pipeline(pipeline)
    assert worker.run(until_empty=True, install_signals=False).succeeded == 4
    jobs = store.jobs()
    assert len(jobs) == 4 and set(store.trace_contexts([j.id for j in jobs])) == {j.id for j in jobs}
    spans = list(exporter.get_finished_spans())
    [request] = [s for s in spans if s.name == "the app's request"]
    assert request.context is not None and len(enqueued.jobs) == 2
    fetches = [s for s in spans if s.name == "process fetch"]
    assert len(fetches) == 2 and all(s.parent is not None for s in fetches)
    assert {s.context.trace_id for s in spans if s.context} == {request.context.trace_id}
