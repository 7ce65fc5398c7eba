"""One trace from a web request to the handler that ran its job: a FastAPI app (instrumented by
OpenTelemetry's own FastAPI instrumentation) enqueues, on real PostgreSQL and through a user's session over
the Data API; a worker runs each attempt in a span that continues the enqueuer's trace (a signed-in user's
job: a new trace, linked to the user's). Spans are read from the SDK's in-memory exporter. Without
OpenTelemetry installed, jobkit imports none of it and works."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from fastapi import FastAPI
from opentelemetry import baggage, context, trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, TraceState
from opentelemetry.util._once import Once

from pgjobkit import NewJob, Pipeline, PostgresStore, UserJobs, Worker, current
from tests.doubles.postgrest import Postgrest
from tests.doubles.router import BASE_URL, SupabaseRouter, make_jwt
from tests.sql.helpers import make_user, user_claims


@pytest.fixture
def provider() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    """An SDK tracer provider, global for the test only (OpenTelemetry lets one be set once per process)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    saved = trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE
    trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = None, Once()
    trace.set_tracer_provider(provider)
    try:
        yield provider, exporter
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = saved


def _worker(store: PostgresStore, **options: Any) -> Worker:
    worker = Worker(store, schedules=False, poll_interval=0.05, presence_every=0, **options)
    app_tracer = trace.get_tracer("the-app")

    @worker.handler("embed")
    def embed(payload: dict[str, Any]) -> None:
        with app_tracer.start_as_current_span("call the embeddings API"):
            pass

    @worker.handler("broken")
    async def broken(payload: dict[str, Any]) -> None:
        raise ValueError("the model refused it")

    return worker


def _app(store: PostgresStore) -> FastAPI:
    app = FastAPI()

    @app.post("/documents")
    def add(document: dict[str, Any]) -> dict[str, str]:
        job = store.enqueue(NewJob(type=document["type"], payload=document, max_attempts=1))
        return {"job": str(job.id)}

    return app


async def _post(app: FastAPI, *documents: dict[str, Any]) -> list[str]:
    """POST each document to the app, through its ASGI interface; the jobs' ids."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app.test") as client:
        return [(await client.post("/documents", json=d)).raise_for_status().json()["job"] for d in documents]


def _one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    [span] = [s for s in spans if s.name == name]
    return span


def test_a_request_and_the_handler_of_its_job_are_one_trace(
    db_url: str, provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    tracer_provider, exporter = provider
    with PostgresStore(db_url, max_size=4) as store:
        app = _app(store)
        FastAPIInstrumentor.instrument_app(app, tracer_provider=tracer_provider)
        job_id, broken_id = asyncio.run(_post(app, {"type": "embed", "text": "hello"}, {"type": "broken"}))
        summary = _worker(store).run(until_empty=True, install_signals=False)
    assert (summary.succeeded, summary.dead) == (1, 1)
    spans = list(exporter.get_finished_spans())

    [request, _] = [s for s in spans if s.name == "POST /documents" and s.kind == SpanKind.SERVER]
    send, run, call = (
        _one(spans, "send embed"),
        _one(spans, "process embed"),
        _one(spans, "call the embeddings API"),
    )
    assert request.context is not None and send.context is not None and run.context is not None
    assert {s.context.trace_id for s in (request, send, run, call) if s.context} == {request.context.trace_id}
    assert send.kind == SpanKind.PRODUCER and send.parent is not None
    assert send.parent.span_id == request.context.span_id
    assert run.kind == SpanKind.CONSUMER and run.parent is not None
    assert run.parent.span_id == send.context.span_id  # the run continues the enqueuer's trace...
    assert [link.context.span_id for link in run.links] == [send.context.span_id]  # ...and links to it
    assert call.parent is not None and call.parent.span_id == run.context.span_id  # the handler's own spans
    attributes = dict(run.attributes or {})
    assert attributes["messaging.system"] == "jobkit"
    assert attributes["messaging.operation.type"] == "process"
    assert attributes["messaging.destination.name"] == "embed"
    assert attributes["messaging.message.id"] == job_id
    assert (attributes["jobkit.job.attempt"], attributes["jobkit.job.outcome"]) == (1, "succeeded")
    assert isinstance(attributes["jobkit.job.queue_wait"], float) and attributes["jobkit.job.queue_wait"] >= 0
    assert dict(send.attributes or {})["messaging.operation.type"] == "send"

    failed = _one(spans, "process broken")
    assert dict(failed.attributes or {})["messaging.message.id"] == broken_id
    assert dict(failed.attributes or {})["jobkit.job.outcome"] == "dead"
    assert failed.status.status_code == StatusCode.ERROR
    assert [e.attributes["exception.type"] for e in failed.events if e.attributes] == ["ValueError"]


def test_tracing_off_runs_no_spans_even_with_a_provider(
    db_url: str, provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    _, exporter = provider
    with PostgresStore(db_url, max_size=4) as store:
        store.enqueue(NewJob(type="embed"))
        assert _worker(store, tracing=False).run(until_empty=True, install_signals=False).succeeded == 1
    spans = list(exporter.get_finished_spans())
    assert [s.name for s in spans] == ["send embed", "call the embeddings API"]
    assert spans[1].parent is None  # the handler's own span starts a trace of its own


def test_a_job_a_user_starts_inside_a_span_runs_in_a_new_trace_linked_to_it(
    db_url: str,
    pg: psycopg.Connection[Any],
    router: SupabaseRouter,
    anon_key: str,
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    _, exporter = provider
    pg.execute("insert into public.jobkit_user_types (type, max_live_per_user) values ('embed', 3)")
    user = make_user(pg)
    with trace.get_tracer("the-app").start_as_current_span("the app's request"):
        me = UserJobs(BASE_URL, anon_key, make_jwt("authenticated", sub=user))
        started = me.enqueue("embed", {"text": "mine"})
        me.close()
    with PostgresStore(db_url, max_size=4) as store:
        assert _worker(store).run(until_empty=True, install_signals=False).succeeded == 1
    spans = list(exporter.get_finished_spans())
    request, send, run, call = (
        _one(spans, "the app's request"),
        _one(spans, "send embed"),
        _one(spans, "process embed"),
        _one(spans, "call the embeddings API"),
    )
    assert request.context is not None and send.context is not None and run.context is not None
    assert send.context.trace_id == request.context.trace_id
    assert run.parent is None and run.context.trace_id != send.context.trace_id  # a trace of its own...
    assert [(link.context.trace_id, link.context.span_id) for link in run.links] == [
        (send.context.trace_id, send.context.span_id)  # ...linked to the one the user's client was in
    ]
    assert call.parent is not None and call.parent.span_id == run.context.span_id  # the handler's, under it
    assert dict(run.attributes or {})["messaging.message.id"] == str(started.job.id)
    assert uuid.UUID(user) == started.job.user_id


CHOSEN = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"  # a trace a user (or an app) names


def test_the_trace_a_user_names_is_linked_never_joined_and_an_apps_is_continued(
    db_url: str,
    pg: psycopg.Connection[Any],
    rest: Postgrest,
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    _, exporter = provider
    pg.execute("insert into public.jobkit_user_types (type) values ('embed')")
    [mine] = rest.rpc(
        "jobkit_user_enqueue",
        {"p_type": "embed", "p_payload": {}, "p_trace_context": {"traceparent": CHOSEN}},
        user_claims(make_user(pg)),
    )
    with PostgresStore(db_url, max_size=4) as store:
        apps = store.enqueue(NewJob(type="embed", trace_context={"traceparent": CHOSEN})).id
        assert _worker(store).run(until_empty=True, install_signals=False).succeeded == 2
    runs = {
        dict(s.attributes or {})["messaging.message.id"]: s
        for s in exporter.get_finished_spans()
        if s.name == "process embed"
    }
    chosen = (0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331)
    users, app = runs[mine["id"]], runs[str(apps)]
    assert users.context is not None and app.context is not None
    assert users.parent is None and users.context.trace_id != chosen[0]  # a fresh trace...
    assert [(link.context.trace_id, link.context.span_id) for link in users.links] == [chosen]  # ...linked
    assert app.parent is not None and (app.context.trace_id, app.parent.span_id) == chosen  # continued
    assert [(link.context.trace_id, link.context.span_id) for link in app.links] == [chosen]  # and linked


def test_without_opentelemetry_jobkit_imports_none_of_it_and_works() -> None:
    code = """
import sys

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "opentelemetry":
            raise ImportError("not installed")

sys.meta_path.insert(0, Blocked())
from pgjobkit import MemoryStore, NewJob, Worker

store = MemoryStore()
store.enqueue(NewJob(type="t"))
worker = Worker(store, schedules=False, tracing=True, presence_every=0)
worker.register("t", lambda payload: None)
assert worker.run(until_empty=True, install_signals=False).succeeded == 1
assert not [m for m in sys.modules if m.split(".")[0] == "opentelemetry"]
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_a_trace_context_that_names_no_trace_starts_a_new_one(
    db_url: str, provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    _, exporter = provider
    with PostgresStore(db_url, max_size=4) as store:
        for junk in (
            {"traceparent": "garbage"},
            {"traceparent": "00-" + "0" * 32 + "-" + "0" * 16 + "-01"},
            {},
        ):
            store.enqueue(NewJob(type="embed", trace_context=junk))
        # and one rewritten in SQL, as another client of the table could: right-to-left marks, a tracestate
        # of junk members, a header jobkit never writes
        written = store.enqueue(NewJob(type="embed")).id
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute(
                "update public.jobkit_traces set trace_context = %s::jsonb where job_id = %s",
                (
                    '{"traceparent": "00-\u202e' + "f" * 30 + '-b7ad6b7169203331-01", '
                    '"tracestate": "=,==,\u00e9=1", "x-other": "1"}',
                    written,
                ),
            )
        assert _worker(store).run(until_empty=True, install_signals=False).succeeded == 4
    runs = [s for s in exporter.get_finished_spans() if s.name == "process embed"]
    assert len(runs) == 4 and all(s.parent is None and not s.links for s in runs)


def test_a_pipelines_jobs_and_the_jobs_a_handler_adds_continue_the_trace(
    db_url: str, provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    _, exporter = provider
    with PostgresStore(db_url, max_size=4) as store:
        worker = Worker(store, schedules=False, poll_interval=0.05, presence_every=0)

        @worker.handler("crawl")
        def crawl(payload: dict[str, Any]) -> None:
            current().add("fetch", {"url": "https://example.test"})

        worker.register("fetch", lambda payload: None)
        pipeline = Pipeline()
        first = pipeline.add("crawl")
        pipeline.add("crawl", after=[first])
        with trace.get_tracer("the-app").start_as_current_span("the app's request"):
            store.enqueue_pipeline(pipeline)
        assert worker.run(until_empty=True, install_signals=False).succeeded == 4
    spans = list(exporter.get_finished_spans())
    request, send = _one(spans, "the app's request"), _one(spans, "send crawl")
    assert request.context is not None and send.context is not None
    crawls = [s for s in spans if s.name == "process crawl"]
    fetches = [s for s in spans if s.name == "process fetch"]
    assert len(crawls) == 2 and len(fetches) == 2
    assert all(s.parent is not None and s.parent.span_id == send.context.span_id for s in crawls)
    by_id = {s.context.span_id: s for s in crawls if s.context}
    assert all(s.parent is not None and s.parent.span_id in by_id for s in fetches)  # under what added it
    assert {s.context.trace_id for s in spans if s.context} == {request.context.trace_id}


def test_a_span_that_cannot_be_started_never_stops_the_job(
    db_url: str, provider: tuple[TracerProvider, InMemorySpanExporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> Any:
        raise ValueError("the propagator choked")

    monkeypatch.setattr("pgjobkit.exporters.otel.start_run", broken)
    with PostgresStore(db_url, max_size=4) as store:
        store.enqueue(NewJob(type="embed"))
        assert _worker(store).run(until_empty=True, install_signals=False).succeeded == 1


def test_an_enqueue_keeps_the_trace_fields_not_the_apps_baggage_and_never_fails_over_them(
    db_url: str, provider: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    ctx = baggage.set_baggage("user.notes", "x" * 5000)  # baggage an app may carry: far past 1 KiB
    token = context.attach(ctx)
    try:
        state = TraceState([("vendor", "y" * 250), ("other", "z" * 250)])
        parent = trace.NonRecordingSpan(
            trace.SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, True, trace_state=state)
        )
        with trace.use_span(parent), PostgresStore(db_url, max_size=2) as store:
            job = store.enqueue(NewJob(type="embed"))
            [kept] = store.trace_contexts([job.id]).values()
    finally:
        context.detach(token)
    assert set(kept) == {"traceparent"}  # the 500-character tracestate went first, the baggage always
    assert kept["traceparent"].startswith("00-0af7651916cd43dd8448eb211c80319c-")
