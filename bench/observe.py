"""What seeing a worker costs: the Worker's defaults beside the same run without its beats, with an
OpenTelemetry tracer provider set but tracing off, with tracing on (an SDK provider batching spans to an exporter that drops
them), and with its Prometheus endpoint served (never scraped), interleaved run by run."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.util._once import Once


class _Dropped(SpanExporter):
    """An exporter that takes every span and keeps none: what tracing costs jobkit, not a backend."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


@contextlib.contextmanager
def tracer_provider() -> Iterator[None]:
    """An SDK tracer provider, global inside only (OpenTelemetry sets one once per process: the bench
    resets it, as the tests do)."""
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Dropped()))
    saved = trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE
    trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = None, Once()
    trace.set_tracer_provider(provider)
    try:
        yield
    finally:
        provider.shutdown()
        trace._TRACER_PROVIDER, trace._TRACER_PROVIDER_SET_ONCE = saved


CONFIGS: dict[str, tuple[bool, dict[str, Any]]] = {  # figure -> (a tracer provider set, worker options)
    "defaults (no tracer provider)": (False, {}),
    "no beats (presence_every=0: no row in jobkit_workers, no activity)": (False, {"presence_every": 0}),
    "tracing off (a tracer provider set, tracing=False)": (True, {"tracing": False}),
    "tracing on (spans batched to an exporter that drops them)": (True, {"tracing": True}),
    "Prometheus endpoint served (never scraped)": (False, {"metrics_port": 0}),
}
