"""The services' gRPC server: health, reflection, tracing, bearer tokens, error mapping.

The server is ``grpc.aio``, not the thread-pool server. Every service also consumes
and publishes NATS JetStream messages through nats-py and reaches its store through
SQLAlchemy's asyncio API; with ``grpc.aio`` a servicer method is a coroutine on the
same event loop and simply awaits them. A thread-pool server would have to hop every
call into the loop (``run_coroutine_threadsafe``), hold a thread per open ``Watch``
stream, and split the service's state between threads.

:func:`start_server` registers servicers by service name (``"couler.v1.CacheService"``:
the method table comes from the proto descriptor, so a servicer is any object with
``async def`` methods named like the RPCs — subclassing the generated
``XxxServiceServicer`` is optional), adds the standard health service (SERVING for
each service and for the server as a whole, "") and reflection, and wraps every call,
outermost first, in:

1. tracing — a SERVER span per call, child of the caller's ``traceparent``;
2. metrics, when a meter provider is given — the call's duration in the histogram
   ``couler.rpc.server.duration`` (Prometheus: ``couler_rpc_server_duration_seconds``)
   per method and status code, refused calls included;
3. the bearer token check, when a token is configured;
4. error mapping — :mod:`couler.errors` to gRPC statuses (:mod:`.errors`); anything
   else is INTERNAL with a generic message and is logged with its traceback.

Health checks are exempt from the token (and from tracing): they are what the
orchestrator's probes call (Kubernetes' gRPC probe, ``grpc_health_probe``, the
embedded stack's readiness wait), which carry no credentials, and they reveal only
whether the server is serving. Reflection is not exempt: ``grpcurl -H`` can send
the token.

Request bodies are untrusted until the token is checked, and malformed after it:

* The token is checked before the body is read. A refused call is answered by a
  handler that never reads its request (it has a streaming request and no
  deserializer), so an anonymous caller costs neither a protobuf decode nor a
  buffered copy of the body: UNAUTHENTICATED, whatever bytes were sent.
* The services' methods are registered without a grpc deserializer; the request is
  decoded inside the behaviour (after the token check, inside the span and the error
  mapping), and a body that is not the method's message type is INVALID_ARGUMENT
  naming the method and the type, not grpc's UNKNOWN "Exception deserializing".
* A message over ``max_message_bytes`` (default :data:`MAX_MESSAGE_BYTES`, 64 MiB;
  a 100k-step workflow is about 12 MiB) is refused by grpc core with
  RESOURCE_EXHAUSTED from its length prefix, before it is buffered or decoded. The
  same limit applies to what the server sends; :mod:`.client` channels take the same
  parameter.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry import metrics, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from couler.errors import UserError

# Imported for their side effect: they register the services' descriptors.
from couler.v1 import (  # noqa: F401
    cache_service_pb2,
    generator_service_pb2,
    monitor_service_pb2,
    optimizer_service_pb2,
    submitter_service_pb2,
)
from couler_runtime import telemetry
from couler_runtime.metrics import DURATION_BUCKETS
from couler_runtime.rpc.errors import status_for

__all__ = [
    "DEFAULT_OPTIONS",
    "MAX_MESSAGE_BYTES",
    "UNAUTHENTICATED_MESSAGE",
    "ErrorInterceptor",
    "MetricsInterceptor",
    "RpcServer",
    "TokenInterceptor",
    "TracingInterceptor",
    "channel_options",
    "generic_handler",
    "start_server",
    "wrap_handler",
]

_log = logging.getLogger(__name__)

_HEALTH_PREFIX = f"/{health.SERVICE_NAME}/"
UNAUTHENTICATED_MESSAGE = "missing or invalid bearer token"
# A 100k-step workflow is about 12 MiB as protobuf; grpc's own default is 4 MiB. The
# limit bounds what one call may make a server (or client) buffer and decode.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_MAX_CHANNEL_INT = 2**31 - 1  # grpc channel arguments are C ints
_MESSAGE_LIMIT_KEYS = ("grpc.max_receive_message_length", "grpc.max_send_message_length")


def channel_options(
    max_message_bytes: int = MAX_MESSAGE_BYTES, options: Sequence[tuple[str, Any]] = ()
) -> tuple[tuple[str, Any], ...]:
    """gRPC channel options: receive and send limits of ``max_message_bytes``, then ``options``.

    Args:
        max_message_bytes: the largest message received or sent, in bytes.
        options: further channel options; they may not set the message limits.

    Raises:
        ValueError: ``max_message_bytes`` is not an int in 1..2**31-1, or ``options``
            sets a message limit.
    """
    if (isinstance(max_message_bytes, bool) or not isinstance(max_message_bytes, int)
            or not 1 <= max_message_bytes <= _MAX_CHANNEL_INT):
        raise ValueError(f"max_message_bytes must be an int from 1 to {_MAX_CHANNEL_INT} "
                         f"bytes (got {max_message_bytes!r})")
    for key, _ in options:
        if key in _MESSAGE_LIMIT_KEYS:
            raise ValueError(f"options sets {key!r}: give the message limit as "
                             f"max_message_bytes instead")
    return (*((key, max_message_bytes) for key in _MESSAGE_LIMIT_KEYS), *options)


DEFAULT_OPTIONS: tuple[tuple[str, Any], ...] = channel_options()

# A per-call wrapper around a method's behaviour: entered before it runs, exited after
# it returned or failed (for streams: after the last message).
_Around = Callable[[grpc.aio.ServicerContext[Any, Any]], AbstractAsyncContextManager[None]]


# =========================================================================== server


@dataclass(frozen=True)
class RpcServer:
    """A started server: the ``grpc.aio`` server, its bound port and its health servicer."""

    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    service_names: tuple[str, ...]

    async def stop(self, grace: float | None = 5.0) -> None:
        """Report NOT_SERVING, then stop, letting calls in flight finish for ``grace`` s."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)

    async def wait_for_termination(self) -> None:
        """Return when the server has stopped."""
        await self.server.wait_for_termination()


async def start_server(
    address: str,
    servicers: Mapping[str, object],
    *,
    token: str | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    credentials: grpc.ServerCredentials | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    options: Sequence[tuple[str, Any]] = (),
) -> RpcServer:
    """Build, bind and start a server for ``servicers`` on ``address``.

    Args:
        address: "host:port"; port 0 picks a free port (see ``RpcServer.port``).
        servicers: full service name ("couler.v1.SubmitterService") to the object
            implementing it; several services may share one server.
        token: require ``authorization: Bearer <token>`` on every call except
            health checks; ``None`` or "" requires nothing.
        tracer_provider: where server spans go (default: the global provider).
        meter_provider: where the calls' latency histogram goes (none is recorded
            when None).
        credentials: TLS credentials; ``None`` listens in plain text.
        max_message_bytes: the largest request accepted and response sent, in bytes
            (default 64 MiB); a larger request is RESOURCE_EXHAUSTED, undecoded.
        options: further gRPC server options (not the message limits).

    Raises:
        KeyError: a service name no ``couler.v1`` proto declares.
        ValueError: ``max_message_bytes`` is out of range, or ``options`` sets a
            message limit.
    """
    server_options = channel_options(max_message_bytes, options)
    interceptors: list[grpc.aio.ServerInterceptor] = [TracingInterceptor(tracer_provider)]
    if meter_provider is not None:
        interceptors.append(MetricsInterceptor(meter_provider, servicers))
    if token:
        interceptors.append(TokenInterceptor(token))
    interceptors.append(ErrorInterceptor())
    server = grpc.aio.server(interceptors=interceptors, options=list(server_options))
    names = tuple(servicers)
    for name, servicer in servicers.items():
        server.add_generic_rpc_handlers((generic_handler(name, servicer),))

    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (*names, health.SERVICE_NAME, reflection.SERVICE_NAME), server
    )
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    await server.start()
    for name in ("", *names):  # "" is the whole server, as probes ask by default
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    _log.info("gRPC server on port %d serving %s", port, ", ".join(names))
    return RpcServer(server, port, health_servicer, names)


def generic_handler(service_name: str, servicer: object) -> grpc.GenericRpcHandler:
    """The method table for ``servicer``, built from the service's proto descriptor.

    A method the servicer lacks answers UNIMPLEMENTED. Requests reach grpc undecoded
    (no ``request_deserializer``) and are decoded inside the behaviour, so a body that
    does not parse is a :class:`couler.errors.UserError` (INVALID_ARGUMENT, through
    :class:`ErrorInterceptor`) naming the method and the message type. A client-streaming
    behaviour must read its requests from the iterator it is given: ``context.read()``
    would return raw bytes.
    """
    service = descriptor_pool.Default().FindServiceByName(service_name)
    factories: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler[Any, Any]]] = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in service.methods:
        request = message_factory.GetMessageClass(method.input_type)
        response = message_factory.GetMessageClass(method.output_type)
        behaviour = getattr(servicer, method.name, None) or _unimplemented(method.full_name)
        factory = factories[(method.client_streaming, method.server_streaming)]
        handlers[method.name] = factory(
            _decoding(behaviour, _Decoder(method.full_name, request),
                      client_streaming=method.client_streaming,
                      server_streaming=method.server_streaming),
            request_deserializer=None,
            response_serializer=response.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


@dataclass(frozen=True)
class _Decoder:
    """Decodes one method's request bodies; a body that does not parse is a UserError."""

    method: str  # full name, "couler.v1.CacheService.Lookup"
    message: type[Message]

    def __call__(self, raw: bytes) -> Message:
        try:
            return self.message.FromString(raw)
        except DecodeError as exc:
            raise UserError(
                f"{self.method}: the request body ({len(raw)} bytes) is not a valid "
                f"{self.message.DESCRIPTOR.full_name} message") from exc

    async def each(self, raws: AsyncIterator[bytes]) -> AsyncIterator[Message]:
        """Decode a request stream as the behaviour reads it."""
        async for raw in raws:
            yield self(raw)


def _decoding(behaviour: Callable[..., Any], decode: _Decoder, *, client_streaming: bool,
              server_streaming: bool) -> Callable[..., Any]:
    """``behaviour`` taking raw request bytes, decoded by ``decode`` as it starts."""

    def call(raw: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        request = decode.each(raw) if client_streaming else decode(raw)
        return behaviour(request, context)

    if server_streaming:
        async def streaming(raw: Any, context: grpc.aio.ServicerContext[Any, Any]
                            ) -> AsyncIterator[Any]:
            async for item in _stream(call(raw, context)):
                yield item

        return streaming

    async def unary(raw: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        return await _resolve(call(raw, context))

    return unary


def _unimplemented(name: str) -> Callable[..., Any]:
    def behaviour(request: object, context: object) -> None:
        raise NotImplementedError(f"{name} is not implemented by this server")

    return behaviour


# =========================================================================== interceptors


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """Reports :mod:`couler.errors` as gRPC statuses; anything else as INTERNAL (logged)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method

        @asynccontextmanager
        async def around(context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[None]:
            try:
                yield
            except grpc.aio.AbortError:
                raise  # the servicer set the status itself
            except NotImplementedError as exc:
                _fail(context, grpc.StatusCode.UNIMPLEMENTED, str(exc) or method, ())
            except Exception as exc:
                code, message, trailers = status_for(exc)
                if code is grpc.StatusCode.INTERNAL:
                    _log.exception("%s failed", method)
                else:
                    _log.info("%s: %s: %s", method, code.name, message)
                _fail(context, code, message, trailers)

        return wrap_handler(handler, around)


def _fail(context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, message: str,
          trailers: Sequence[tuple[str, str | bytes]]) -> None:
    # Setting the status and returning (rather than context.abort(), which sends it
    # at once and raises) lets the outer interceptors finish first: the server span
    # is complete, with its status, before the client sees the error.
    context.set_code(code)
    context.set_details(message)
    if trailers:
        context.set_trailing_metadata(tuple(trailers))


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Rejects calls without ``authorization: Bearer <token>`` (UNAUTHENTICATED).

    The check needs only the call's metadata; a refused call's request is never read
    (see :func:`_refusal`). Health checks pass without it (see the module docstring).
    """

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("TokenInterceptor needs a non-empty token")
        self._expected = f"Bearer {token}".encode()

    def authorized(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> bool:
        """Whether ``metadata`` carries the token (compared in constant time)."""
        for key, value in metadata or ():
            if key == "authorization":
                got = value.encode() if isinstance(value, str) else value
                return hmac.compare_digest(got, self._expected)
        return False

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if (
            handler_call_details.method.startswith(_HEALTH_PREFIX)
            or self.authorized(handler_call_details.invocation_metadata)
        ):
            return handler
        # A method that does not exist is refused the same way: without the token,
        # nobody learns which methods exist.
        return _refusal(handler)


def _refusal(handler: grpc.RpcMethodHandler[Any, Any] | None
             ) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler answering UNAUTHENTICATED without reading, let alone decoding, the request.

    Its request side is streaming whatever ``handler``'s is: grpc reads a unary request
    in full (up to the message limit) and hands it over before the behaviour runs, a
    streaming one only when the behaviour asks; this one never asks. A unary client
    cannot tell: the wire format is the same, and it gets the status. The response side
    keeps ``handler``'s shape (unary for a method that does not exist: ``None``).
    """

    async def refuse(requests: object, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_MESSAGE)

    if handler is not None and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(
            refuse, request_deserializer=None, response_serializer=handler.response_serializer)
    return grpc.stream_unary_rpc_method_handler(
        refuse, request_deserializer=None,
        response_serializer=handler.response_serializer if handler is not None else None)


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """Records each call's duration (seconds, until its last message for a stream) with
    its method (``rpc.method``: ``/couler.v1.CacheService/Lookup``) and status code name
    (``rpc.grpc.status_code``: ``OK``, ``NOT_FOUND``, ...).

    A method the server does not serve is recorded as ``other``: callers choose the
    names, and each would be a series of its own.
    """

    def __init__(self, meter_provider: metrics.MeterProvider,
                 servicers: Mapping[str, object]) -> None:
        meter = meter_provider.get_meter("couler.rpc")
        self._duration = meter.create_histogram(
            "couler.rpc.server.duration", unit="s",
            description="gRPC calls served: duration by method and status code",
            explicit_bucket_boundaries_advisory=DURATION_BUCKETS)
        self._known: set[str] = set()
        for name in servicers:
            service = descriptor_pool.Default().FindServiceByName(name)
            self._known.update(f"/{name}/{m.name}" for m in service.methods)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(_HEALTH_PREFIX):
            return handler
        label = method if method in self._known else "other"
        duration = self._duration

        @asynccontextmanager
        async def around(context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[None]:
            start = time.perf_counter()
            status = "UNKNOWN"
            try:
                yield
                status = _code_name(context.code())
            except grpc.aio.AbortError:
                status = _code_name(context.code())
                raise
            except asyncio.CancelledError:
                status = "CANCELLED"
                raise
            finally:
                duration.record(time.perf_counter() - start,
                                {"rpc.method": label, "rpc.grpc.status_code": status})

        return wrap_handler(handler, around)


def _code_name(code: object) -> str:
    """The status code's name (OK when the servicer set none)."""
    number = _code_number(code)
    for status in grpc.StatusCode:
        if status.value[0] == number:
            return status.name
    return str(number)


class TracingInterceptor(grpc.aio.ServerInterceptor):
    """A SERVER span per call, continuing the trace in the caller's ``traceparent``."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer(__name__, tracer_provider=tracer_provider)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(_HEALTH_PREFIX):
            return handler
        parent = telemetry.extract(
            telemetry.headers_from_metadata(handler_call_details.invocation_metadata)
        )
        service, _, name = method.lstrip("/").partition("/")
        tracer = self._tracer

        @asynccontextmanager
        async def around(context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[None]:
            with tracer.start_as_current_span(
                method.lstrip("/"),
                context=parent,
                kind=SpanKind.SERVER,
                attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": name},
                record_exception=False,
                set_status_on_exception=False,
            ) as span:
                try:
                    yield
                except grpc.aio.AbortError:  # the servicer called context.abort()
                    _record_status(span, context)
                    raise
                except Exception as exc:
                    span.record_exception(exc)
                    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                    raise
                else:
                    _record_status(span, context)

        return wrap_handler(handler, around)


def _record_status(span: trace.Span, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    code = context.code()
    number = _code_number(code)
    span.set_attribute("rpc.grpc.status_code", number)
    if number != 0:
        span.set_status(Status(StatusCode.ERROR, context.details() or ""))


def _code_number(code: object) -> int:
    """The numeric status code (the aio context may report an enum, an int or None)."""
    if isinstance(code, grpc.StatusCode):
        number: int = code.value[0]
        return number
    return code if isinstance(code, int) else 0


# =========================================================================== wrapping


def wrap_handler(
    handler: grpc.RpcMethodHandler[Any, Any], around: _Around
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same shape whose behaviour runs inside ``around(context)``.

    Behaviours may be coroutine functions, async generators, plain functions or
    generators (the servicers of grpc's own health and reflection services mix them).
    """
    kw: dict[str, Any] = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        inner_uu: Callable[..., Any] = handler.unary_unary

        async def unary_unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            async with around(context):
                return await _resolve(inner_uu(request, context))

        return grpc.unary_unary_rpc_method_handler(unary_unary, **kw)
    if handler.unary_stream is not None:
        inner_us: Callable[..., Any] = handler.unary_stream

        async def unary_stream(
            request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[Any]:
            async with around(context):
                async for item in _stream(inner_us(request, context)):
                    yield item

        return grpc.unary_stream_rpc_method_handler(unary_stream, **kw)
    if handler.stream_unary is not None:
        inner_su: Callable[..., Any] = handler.stream_unary

        async def stream_unary(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            async with around(context):
                return await _resolve(inner_su(requests, context))

        return grpc.stream_unary_rpc_method_handler(stream_unary, **kw)
    inner_ss: Callable[..., Any] | None = handler.stream_stream
    if inner_ss is None:
        raise ValueError("RPC method handler has no behaviour")
    inner = inner_ss

    async def stream_stream(
        requests: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        async with around(context):
            async for item in _stream(inner(requests, context)):
                yield item

    return grpc.stream_stream_rpc_method_handler(stream_stream, **kw)


async def _resolve(result: Any) -> Any:
    return await result if inspect.isawaitable(result) else result


async def _stream(result: Any) -> AsyncIterator[Any]:
    """Responses of a streaming behaviour, whichever way it produces them."""
    if hasattr(result, "__aiter__"):
        async for item in result:
            yield item
    elif inspect.isawaitable(result):  # a coroutine that writes with context.write()
        await result
    elif result is not None:
        for item in result:
            yield item
