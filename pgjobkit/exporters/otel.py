"""Traces through OpenTelemetry, when its API is installed (``pip install 'pgjobkit[otel]'``) and the app
has set a tracer provider: an enqueue runs in a ``send`` span (PRODUCER) whose context is kept with its
jobs, and a worker runs each attempt in a ``process`` span (CONSUMER) that continues that trace (its parent)
and links to it (a user's job: a new trace, only linked), with attributes after OpenTelemetry's messaging
semantic conventions. Without the API
nothing here imports it, and each hook is one test of a module constant.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from pgjobkit.core.models import MAX_TRACE_CONTEXT_BYTES
from pgjobkit.version import __version__

if TYPE_CHECKING:
    from pgjobkit.core.models import Job, NewJob

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.trace import Link, SpanKind, StatusCode
except ImportError:  # the [otel] extra is not installed: nothing traces
    trace = None  # type: ignore[assignment]

SYSTEM = "jobkit"  # messaging.system


def configured() -> bool:
    """Whether spans would be recorded: the API is installed and the app set a tracer provider."""
    if trace is None:
        return False
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def _tracer() -> Any:
    return trace.get_tracer("pgjobkit", __version__)


@contextmanager
def sending(jobs: Sequence[NewJob]) -> Iterator[Sequence[NewJob]]:
    """Around an enqueue: a ``send`` span, and ``jobs`` with its context as their ``trace_context`` (a job
    that brings its own keeps it). Without OpenTelemetry, ``jobs`` as they are."""
    if trace is None or not jobs:
        yield jobs
        return
    with send_span({j.type for j in jobs}, len(jobs)) as carrier:
        if carrier is None:
            yield jobs
        else:
            yield [
                j if j.trace_context is not None else j.model_copy(update={"trace_context": carrier})
                for j in jobs
            ]


@contextmanager
def send_span(types: Collection[str], count: int = 1) -> Iterator[dict[str, str] | None]:
    """A ``send`` span (PRODUCER) for ``count`` jobs of ``types`` (its destination: the one type, or
    ``jobkit`` for several), and the trace context to keep with them: None without OpenTelemetry, or when
    no trace is recorded."""
    if trace is None:
        yield None
        return
    destination = next(iter(types)) if len(types) == 1 else SYSTEM
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM,
        "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue",
        "messaging.destination.name": destination,
    }
    if count > 1:
        attributes["messaging.batch.message_count"] = count
    with _tracer().start_as_current_span(
        f"send {destination}", kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:
        carrier: dict[str, str] = {}
        if span.get_span_context().is_valid:
            propagate.inject(carrier)
        yield _kept(carrier)


def start_run(job: Job, carrier: dict[str, str] | None, wait: float) -> Any:
    """A started ``process`` span for one attempt of ``job``: the child of the trace ``carrier`` (the job's
    enqueuer's) continues, and linked to it; a new trace without one. A job a signed-in user enqueued
    (``user_id``) brings a context the user chose: its span starts a new trace, only linked to that one, so
    no user decides which trace the worker's spans join. End it with ``end_run``."""
    parent = propagate.extract(carrier) if carrier else None
    links = []
    if parent is not None:
        origin = trace.get_current_span(parent).get_span_context()
        if origin.is_valid:
            links.append(Link(origin))
        if not origin.is_valid or job.user_id is not None:
            parent = None
    return _tracer().start_span(
        f"process {job.type}",
        context=parent,
        kind=SpanKind.CONSUMER,
        links=links,
        attributes={
            "messaging.system": SYSTEM,
            "messaging.operation.type": "process",
            "messaging.operation.name": "run",
            "messaging.destination.name": job.type,
            "messaging.message.id": str(job.id),
            "messaging.message.delivery_count": job.attempts,  # attempts so far, this one included
            "jobkit.job.attempt": job.attempts,
            "jobkit.job.queue_wait": wait,
        },
    )


def carrier(span: Any) -> dict[str, str] | None:
    """The trace context to keep with jobs that continue ``span``'s trace (the jobs a handler added)."""
    out: dict[str, str] = {}
    propagate.inject(out, context=trace.set_span_in_context(span))
    return _kept(out)


def _kept(carrier: dict[str, str]) -> dict[str, str] | None:
    """What of an injected carrier a job keeps: the W3C trace fields (not baggage, which is the app's to
    size), within the 1 KiB a job's trace context may take: a long tracestate is left out first."""
    kept = {k: v for k, v in carrier.items() if k in ("traceparent", "tracestate")}
    if len(json.dumps(kept)) > MAX_TRACE_CONTEXT_BYTES // 2:  # escaped JSON: well within the bound
        kept.pop("tracestate", None)
    if len(json.dumps(kept)) > MAX_TRACE_CONTEXT_BYTES // 2:  # no W3C traceparent is this long
        return None
    return kept or None


@contextmanager
def current(span: Any) -> Iterator[None]:
    """``span`` is the current span inside (the handler's own spans are its children)."""
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield
    finally:
        otel_context.detach(token)


def failed(span: Any, exc: BaseException) -> None:
    """The attempt raised ``exc``: recorded on its span (an exception whose text itself fails to render is
    recorded by its type)."""
    try:
        text = f"{type(exc).__name__}: {exc}"
        span.record_exception(exc)
    except Exception:
        text = type(exc).__name__
    span.set_status(StatusCode.ERROR, text[:200])


def end_run(span: Any, outcome: str) -> None:
    """End an attempt's span with how it ended (succeeded, retrying, dead, lost, released)."""
    span.set_attribute("jobkit.job.outcome", outcome)
    span.end()
