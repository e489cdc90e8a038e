"""OpenTelemetry tracing for the services: one trace follows a workflow across hops.

:func:`setup_tracing` builds a tracer provider named after the service. Spans are
exported over OTLP/gRPC only when an endpoint is configured (the exporter package,
``opentelemetry-exporter-otlp-proto-grpc``, is imported only then); tests pass an
exporter of their own (e.g. ``InMemorySpanExporter``) and get synchronous export;
with neither, spans are recorded for context propagation and dropped.

:func:`inject` and :func:`extract` move the W3C ``traceparent`` (through the global
propagator) in and out of a plain header mapping: NATS message headers and gRPC
metadata alike. The gRPC interceptors in :mod:`couler_runtime.rpc` use them, so do
the bus's publish and consume.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

__all__ = ["extract", "headers_from_metadata", "inject", "setup_tracing"]

TRACEPARENT = "traceparent"


def setup_tracing(
    service_name: str,
    *,
    otlp_endpoint: str | None = None,
    exporter: SpanExporter | None = None,
    set_global: bool = True,
) -> TracerProvider:
    """Create the tracer provider for one service.

    Args:
        service_name: the ``service.name`` resource attribute (e.g. "couler-submitter").
        otlp_endpoint: export spans in batches over OTLP/gRPC to this collector
            (e.g. "http://otel-collector:4317"); ``None`` or "" exports nothing.
        exporter: an exporter of the caller's, fed synchronously (tests use
            ``InMemorySpanExporter``); may be combined with ``otlp_endpoint``.
        set_global: also install it as OpenTelemetry's global provider. OpenTelemetry
            allows that once per process, so tests pass ``False`` and hand the
            provider to the interceptors instead.

    Returns:
        The provider; call ``shutdown()`` on it at exit to flush.
    """
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    if set_global:
        trace.set_tracer_provider(provider)
    return provider


def inject(headers: dict[str, str], context: Context | None = None) -> dict[str, str]:
    """Add ``traceparent`` (and ``tracestate``) for ``context`` (default: the current one).

    Nothing is added when there is no valid span in the context. Returns ``headers``.
    """
    propagate.inject(headers, context=context)
    return headers


def extract(headers: Mapping[str, str] | None) -> Context:
    """The context carried by ``headers`` (a fresh root context when there is none)."""
    return propagate.extract(dict(headers or {}))


def headers_from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> dict[str, str]:
    """gRPC metadata as a header mapping: text entries only (``-bin`` ones are bytes)."""
    return {k: v for k, v in (metadata or ()) if isinstance(v, str)}
