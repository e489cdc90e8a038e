"""couler.errors ⇄ gRPC status: the table, both directions, messages kept."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from couler import errors
from couler.v1 import common_pb2
from couler_runtime.rpc.errors import (
    ERROR_DETAIL_KEY,
    INTERNAL_MESSAGE,
    error_from_status,
    status_for,
)
from couler_runtime.rpc.server import (
    DEFAULT_OPTIONS,
    MAX_MESSAGE_BYTES,
    TokenInterceptor,
    channel_options,
)

ISSUES = [
    errors.Issue("train", "fit", "dependencies", "dependency cycle: fit -> eval -> fit"),
    errors.Issue("train", "", "name", "not a DNS-1123 label"),
]

CASES = [
    (errors.ValidationError(ISSUES), grpc.StatusCode.INVALID_ARGUMENT),
    (errors.InvalidWorkflowError("workflow 'w', step 's': bad"), grpc.StatusCode.INVALID_ARGUMENT),
    (errors.UserError("workflow 'w': no such engine 'x'"), grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFoundError("run 'r-1' not found"), grpc.StatusCode.NOT_FOUND),
    (errors.ConflictError("template 't' exists"), grpc.StatusCode.ALREADY_EXISTS),
    (errors.UnsupportedFeatureError("tekton", "w", "loop", "bounded loop", "no dynamic loops"),
     grpc.StatusCode.FAILED_PRECONDITION),
    (errors.RetryableError("nats unreachable"), grpc.StatusCode.UNAVAILABLE),
    (errors.OperationTimeoutError("engine did not answer in 30s"),
     grpc.StatusCode.DEADLINE_EXCEEDED),
]


@pytest.mark.parametrize(("exc", "code"), CASES, ids=lambda v: type(v).__name__)
def test_status_and_back_keep_type_and_message(exc: errors.CoulerError,
                                               code: grpc.StatusCode) -> None:
    got_code, message, trailers = status_for(exc)
    assert got_code is code
    assert message == str(exc)
    back = error_from_status(got_code, message, trailers)
    assert type(back) is type(exc)
    assert str(back) == str(exc)


def test_validation_message_names_workflow_step_field_and_issues_travel() -> None:
    code, message, trailers = status_for(errors.ValidationError(ISSUES))
    assert "workflow 'train', step 'fit', field 'dependencies'" in message
    (key, raw), = trailers
    assert key == ERROR_DETAIL_KEY
    detail = common_pb2.ErrorDetail.FromString(raw)
    assert detail.kind == "ValidationError"
    assert [(i.step, i.field) for i in detail.issues] == [("fit", "dependencies"), ("", "name")]
    back = error_from_status(code, message, trailers)
    assert isinstance(back, errors.ValidationError)
    assert back.issues == tuple(ISSUES)


def test_unsupported_feature_fields_travel() -> None:
    exc = errors.UnsupportedFeatureError("tekton", "w", "loop", "bounded loop", "no loops")
    back = error_from_status(*status_for(exc))
    assert isinstance(back, errors.UnsupportedFeatureError)
    assert (back.engine, back.workflow, back.step, back.feature) == (
        "tekton", "w", "loop", "bounded loop")
    assert str(back) == str(exc)


def test_a_subclass_travels_as_its_nearest_known_class() -> None:
    class RunGone(errors.NotFoundError):
        pass

    back = error_from_status(*status_for(RunGone("run 'x' not found")))
    assert type(back) is errors.NotFoundError
    assert str(back) == "run 'x' not found"


@pytest.mark.parametrize("exc", [RuntimeError("db password is hunter2"), KeyError("k"),
                                 errors.CoulerError("bare")])
def test_anything_else_is_internal_with_a_generic_message(exc: BaseException) -> None:
    code, message, trailers = status_for(exc)
    assert code is grpc.StatusCode.INTERNAL
    assert message == INTERNAL_MESSAGE
    assert "hunter2" not in message
    assert trailers == ()


@pytest.mark.parametrize(("code", "cls"), [
    (grpc.StatusCode.INVALID_ARGUMENT, errors.UserError),
    (grpc.StatusCode.NOT_FOUND, errors.NotFoundError),
    (grpc.StatusCode.ALREADY_EXISTS, errors.ConflictError),
    (grpc.StatusCode.UNAUTHENTICATED, errors.UserError),
    (grpc.StatusCode.UNAVAILABLE, errors.RetryableError),
    (grpc.StatusCode.DEADLINE_EXCEEDED, errors.OperationTimeoutError),
    (grpc.StatusCode.INTERNAL, errors.CoulerError),
    (grpc.StatusCode.UNKNOWN, errors.CoulerError),
])
def test_without_detail_the_code_decides(code: grpc.StatusCode, cls: type[Exception]) -> None:
    back = error_from_status(code, "server says no", None)
    assert type(back) is cls
    assert str(back) == "server says no"


def test_retryable_and_user_errors_stay_apart() -> None:
    unavailable = error_from_status(grpc.StatusCode.UNAVAILABLE, "down")
    invalid = error_from_status(grpc.StatusCode.INVALID_ARGUMENT, "bad")
    assert isinstance(unavailable, errors.RetryableError)
    assert not isinstance(unavailable, errors.UserError)
    assert isinstance(invalid, errors.UserError)
    assert not isinstance(invalid, errors.RetryableError)


def test_a_message_over_the_size_limit_is_a_user_error_not_a_retry() -> None:
    """grpc answers RESOURCE_EXHAUSTED for a message over the limit: sending it again fails
    the same way, so it is not retryable; any other exhaustion still is."""
    too_large = error_from_status(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  "Received message larger than max (70000000 vs. 67108864)")
    assert type(too_large) is errors.UserError
    assert "70000000 vs. 67108864" in str(too_large)
    assert "COULER_GRPC_MAX_MESSAGE_BYTES" in str(too_large) and "UploadWorkflow" in str(too_large)
    busy = error_from_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many concurrent streams")
    assert type(busy) is errors.RetryableError


def test_token_check() -> None:
    check = TokenInterceptor("s3cret")
    assert check.authorized((("authorization", "Bearer s3cret"),))
    assert check.authorized((("x", "y"), ("authorization", b"Bearer s3cret")))
    assert not check.authorized((("authorization", "Bearer wrong"),))
    assert not check.authorized((("authorization", "s3cret"),))
    assert not check.authorized(())
    assert not check.authorized(None)
    with pytest.raises(ValueError):
        TokenInterceptor("")


class _Details(grpc.HandlerCallDetails):
    def __init__(self, method: str, metadata: tuple[tuple[str, str], ...]) -> None:
        self.method = method
        self.invocation_metadata = metadata


def _intercepted(handler: grpc.RpcMethodHandler[Any, Any], method: str,
                 metadata: tuple[tuple[str, str], ...]) -> grpc.RpcMethodHandler[Any, Any]:
    async def continuation(details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any]:
        return handler

    result: grpc.RpcMethodHandler[Any, Any] = asyncio.run(
        TokenInterceptor("s3cret").intercept_service(continuation, _Details(method, metadata)))
    return result


def _never(raw: bytes) -> bytes:
    raise AssertionError("the request was decoded")


@pytest.mark.parametrize("factory", [grpc.unary_unary_rpc_method_handler,
                                     grpc.unary_stream_rpc_method_handler])
def test_a_refused_call_gets_a_handler_that_neither_reads_nor_decodes(factory: Any) -> None:
    handler = factory(lambda request, context: None, request_deserializer=_never,
                      response_serializer=bytes)
    for metadata in ((), (("authorization", "Bearer wrong"),)):
        refusal = _intercepted(handler, "/couler.v1.CacheService/Lookup", metadata)
        assert refusal is not handler
        assert refusal.request_deserializer is None
        # A streaming request is read only when the behaviour asks; a unary one before.
        assert refusal.request_streaming
        assert refusal.response_streaming == handler.response_streaming
        assert refusal.response_serializer is bytes
    good = (("authorization", "Bearer s3cret"),)
    assert _intercepted(handler, "/couler.v1.CacheService/Lookup", good) is handler
    assert _intercepted(handler, "/grpc.health.v1.Health/Check", ()) is handler


def test_message_limits_are_one_parameter() -> None:
    assert MAX_MESSAGE_BYTES == 64 * 1024 * 1024
    assert dict(DEFAULT_OPTIONS) == {"grpc.max_receive_message_length": MAX_MESSAGE_BYTES,
                                     "grpc.max_send_message_length": MAX_MESSAGE_BYTES}
    assert channel_options(1024, (("grpc.keepalive_time_ms", 10_000),)) == (
        ("grpc.max_receive_message_length", 1024), ("grpc.max_send_message_length", 1024),
        ("grpc.keepalive_time_ms", 10_000))
    with pytest.raises(ValueError, match=r"'grpc\.max_send_message_length'.*max_message_bytes"):
        channel_options(1024, (("grpc.max_send_message_length", 1),))
    for bad in (0, -5, 2**31, True, "64"):
        with pytest.raises(ValueError, match=rf"max_message_bytes .* \(got {bad!r}\)"):
            channel_options(bad)  # type: ignore[arg-type]
