"""Channels to Couler's gRPC services, and errors translated back to :mod:`couler.errors`.

:func:`connect` (blocking) and :func:`aio_connect` (asyncio, for the services calling
each other) open a channel whose every call carries the bearer token, when one is
given, and the current trace context as ``traceparent``, so the server's span joins
the caller's trace. :func:`translated_errors` turns a failed call into the
:mod:`couler.errors` exception the server raised (``raise ... from`` the RpcError)::

    with translated_errors():
        plan = await stub.Optimize(request)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import grpc

from couler_runtime import telemetry
from couler_runtime.rpc.errors import error_from_rpc
from couler_runtime.rpc.server import MAX_MESSAGE_BYTES, channel_options

__all__ = ["aio_connect", "call_metadata", "connect", "translated_errors"]


def call_metadata(
    token: str | None, metadata: Sequence[tuple[str, str | bytes]] | None = None
) -> list[tuple[str, str | bytes]]:
    """``metadata`` plus the bearer token and the current ``traceparent``."""
    out = [(k, v) for k, v in (metadata or ()) if k not in ("authorization", "traceparent")]
    if token:
        out.append(("authorization", f"Bearer {token}"))
    out.extend(telemetry.inject({}).items())
    return out


@contextmanager
def translated_errors() -> Iterator[None]:
    """Re-raise a ``grpc.RpcError`` as the matching :mod:`couler.errors` exception."""
    try:
        yield
    except grpc.RpcError as err:
        raise error_from_rpc(err) from err


# =========================================================================== blocking


class _Details(NamedTuple):
    method: str
    timeout: float | None
    metadata: Any
    credentials: grpc.CallCredentials | None
    wait_for_ready: bool | None
    compression: grpc.Compression | None


class _CallDetails(_Details, grpc.ClientCallDetails):
    """Client call details with our metadata (grpc wants this namedtuple shape)."""


class _MetadataInterceptor(grpc.UnaryUnaryClientInterceptor,
                           grpc.UnaryStreamClientInterceptor,
                           grpc.StreamUnaryClientInterceptor,
                           grpc.StreamStreamClientInterceptor):
    def __init__(self, token: str | None) -> None:
        self._token = token

    def _details(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        return _CallDetails(
            details.method,
            details.timeout,
            call_metadata(self._token, details.metadata),
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(
        self, continuation: Callable[[grpc.ClientCallDetails, Any], Any],
        client_call_details: grpc.ClientCallDetails, request: Any,
    ) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_unary_stream(
        self, continuation: Callable[[grpc.ClientCallDetails, Any], Any],
        client_call_details: grpc.ClientCallDetails, request: Any,
    ) -> Any:
        return continuation(self._details(client_call_details), request)

    def intercept_stream_unary(
        self, continuation: Callable[[grpc.ClientCallDetails, Any], Any],
        client_call_details: grpc.ClientCallDetails, request_iterator: Any,
    ) -> Any:
        return continuation(self._details(client_call_details), request_iterator)

    def intercept_stream_stream(
        self, continuation: Callable[[grpc.ClientCallDetails, Any], Any],
        client_call_details: grpc.ClientCallDetails, request_iterator: Any,
    ) -> Any:
        return continuation(self._details(client_call_details), request_iterator)


def connect(
    address: str,
    *,
    token: str | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """A blocking channel to ``address`` ("host:port") adding token and ``traceparent``.

    Args:
        address: "host:port" of the server.
        token: sent as ``authorization: Bearer <token>`` on every call, when given.
        credentials: TLS; ``None`` is plain text (the embedded stack, tests).
        max_message_bytes: the largest message sent or received, in bytes (default
            64 MiB, as the server's).
        options: further gRPC channel options (not the message limits).

    Raises:
        ValueError: ``max_message_bytes`` is out of range, or ``options`` sets a
            message limit.
    """
    all_options = list(channel_options(max_message_bytes, options))
    if credentials is None:
        channel = grpc.insecure_channel(address, options=all_options)
    else:
        channel = grpc.secure_channel(address, credentials, options=all_options)
    return grpc.intercept_channel(channel, _MetadataInterceptor(token))


# =========================================================================== asyncio


class _AioMetadata:
    """Adds the token and ``traceparent`` to an asyncio call's details."""

    def __init__(self, token: str | None) -> None:
        self._token = token

    def _details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*call_metadata(self._token, list(details.metadata or ())))
        return grpc.aio.ClientCallDetails(
            details.method, details.timeout, metadata, details.credentials,
            details.wait_for_ready,
        )


# grpc.aio files an interceptor under the first of the four kinds it is an instance
# of, so each kind needs an object of its own.


class _AioUnaryUnary(_AioMetadata, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(
        self, continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
        client_call_details: grpc.aio.ClientCallDetails, request: Any,
    ) -> Any:
        return await continuation(self._details(client_call_details), request)


class _AioUnaryStream(_AioMetadata, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(
        self, continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
        client_call_details: grpc.aio.ClientCallDetails, request: Any,
    ) -> AsyncIterator[Any] | Any:
        return await continuation(self._details(client_call_details), request)


class _AioStreamUnary(_AioMetadata, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(
        self, continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
        client_call_details: grpc.aio.ClientCallDetails, request_iterator: Any,
    ) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


class _AioStreamStream(_AioMetadata, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(
        self, continuation: Callable[[grpc.aio.ClientCallDetails, Any], Awaitable[Any]],
        client_call_details: grpc.aio.ClientCallDetails, request_iterator: Any,
    ) -> AsyncIterator[Any] | Any:
        return await continuation(self._details(client_call_details), request_iterator)


def aio_connect(
    address: str,
    *,
    token: str | None = None,
    credentials: grpc.ChannelCredentials | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """An asyncio channel to ``address`` adding token and ``traceparent`` to every call.

    Create it inside the event loop that will use it. The arguments are
    :func:`connect`'s.

    Raises:
        ValueError: ``max_message_bytes`` is out of range, or ``options`` sets a
            message limit.
    """
    all_options = list(channel_options(max_message_bytes, options))
    interceptors: list[grpc.aio.ClientInterceptor] = [
        _AioUnaryUnary(token), _AioUnaryStream(token), _AioStreamUnary(token),
        _AioStreamStream(token),
    ]
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=all_options,
                                         interceptors=interceptors)
    return grpc.aio.secure_channel(address, credentials, options=all_options,
                                   interceptors=interceptors)
