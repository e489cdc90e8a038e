"""Tracer setup and traceparent propagation through header mappings (NATS, gRPC)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from couler_runtime import telemetry


def test_provider_names_the_service_and_exports_to_the_given_exporter() -> None:
    exporter = InMemorySpanExporter()
    provider = telemetry.setup_tracing("couler-test", exporter=exporter, set_global=False)
    with provider.get_tracer("t").start_as_current_span("work"):
        pass
    (span,) = exporter.get_finished_spans()
    assert span.name == "work"
    assert span.resource.attributes["service.name"] == "couler-test"
    provider.shutdown()


def test_without_endpoint_or_exporter_nothing_is_exported_but_context_propagates() -> None:
    provider = telemetry.setup_tracing("quiet", set_global=False)
    with provider.get_tracer("t").start_as_current_span("work") as span:
        headers = telemetry.inject({})
    assert headers["traceparent"].split("-")[1] == format(span.get_span_context().trace_id, "032x")
    provider.shutdown()


def test_inject_then_extract_continues_the_trace() -> None:
    exporter = InMemorySpanExporter()
    provider = telemetry.setup_tracing("svc", exporter=exporter, set_global=False)
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("publish") as publish:
        headers = telemetry.inject({"Nats-Msg-Id": "r-1.requested"})
    assert headers["Nats-Msg-Id"] == "r-1.requested"
    version, trace_id, span_id, flags = headers["traceparent"].split("-")
    assert version == "00"
    assert int(flags, 16) & 1  # sampled
    ctx = publish.get_span_context()
    assert (int(trace_id, 16), int(span_id, 16)) == (ctx.trace_id, ctx.span_id)

    with tracer.start_as_current_span("consume", context=telemetry.extract(headers)):
        pass
    consume = next(s for s in exporter.get_finished_spans() if s.name == "consume")
    assert consume.context.trace_id == ctx.trace_id
    assert consume.parent is not None and consume.parent.span_id == ctx.span_id
    provider.shutdown()


def test_inject_outside_a_span_adds_nothing_and_extract_of_nothing_is_a_root() -> None:
    assert "traceparent" not in telemetry.inject({})
    for headers in (None, {}, {"traceparent": "garbage"}):
        span = trace.get_current_span(telemetry.extract(headers))
        assert not span.get_span_context().is_valid


def test_grpc_metadata_as_headers_keeps_text_entries_only() -> None:
    metadata = (("traceparent", "00-ab-cd-01"), ("couler-error-bin", b"\x00"), ("x", "y"))
    assert telemetry.headers_from_metadata(metadata) == {"traceparent": "00-ab-cd-01", "x": "y"}
    assert telemetry.headers_from_metadata(None) == {}
