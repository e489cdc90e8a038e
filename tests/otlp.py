"""An OTLP/gRPC trace receiver in the test process (what a collector is to the services).

:func:`otlp_receiver` serves OpenTelemetry's ``TraceService`` (the ``opentelemetry-proto``
stubs) on 127.0.0.1; a service given ``COULER_OTEL_ENDPOINT=http://127.0.0.1:<port>``
exports its spans to it, and :meth:`Receiver.spans` lists what arrived.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

CONSUMER = 5  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_CONSUMER


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, str]


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP trace receiver: keeps every span it is sent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[Span] = []

    def Export(self, request: trace_service_pb2.ExportTraceServiceRequest,
               context: grpc.ServicerContext) -> trace_service_pb2.ExportTraceServiceResponse:
        got = []
        for rs in request.resource_spans:
            service = next((a.value.string_value for a in rs.resource.attributes
                            if a.key == "service.name"), "")
            for ss in rs.scope_spans:
                got += [Span(service, s.name, s.trace_id.hex(), s.span_id.hex(),
                             s.parent_span_id.hex(), s.kind,
                             {a.key: a.value.string_value for a in s.attributes})
                        for s in ss.spans]
        with self._lock:
            self._spans += got
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[Span]:
        with self._lock:
            return list(self._spans)


@contextlib.contextmanager
def otlp_receiver() -> Iterator[tuple[Receiver, str]]:
    """A started receiver and its endpoint (``http://127.0.0.1:<port>``); stopped on exit."""
    rec = Receiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(rec, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield rec, f"http://127.0.0.1:{port}"
    finally:
        server.stop(None)
