"""Real in-process gRPC servers on 127.0.0.1:0: health, reflection, tokens, errors, traces.

The servers run on an asyncio loop in a background thread (as the services run
them); the tests call them with the blocking client, as the CLI does, and with the
asyncio channel, as the services calling each other do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from couler import errors
from couler.v1 import (
    cache_service_pb2,
    cache_service_pb2_grpc,
    common_pb2,
    submitter_service_pb2,
    submitter_service_pb2_grpc,
)
from couler_runtime import telemetry
from couler_runtime.client import CoulerClient
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
from couler_runtime.rpc.errors import INTERNAL_MESSAGE
from couler_runtime.rpc.records import RunState
from tests.integration.loop_thread import LoopThread

TOKEN = "test-token-7f3a"


def address(server: RpcServer) -> str:
    return f"127.0.0.1:{server.port}"


# =========================================================================== test servicers

FAILURES: dict[str, BaseException] = {
    "invalid": errors.ValidationError(
        [errors.Issue("train", "fit", "dependencies", "dependency cycle: fit -> fit")]),
    "missing": errors.NotFoundError("cache entry 'missing' not found"),
    "conflict": errors.ConflictError("entry 'conflict' is being written"),
    "unsupported": errors.UnsupportedFeatureError("tekton", "train", "loop", "bounded loop"),
    "retryable": errors.RetryableError("index database unreachable"),
    "timeout": errors.OperationTimeoutError("index query timed out after 5s"),
    "bug": ZeroDivisionError("secret internals 0xdeadbeef"),
}


class FakeFailingCache:
    """Lookup raises the exception named by the first key; Stats answers."""

    async def Lookup(self, request: cache_service_pb2.LookupRequest,
                     context: object) -> cache_service_pb2.LookupResponse:
        raise FAILURES[request.keys[0]]

    async def Stats(self, request: object, context: object) -> cache_service_pb2.StatsResponse:
        return cache_service_pb2.StatsResponse(entries=2, bytes=300, budget_bytes=1000)


class FakePartialCache(cache_service_pb2_grpc.CacheServiceServicer):
    """Subclasses the generated base and implements only Stats."""

    async def Stats(self, request: object, context: object) -> cache_service_pb2.StatsResponse:
        return cache_service_pb2.StatsResponse(entries=1)


class FakeRuns:
    """Get and a three-state Watch for run "r-1"."""

    STATES = (common_pb2.RUN_STATE_PENDING, common_pb2.RUN_STATE_RUNNING,
              common_pb2.RUN_STATE_SUCCEEDED)

    async def Get(self, request: submitter_service_pb2.GetRunRequest,
                  context: object) -> common_pb2.Run:
        if request.run_id != "r-1":
            raise errors.NotFoundError(f"run {request.run_id!r} not found")
        return common_pb2.Run(run_id="r-1", workflow="train", state=self.STATES[-1])

    async def Watch(self, request: submitter_service_pb2.WatchRunRequest,
                    context: object) -> AsyncIterator[submitter_service_pb2.WatchRunResponse]:
        if request.run_id != "r-1":
            raise errors.NotFoundError(f"run {request.run_id!r} not found")
        for revision, state in enumerate(self.STATES, 1):
            await asyncio.sleep(0)
            yield submitter_service_pb2.WatchRunResponse(run=common_pb2.Run(
                run_id="r-1", workflow="train", state=state, revision=revision))


# =========================================================================== health, reflection


def test_health_is_serving_for_each_service_and_the_server(
        serve: Callable[..., RpcServer]) -> None:
    server = serve({CACHE: FakeFailingCache(), SUBMITTER: FakeRuns()})
    with connect(address(server)) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for name in ("", CACHE, SUBMITTER):
            resp = health.Check(health_pb2.HealthCheckRequest(service=name), timeout=10)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING, name
        with pytest.raises(grpc.RpcError) as info:
            health.Check(health_pb2.HealthCheckRequest(service=SERVICES["monitor"]), timeout=10)
        assert info.value.code() is grpc.StatusCode.NOT_FOUND


def list_services(channel: grpc.Channel, metadata: Any = None) -> set[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
        metadata=metadata, timeout=10)
    (resp,) = list(responses)
    return {s.name for s in resp.list_services_response.service}


def test_reflection_lists_the_services_and_serves_their_descriptors(
        serve: Callable[..., RpcServer]) -> None:
    server = serve({CACHE: FakeFailingCache(), SUBMITTER: FakeRuns()})
    with connect(address(server)) as channel:
        assert list_services(channel) == {
            CACHE, SUBMITTER, "grpc.health.v1.Health",
            "grpc.reflection.v1alpha.ServerReflection"}
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        (resp,) = list(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(
            file_containing_symbol=SUBMITTER)]), timeout=10))
        files = resp.file_descriptor_response.file_descriptor_proto
        assert files  # the submitter proto and what it imports (common, workflow)


def test_health_after_stop_is_gone(loop: LoopThread) -> None:
    server = loop.run(start_server("127.0.0.1:0", {CACHE: FakeFailingCache()}))
    loop.run(server.stop(None))
    with connect(address(server)) as channel, pytest.raises(grpc.RpcError) as info:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert info.value.code() is grpc.StatusCode.UNAVAILABLE


def test_unknown_service_name_is_refused(loop: LoopThread) -> None:
    with pytest.raises(KeyError):
        loop.run(start_server("127.0.0.1:0", {"couler.v1.NoSuchService": object()}))


# =========================================================================== errors


def raw_lookup(channel: grpc.Channel) -> Any:
    return channel.unary_unary(
        f"/{CACHE}/Lookup",
        request_serializer=cache_service_pb2.LookupRequest.SerializeToString,
        response_deserializer=cache_service_pb2.LookupResponse.FromString)


@pytest.mark.parametrize(("key", "code"), [
    ("invalid", grpc.StatusCode.INVALID_ARGUMENT),
    ("missing", grpc.StatusCode.NOT_FOUND),
    ("conflict", grpc.StatusCode.ALREADY_EXISTS),
    ("unsupported", grpc.StatusCode.FAILED_PRECONDITION),
    ("retryable", grpc.StatusCode.UNAVAILABLE),
    ("timeout", grpc.StatusCode.DEADLINE_EXCEEDED),
    ("bug", grpc.StatusCode.INTERNAL),
])
def test_server_maps_errors_to_status_codes(serve: Callable[..., RpcServer], key: str,
                                            code: grpc.StatusCode) -> None:
    server = serve({CACHE: FakeFailingCache()})
    with connect(address(server)) as channel, pytest.raises(grpc.RpcError) as info:
        raw_lookup(channel)(cache_service_pb2.LookupRequest(keys=[key]), timeout=10)
    assert info.value.code() is code
    expected = INTERNAL_MESSAGE if key == "bug" else str(FAILURES[key])
    assert info.value.details() == expected


def test_validation_status_names_workflow_step_field(serve: Callable[..., RpcServer]) -> None:
    server = serve({CACHE: FakeFailingCache()})
    with connect(address(server)) as channel, pytest.raises(grpc.RpcError) as info:
        raw_lookup(channel)(cache_service_pb2.LookupRequest(keys=["invalid"]), timeout=10)
    assert "workflow 'train', step 'fit', field 'dependencies'" in info.value.details()
    keys = [k for k, _ in info.value.trailing_metadata()]
    assert "couler-error-bin" in keys


@pytest.mark.parametrize("key", [k for k in FAILURES if k != "bug"])
def test_client_raises_the_servers_exception(serve: Callable[..., RpcServer], key: str) -> None:
    server = serve({CACHE: FakeFailingCache()})
    with CoulerClient(address(server)) as client, pytest.raises(errors.CoulerError) as info:
        client.cache.lookup([key])
    sent = FAILURES[key]
    assert type(info.value) is type(sent)
    assert str(info.value) == str(sent)
    assert isinstance(info.value.__cause__, grpc.RpcError)
    if isinstance(sent, errors.ValidationError):
        assert isinstance(info.value, errors.ValidationError)
        assert info.value.issues == sent.issues


def test_unexpected_exception_is_internal_generic_and_logged(
        serve: Callable[..., RpcServer], caplog: pytest.LogCaptureFixture) -> None:
    server = serve({CACHE: FakeFailingCache()})
    with caplog.at_level(logging.ERROR, logger="couler_runtime.rpc.server"), \
            CoulerClient(address(server)) as client, \
            pytest.raises(errors.CoulerError) as info:
        client.cache.lookup(["bug"])
    assert type(info.value) is errors.CoulerError
    assert str(info.value) == INTERNAL_MESSAGE
    assert "0xdeadbeef" not in str(info.value)
    logged = [r for r in caplog.records if r.exc_info and r.exc_info[0] is ZeroDivisionError]
    assert logged and f"/{CACHE}/Lookup" in logged[0].getMessage()


def test_generated_servicer_base_and_missing_methods_are_unimplemented(
        serve: Callable[..., RpcServer]) -> None:
    server = serve({CACHE: FakePartialCache(), SUBMITTER: object()})
    with CoulerClient(address(server)) as client:
        assert client.cache.stats().entries == 1
        with pytest.raises(errors.UserError) as info:
            client.cache.evict(["k"])
        assert info.value.__cause__.code() is grpc.StatusCode.UNIMPLEMENTED
        with pytest.raises(errors.UserError, match=r"SubmitterService\.Get is not implemented"):
            client.submitter.get("r-1")


def test_generated_stub_talks_to_a_descriptor_registered_servicer(
        serve: Callable[..., RpcServer]) -> None:
    server = serve({SUBMITTER: FakeRuns()})
    with connect(address(server)) as channel:
        stub = submitter_service_pb2_grpc.SubmitterServiceStub(channel)
        run = stub.Get(submitter_service_pb2.GetRunRequest(run_id="r-1"), timeout=10)
        assert (run.run_id, run.state) == ("r-1", common_pb2.RUN_STATE_SUCCEEDED)


# =========================================================================== token


def test_token_required_when_configured(serve: Callable[..., RpcServer]) -> None:
    server = serve({CACHE: FakeFailingCache()}, token=TOKEN)
    for token in (None, "wrong"):
        with CoulerClient(address(server), token=token) as client, \
                pytest.raises(errors.UserError, match="bearer token") as info:
            client.cache.stats()
        assert info.value.__cause__.code() is grpc.StatusCode.UNAUTHENTICATED
    with CoulerClient(address(server), token=TOKEN) as client:
        assert client.cache.stats().budget_bytes == 1000


def test_token_guards_streams_and_reflection_but_not_health(
        serve: Callable[..., RpcServer]) -> None:
    server = serve({SUBMITTER: FakeRuns()}, token=TOKEN)
    with connect(address(server)) as channel:
        resp = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=SUBMITTER), timeout=10)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as info:
            list_services(channel)
        assert info.value.code() is grpc.StatusCode.UNAUTHENTICATED
    with connect(address(server), token=TOKEN) as channel:
        assert SUBMITTER in list_services(channel)
    with CoulerClient(address(server)) as client, pytest.raises(errors.UserError) as info2:
        list(client.submitter.watch("r-1"))
    assert info2.value.__cause__.code() is grpc.StatusCode.UNAUTHENTICATED


# =========================================================================== tracing


def test_trace_id_survives_client_to_server(serve: Callable[..., RpcServer]) -> None:
    server_spans = InMemorySpanExporter()
    server_provider = telemetry.setup_tracing("couler-cache", exporter=server_spans,
                                              set_global=False)
    server = serve({CACHE: FakeFailingCache()}, tracer_provider=server_provider, token=TOKEN)
    client_provider = TracerProvider()
    with client_provider.get_tracer("cli").start_as_current_span("couler submit") as parent, \
            CoulerClient(address(server), token=TOKEN) as client:
        client.cache.stats()
        with pytest.raises(errors.NotFoundError):
            client.cache.lookup(["missing"])
    ctx = parent.get_span_context()
    spans = {s.name: s for s in server_spans.get_finished_spans()}
    assert set(spans) == {f"{CACHE}/Stats", f"{CACHE}/Lookup"}  # health checks not traced
    for span in spans.values():
        assert span.kind is SpanKind.SERVER
        assert span.context.trace_id == ctx.trace_id
        assert span.parent is not None and span.parent.span_id == ctx.span_id
        assert span.resource.attributes["service.name"] == "couler-cache"
    assert spans[f"{CACHE}/Stats"].attributes["rpc.grpc.status_code"] == 0
    assert spans[f"{CACHE}/Lookup"].attributes["rpc.grpc.status_code"] == \
        grpc.StatusCode.NOT_FOUND.value[0]
    assert not spans[f"{CACHE}/Lookup"].status.is_ok
    server_provider.shutdown()


def test_aio_channel_sends_token_and_trace_and_translates_errors(
        serve: Callable[..., RpcServer], loop: LoopThread) -> None:
    spans = InMemorySpanExporter()
    provider = telemetry.setup_tracing("couler-submitter", exporter=spans, set_global=False)
    server = serve({SUBMITTER: FakeRuns()}, tracer_provider=provider, token=TOKEN)

    async def call() -> tuple[int, list[int], str]:
        channel = aio_connect(address(server), token=TOKEN)
        get = channel.unary_unary(
            f"/{SUBMITTER}/Get",
            request_serializer=submitter_service_pb2.GetRunRequest.SerializeToString,
            response_deserializer=common_pb2.Run.FromString)
        watch = channel.unary_stream(
            f"/{SUBMITTER}/Watch",
            request_serializer=submitter_service_pb2.WatchRunRequest.SerializeToString,
            response_deserializer=submitter_service_pb2.WatchRunResponse.FromString)
        with TracerProvider().get_tracer("opt").start_as_current_span("optimize") as span:
            run = await get(submitter_service_pb2.GetRunRequest(run_id="r-1"))
            states = [r.run.state async for r in watch(
                submitter_service_pb2.WatchRunRequest(run_id="r-1"))]
            try:
                with translated_errors():
                    await get(submitter_service_pb2.GetRunRequest(run_id="nope"))
                message = ""
            except errors.NotFoundError as exc:
                message = str(exc)
        await channel.close()
        assert run.run_id == "r-1"
        return span.get_span_context().trace_id, states, message

    trace_id, states, message = loop.run(call())
    assert states == list(FakeRuns.STATES)
    assert message == "run 'nope' not found"
    finished = spans.get_finished_spans()
    assert len(finished) == 3
    assert {s.context.trace_id for s in finished} == {trace_id}
    provider.shutdown()


# =========================================================================== streaming


def test_watch_streams_every_change_until_terminal(serve: Callable[..., RpcServer]) -> None:
    server = serve({SUBMITTER: FakeRuns()})
    with CoulerClient(address(server)) as client:
        runs = list(client.submitter.watch("r-1"))
        assert [r.state for r in runs] == [RunState.PENDING, RunState.RUNNING,
                                           RunState.SUCCEEDED]
        assert [r.revision for r in runs] == [1, 2, 3]
        seen: list[RunState] = []
        final = client.submitter.wait("r-1", on_change=lambda r: seen.append(r.state))
        assert final.state is RunState.SUCCEEDED and final.state.terminal
        assert seen == [r.state for r in runs]
        with pytest.raises(errors.NotFoundError, match="run 'nope' not found"):
            list(client.submitter.watch("nope"))
        first = next(iter(client.submitter.watch("r-1")))  # abandoning the stream is fine
        assert first.state is RunState.PENDING
        assert client.submitter.get("r-1").workflow == "train"
