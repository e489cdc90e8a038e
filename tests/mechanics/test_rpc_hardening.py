"""Hostile request bodies against real gRPC servers on 127.0.0.1:0.

The token is checked before a body is read or decoded; a body that does not parse is
INVALID_ARGUMENT naming the method; a body over the message limit is refused by grpc
core before it is buffered. Memory is measured on a server in a child process (its
peak RSS, reset just before the call), so the client's own copy of the body does not
count.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import DecodeError
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from couler import errors
from couler.v1 import cache_service_pb2, common_pb2, submitter_service_pb2
from couler_runtime import telemetry
from couler_runtime.rpc import (
    CACHE,
    SERVICES,
    SUBMITTER,
    RpcServer,
    aio_connect,
    connect,
    start_server,
    translated_errors,
)
from couler_runtime.rpc.server import (
    UNAUTHENTICATED_MESSAGE,
    ErrorInterceptor,
    TokenInterceptor,
)
from tests.integration.loop_thread import LoopThread
from tests.mechanics.test_rpc import address

TOKEN = "hardening-token-91c2"
MI = 1024 * 1024
TIMEOUT = 60.0

# Bodies no couler.v1 request type parses (each test below checks its method's).
GARBAGE: dict[str, bytes] = {
    "random": random.Random(20261201).randbytes(256),
    # A LookupRequest cut inside its first key: a length prefix longer than the rest.
    "truncated": cache_service_pb2.LookupRequest(keys=["k" * 100]).SerializeToString()[:60],
}

# Every method of every service: (service, method name, request type, server-streaming).
METHODS = [
    (service, m.name, m.input_type.full_name, m.server_streaming)
    for service in SERVICES.values()
    for m in descriptor_pool.Default().FindServiceByName(service).methods
    if not m.client_streaming  # a request stream is decoded as the servicer reads it: below
]
CLIENT_STREAMING = [
    (service, m.name, m.input_type.full_name)
    for service in SERVICES.values()
    for m in descriptor_pool.Default().FindServiceByName(service).methods
    if m.client_streaming
]


def raw_call(channel: grpc.Channel, service: str, method: str, streaming: bool,
             body: bytes, token: str | None) -> list[bytes]:
    """Send ``body`` as it is (no serializer) and return the raw responses."""
    metadata: tuple[tuple[str, str | bytes], ...] | None = (
        (("authorization", f"Bearer {token}"),) if token is not None else None)
    path = f"/{service}/{method}"
    if streaming:
        stream: Any = channel.unary_stream(path)
        return list(stream(body, metadata=metadata, timeout=TIMEOUT))
    unary: Any = channel.unary_unary(path)
    return [unary(body, metadata=metadata, timeout=TIMEOUT)]


def refused(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


class FakeRuns:
    """SubmitterService.Get and Watch for any run id."""

    async def Get(self, request: submitter_service_pb2.GetRunRequest,
                  context: object) -> common_pb2.Run:
        return common_pb2.Run(run_id=request.run_id, workflow="train")

    async def Watch(self, request: submitter_service_pb2.WatchRunRequest,
                    context: object) -> Any:
        yield common_pb2.Run(run_id=request.run_id, workflow="train")


# =========================================================================== no token


@pytest.mark.parametrize("body", list(GARBAGE.values()), ids=list(GARBAGE))
@pytest.mark.parametrize("token", [None, "wrong"])
@pytest.mark.parametrize(("method", "streaming"), [("Get", False), ("Watch", True)])
def test_garbage_without_a_valid_token_is_unauthenticated(
        serve: Callable[..., RpcServer], body: bytes, token: str | None, method: str,
        streaming: bool) -> None:
    server = serve({SUBMITTER: FakeRuns()}, token=TOKEN)
    with grpc.insecure_channel(address(server)) as channel:
        err = refused(lambda: raw_call(channel, SUBMITTER, method, streaming, body, token))
    assert err.code() is grpc.StatusCode.UNAUTHENTICATED
    assert err.details() == UNAUTHENTICATED_MESSAGE


def test_a_refused_call_never_runs_the_deserializer(loop: LoopThread) -> None:
    """Any handler, not only ours: the token interceptor drops its deserializer."""
    decoded: list[bytes] = []

    def deserialize(raw: bytes) -> bytes:
        decoded.append(raw)
        return raw

    async def echo(request: bytes, context: object) -> bytes:
        return b"echo:" + request

    async def repeat(request: bytes, context: object) -> Any:
        yield b"again:" + request

    async def start() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server(interceptors=[TokenInterceptor(TOKEN), ErrorInterceptor()])
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Echo", {
            "Echo": grpc.unary_unary_rpc_method_handler(echo, request_deserializer=deserialize),
            "Repeat": grpc.unary_stream_rpc_method_handler(
                repeat, request_deserializer=deserialize),
        }),))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = loop.run(start())
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            for method, streaming in (("Echo", False), ("Repeat", True)):
                for token in (None, "wrong"):
                    def call(method: str = method, streaming: bool = streaming,
                             token: str | None = token) -> object:
                        return raw_call(channel, "test.Echo", method, streaming,
                                        b"secret body", token)

                    assert refused(call).code() is grpc.StatusCode.UNAUTHENTICATED
            assert decoded == []
            assert raw_call(channel, "test.Echo", "Echo", False, b"hi", TOKEN) == [b"echo:hi"]
            assert raw_call(channel, "test.Echo", "Repeat", True, b"hi", TOKEN) == [
                b"again:hi"]
            assert decoded == [b"hi", b"hi"]
    finally:
        loop.run(server.stop(None))


# =========================================================================== bad bodies


@pytest.fixture(scope="module")
def every_service(loop: LoopThread) -> Iterator[tuple[RpcServer, InMemorySpanExporter]]:
    """All five services, none implementing anything, behind the token, traced."""
    spans = InMemorySpanExporter()
    provider = telemetry.setup_tracing("couler-hardening", exporter=spans, set_global=False)
    server = loop.run(start_server("127.0.0.1:0", dict.fromkeys(SERVICES.values(), object()),
                                   token=TOKEN, tracer_provider=provider))
    yield server, spans
    loop.run(server.stop(None))
    provider.shutdown()


@pytest.mark.parametrize("body", list(GARBAGE.values()), ids=list(GARBAGE))
@pytest.mark.parametrize(("service", "method", "request_type", "streaming"), METHODS,
                         ids=[f"{s.rsplit('.', 1)[1]}.{m}" for s, m, _, _ in METHODS])
def test_garbage_with_the_token_is_invalid_argument_naming_the_method(
        every_service: tuple[RpcServer, InMemorySpanExporter], service: str, method: str,
        request_type: str, streaming: bool, body: bytes) -> None:
    server, _ = every_service
    request_class = message_factory.GetMessageClass(
        descriptor_pool.Default().FindMessageTypeByName(request_type))
    with pytest.raises(DecodeError):  # the body really is garbage for this method
        request_class.FromString(body)
    with grpc.insecure_channel(address(server)) as channel:
        err = refused(lambda: raw_call(channel, service, method, streaming, body, TOKEN))
        assert err.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert err.details() == (f"{service}.{method}: the request body ({len(body)} bytes) "
                                 f"is not a valid {request_type} message")
        # The same call with a valid (empty) body reaches the servicer, which lacks it.
        valid = refused(lambda: raw_call(channel, service, method, streaming, b"", TOKEN))
        assert valid.code() is grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.parametrize(("service", "method", "request_type"), CLIENT_STREAMING)
def test_garbage_in_a_request_stream_is_invalid_argument_when_read(
        serve: Callable[..., RpcServer], service: str, method: str, request_type: str) -> None:
    assert CLIENT_STREAMING, "the contract has client-streaming methods (uploads)"

    class Reader:
        async def read_all(self, requests: Any, context: object) -> object:
            async for _ in requests:
                pass
            raise AssertionError("garbage was decoded")

    reader = Reader()
    setattr(Reader, method, Reader.read_all)
    server = serve({service: reader}, token=TOKEN)
    with grpc.insecure_channel(address(server)) as channel:
        call: Any = channel.stream_unary(f"/{service}/{method}")
        for body in GARBAGE.values():
            with pytest.raises(grpc.RpcError) as info:
                call(iter([body]), metadata=(("authorization", f"Bearer {TOKEN}"),),
                     timeout=TIMEOUT)
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details() == (f"{service}.{method}: the request body "
                                            f"({len(body)} bytes) is not a valid "
                                            f"{request_type} message")
        with pytest.raises(grpc.RpcError) as info:  # and no token: never read at all
            call(iter([GARBAGE["random"]]), timeout=TIMEOUT)
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED


def test_a_bad_body_is_a_user_error_for_couler_clients_and_traced(
        every_service: tuple[RpcServer, InMemorySpanExporter]) -> None:
    server, spans = every_service
    spans.clear()
    with connect(address(server), token=TOKEN) as channel, \
            pytest.raises(errors.UserError, match=r"not a valid couler\.v1\.LookupRequest "), \
            translated_errors():
        lookup(channel)(GARBAGE["random"], timeout=TIMEOUT)
    with grpc.insecure_channel(address(server)) as anonymous:
        refused(lambda: raw_call(anonymous, CACHE, "Lookup", False, GARBAGE["random"], None))
    # context.abort() sends the status before the span ends: give the server a moment.
    deadline = time.monotonic() + TIMEOUT
    while len(spans.get_finished_spans()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    codes = [(s.attributes or {}).get("rpc.grpc.status_code")
             for s in spans.get_finished_spans() if s.name == f"{CACHE}/Lookup"]
    assert codes == [grpc.StatusCode.INVALID_ARGUMENT.value[0],
                     grpc.StatusCode.UNAUTHENTICATED.value[0]]


# =========================================================================== message limits


def test_the_server_limits_requests_and_responses(serve: Callable[..., RpcServer]) -> None:
    class FakeBigRuns:
        async def Get(self, request: submitter_service_pb2.GetRunRequest,
                      context: object) -> common_pb2.Run:
            return common_pb2.Run(run_id="r", message="x" * int(request.run_id))

    server = serve({SUBMITTER: FakeBigRuns()}, max_message_bytes=4096)
    with connect(address(server)) as channel:
        get = channel.unary_unary(
            f"/{SUBMITTER}/Get",
            request_serializer=submitter_service_pb2.GetRunRequest.SerializeToString,
            response_deserializer=common_pb2.Run.FromString)
        assert len(get(submitter_service_pb2.GetRunRequest(run_id="3000"),
                       timeout=TIMEOUT).message) == 3000
        too_big_in = refused(lambda: get(submitter_service_pb2.GetRunRequest(
            run_id="x" * 5000), timeout=TIMEOUT))
        assert too_big_in.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        too_big_out = refused(lambda: get(submitter_service_pb2.GetRunRequest(run_id="5000"),
                                          timeout=TIMEOUT))
        assert too_big_out.code() is grpc.StatusCode.RESOURCE_EXHAUSTED


def test_the_clients_take_the_limit_too(serve: Callable[..., RpcServer],
                                        loop: LoopThread) -> None:
    server = serve({SUBMITTER: FakeRuns()})
    request = submitter_service_pb2.GetRunRequest(run_id="r" * 2048)
    with connect(address(server), max_message_bytes=1024) as channel:
        get = channel.unary_unary(
            f"/{SUBMITTER}/Get",
            request_serializer=submitter_service_pb2.GetRunRequest.SerializeToString,
            response_deserializer=common_pb2.Run.FromString)
        err = refused(lambda: get(request, timeout=TIMEOUT))
        assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED

    async def aio_get() -> grpc.StatusCode:
        channel = aio_connect(address(server), max_message_bytes=1024)
        try:
            await channel.unary_unary(
                f"/{SUBMITTER}/Get",
                request_serializer=submitter_service_pb2.GetRunRequest.SerializeToString,
                response_deserializer=common_pb2.Run.FromString)(request, timeout=TIMEOUT)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        finally:
            await channel.close()
        return grpc.StatusCode.OK

    assert loop.run(aio_get()) is grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.mark.parametrize("bad", [0, -1, 2**31, True, 1.5])
def test_a_bad_limit_is_refused(loop: LoopThread, bad: Any) -> None:
    with pytest.raises(ValueError, match="max_message_bytes must be an int"):
        loop.run(start_server("127.0.0.1:0", {CACHE: object()}, max_message_bytes=bad))
    with pytest.raises(ValueError, match="max_message_bytes must be an int"):
        connect("127.0.0.1:1", max_message_bytes=bad)


# =========================================================================== memory

_SERVER = """
import asyncio, sys
from couler.v1 import cache_service_pb2
from couler_runtime.rpc import CACHE, start_server

class Cache:
    async def Lookup(self, request, context):
        return cache_service_pb2.LookupResponse()

async def main():
    kw = {"max_message_bytes": int(sys.argv[2])} if len(sys.argv) > 2 else {}
    server = await start_server("127.0.0.1:0", {CACHE: Cache()}, token=sys.argv[1], **kw)
    print(server.port, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(None)

asyncio.run(main())
"""


class ChildServer:
    """A cache server in a child process, and its memory."""

    def __init__(self, proc: subprocess.Popen[str], port: int) -> None:
        self.proc, self.address = proc, f"127.0.0.1:{port}"
        self._status = Path(f"/proc/{proc.pid}/status")

    def _kib(self, field: str) -> int:
        line = next(x for x in self._status.read_text().splitlines() if x.startswith(field))
        return int(line.split()[1])

    def reset_peak(self) -> int:
        """Reset the peak RSS to the current RSS; the current RSS, in bytes."""
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")
        return self._kib("VmRSS:") * 1024

    def peak(self) -> int:
        """The peak RSS since :meth:`reset_peak`, in bytes."""
        return self._kib("VmHWM:") * 1024


@contextmanager
def child_server(*args: str) -> Iterator[ChildServer]:
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, TOKEN, *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        port = int(proc.stdout.readline())
        yield ChildServer(proc, port)
        proc.stdin.close()
        assert proc.wait(timeout=TIMEOUT) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def lookup(channel: grpc.Channel) -> Callable[..., Any]:
    return channel.unary_unary(
        f"/{CACHE}/Lookup",
        response_deserializer=cache_service_pb2.LookupResponse.FromString)


def test_an_oversized_message_is_refused_unread() -> None:
    body = b"\x0a" + b"\xff" * (100 * MI)  # 100 MiB, far over the server's 8 MiB
    with child_server(str(8 * MI)) as server, \
            connect(server.address, token=TOKEN, max_message_bytes=128 * MI) as channel:
        assert lookup(channel)(b"", timeout=TIMEOUT) == cache_service_pb2.LookupResponse()
        before = server.reset_peak()
        err = refused(lambda: lookup(channel)(body, timeout=TIMEOUT))
        assert err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in (err.details() or "")
        assert server.peak() - before < 32 * MI
        # Under the limit, the same server still answers.
        assert lookup(channel)(b"", timeout=TIMEOUT) == cache_service_pb2.LookupResponse()


def test_an_anonymous_body_under_the_limit_is_neither_buffered_nor_decoded() -> None:
    body = b"\x0a" + b"\xff" * (48 * MI)  # under the default 64 MiB limit; not protobuf
    with child_server() as server, connect(server.address) as channel:
        before = server.reset_peak()
        err = refused(lambda: lookup(channel)(body, timeout=TIMEOUT))
        assert err.code() is grpc.StatusCode.UNAUTHENTICATED
        assert err.details() == UNAUTHENTICATED_MESSAGE
        assert server.peak() - before < 16 * MI


@pytest.mark.parametrize("path", [("couler.v1.SubmitterService", "DropAllRuns"),
                                  ("couler.v1.NoSuchService", "Get"),
                                  ("couler.v1.CacheService", "lookup")])
def test_without_the_token_a_method_that_does_not_exist_is_unauthenticated_too(
        every_service: tuple[RpcServer, InMemorySpanExporter], path: tuple[str, str]) -> None:
    """Without the token nobody can probe which methods exist: an unknown method gets the
    same UNAUTHENTICATED as a known one; with the token it is UNIMPLEMENTED."""
    server, _ = every_service
    service, method = path
    with grpc.insecure_channel(address(server)) as channel:
        for token in (None, "wrong"):
            unknown = refused(lambda t=token: raw_call(channel, service, method, False, b"", t))
            known = refused(lambda t=token: raw_call(channel, "couler.v1.SubmitterService",
                                                     "Get", False, b"", t))
            assert unknown.code() is known.code() is grpc.StatusCode.UNAUTHENTICATED
            assert unknown.details() == known.details()
        found = refused(lambda: raw_call(channel, service, method, False, b"", TOKEN))
        assert found.code() is grpc.StatusCode.UNIMPLEMENTED
